// RelaxedCaptureMode: a scope in CUDA's RELAXED stream capture interaction mode, for the
// driver calls kpack makes that are "potentially unsafe" during a capture (building
// graphs, loading code) but neither captured nor synchronizing.

#ifndef KPACK_SRC_DRIVER_CAPTURE_MODE_H_
#define KPACK_SRC_DRIVER_CAPTURE_MODE_H_

#include <cuda.h>

#include "absl/status/status.h"
#include "driver/driver.h"

namespace kpack::internal {

// The calling thread in CUDA's RELAXED stream capture interaction mode for the scope
// (cuThreadExchangeStreamCaptureMode), then back in its own. Building, instantiating and
// destroying graphs, loading code and allocating are "potentially unsafe" during a capture:
// in the thread's default (GLOBAL) mode they fail, and invalidate a capture of this thread,
// while this thread or any other captures in global mode. None of them is captured or
// synchronizes with a stream, which is what RELAXED mode is for: the driver then neither
// refuses them nor invalidates anyone's capture.
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(const Driver& driver);
  // Restores the thread's mode unless Restore() did (a failure then is ignored).
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;
  // Whether the thread is relaxed now: the exchange's error otherwise.
  const absl::Status& status() const { return status_; }
  // Restores the thread's mode now; its error if that fails.
  absl::Status Restore();

 private:
  const Driver& driver_;
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  absl::Status status_;
  bool relaxed_ = false;
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_DRIVER_CAPTURE_MODE_H_
