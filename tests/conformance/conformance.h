// The runtime's behavioural conformance suite: one set of test bodies
// (conformance_test.cc) run against
//   - the fake driver, with kernels emulated on the host (fake_backend.cc, CPU tier),
//   - the real driver on a GPU (gpu_backend.cc, GPU tier),
// each twice: launching eagerly, and with every launch captured into a CUDA graph that is
// then replayed on a different stream than the one captured (Mode::capture). The bodies
// reach the driver only through kpack's driver table and check results computed by the
// kernels, so the same assertions hold on both drivers.
//
// A backend provides the driver and its set-up; nothing in a test body asks which
// backend runs it.

#ifndef KPACK_TESTS_CONFORMANCE_CONFORMANCE_H_
#define KPACK_TESTS_CONFORMANCE_CONFORMANCE_H_

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "driver/driver.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"

namespace kpack::conformance {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Options::driver_path for the runtimes a test opens ("" for libcuda).
  virtual std::string driver_path() const = 0;
  // Before each test: the driver loaded and device 0's primary context current on the
  // calling thread. A non-OK status means no driver (the test is skipped, or failed under
  // KPACK_REQUIRE_GPU=1).
  virtual absl::Status SetUp() = 0;
  // After each test, once everything the test made is released.
  virtual void TearDown() = 0;
  virtual const internal::Driver& driver() const = 0;
};

struct Mode {
  Backend* backend;
  bool capture;  // every launch captured, and replayed on another stream
};

inline std::string ModeName(const ::testing::TestParamInfo<Mode>& info) {
  return std::string(info.param.backend->name()) + (info.param.capture ? "Captured" : "Eager");
}

#define KP_ASSERT_OK(expr)                       \
  do {                                           \
    absl::Status s_ = (expr);                    \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_; \
  } while (0)

#define CU_ASSERT(expr)                                                     \
  do {                                                                      \
    CUresult r_ = (expr);                                                   \
    ASSERT_EQ(r_, CUDA_SUCCESS) << #expr << " -> " << static_cast<int>(r_); \
  } while (0)

// The streams a launch goes to: eagerly to `stream`; in capture mode captured on
// `capture` and the graph replayed on `replay`. Each thread that launches in capture
// mode needs its own (captures are per stream).
struct Streams {
  CUstream stream = nullptr;
  CUstream capture = nullptr;
  CUstream replay = nullptr;
};

class ConformanceTest : public ::testing::TestWithParam<Mode> {
 protected:
  // Arena bytes ReserveScratch sets aside before each capture: more than any launch in
  // the suite needs.
  static constexpr size_t kCaptureScratch = 1 << 20;

  void SetUp() override;
  void TearDown() override;

  const internal::Driver& d() const { return GetParam().backend->driver(); }
  bool capture() const { return GetParam().capture; }
  Options options() const;
  // A runtime on this backend's driver; failures are test failures.
  std::unique_ptr<Runtime> Open(const std::string& dir, Options options);
  std::unique_ptr<Runtime> Open(const std::string& dir) { return Open(dir, this->options()); }

  // One launch through `launch(stream)`, eagerly or, in capture mode, captured into a
  // graph (Preload and ReserveScratch first, as the API asks) that is replayed on another
  // stream and synchronized. Returns the launch's status; the capture must survive it.
  absl::Status Run(Runtime& rt, const std::function<absl::Status(CUstream)>& launch);
  absl::Status Run(Runtime& rt, const Streams& streams,
                   const std::function<absl::Status(CUstream)>& launch);
  // Streams in the current context, destroyed at TearDown (or by DestroyStreams).
  Streams NewStreams();
  CUstream NewStream();
  void DestroyStreams(const Streams& streams);

  // Device memory, freed at TearDown. Alloc fills it with 0xff bytes (NaN for floats), so
  // that an output nobody wrote shows.
  CUdeviceptr Alloc(size_t bytes);
  template <typename T>
  CUdeviceptr Upload(const std::vector<T>& host) {
    CUdeviceptr p = Alloc(host.size() * sizeof(T));
    EXPECT_EQ(d().MemcpyHtoD(p, host.data(), host.size() * sizeof(T)), CUDA_SUCCESS);
    // From pageable memory the DMA may still be in flight on the legacy stream.
    EXPECT_EQ(d().StreamSynchronize(nullptr), CUDA_SUCCESS);
    return p;
  }
  // Waits for the test's streams, then copies back.
  template <typename T>
  std::vector<T> Download(CUdeviceptr p, size_t n) {
    std::vector<T> host(n);
    Sync();
    EXPECT_EQ(d().MemcpyDtoH(host.data(), p, n * sizeof(T)), CUDA_SUCCESS);
    return host;
  }
  void Sync();
  static std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -4, float hi = 4);

  Streams main_;  // the test's own streams, in device 0's primary context
  CUcontext primary_ = nullptr;

 private:
  std::vector<CUdeviceptr> allocations_;
  std::vector<Streams> streams_;
  bool set_up_ = false;
};

inline uint32_t Cdiv(uint64_t a, uint64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

// The backend this binary runs the suite on (fake_backend.cc or gpu_backend.cc).
Backend* TheBackend();

}  // namespace kpack::conformance

#endif  // KPACK_TESTS_CONFORMANCE_CONFORMANCE_H_
