// RelaxedCaptureMode (driver/capture_mode.h).

#include "driver/capture_mode.h"

namespace kpack::internal {

RelaxedCaptureMode::RelaxedCaptureMode(const Driver& driver) : driver_(driver) {
  status_ = driver_.Check(driver_.ThreadExchangeStreamCaptureMode(&mode_),
                          "cuThreadExchangeStreamCaptureMode (to RELAXED)");
  relaxed_ = status_.ok();
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (relaxed_) driver_.ThreadExchangeStreamCaptureMode(&mode_);
}

absl::Status RelaxedCaptureMode::Restore() {
  if (!relaxed_) return absl::OkStatus();
  relaxed_ = false;
  return driver_.Check(driver_.ThreadExchangeStreamCaptureMode(&mode_),
                       "cuThreadExchangeStreamCaptureMode (restoring the thread's mode)");
}

}  // namespace kpack::internal
