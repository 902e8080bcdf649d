// What every GPU test does first: without a usable driver it is skipped (reported as
// skipped, never passed), or fails when KPACK_REQUIRE_GPU=1 says a GPU must be there.

#ifndef KPACK_TESTS_GPU_GPU_ENV_H_
#define KPACK_TESTS_GPU_GPU_ENV_H_

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace kpack::testing {

inline bool RequireGpu() {
  const char* v = std::getenv("KPACK_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace kpack::testing

// In a test body or SetUp: returns from it, skipped or failed, when `status` (the result
// of loading the driver) is not OK.
#define KPACK_SKIP_WITHOUT_GPU(status)                              \
  do {                                                              \
    const absl::Status kpack_gpu_status_ = (status);                \
    if (!kpack_gpu_status_.ok()) {                                  \
      if (::kpack::testing::RequireGpu()) {                         \
        FAIL() << "KPACK_REQUIRE_GPU=1 but: " << kpack_gpu_status_; \
      }                                                             \
      GTEST_SKIP() << "no GPU: " << kpack_gpu_status_;              \
    }                                                               \
  } while (0)

#endif  // KPACK_TESTS_GPU_GPU_ENV_H_
