// Helpers for tests that run kpack against the recording fake driver: a Runtime opened
// on the fake, and a scratch copy of the test pack whose manifest and files a test may
// break.

#ifndef KPACK_TESTS_UNIT_FAKE_RUNTIME_H_
#define KPACK_TESTS_UNIT_FAKE_RUNTIME_H_

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "driver/driver.h"
#include "fake_driver.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "nlohmann/json.hpp"

#define KP_ASSERT_OK(expr)                       \
  do {                                           \
    absl::Status s_ = (expr);                    \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_; \
  } while (0)
#define KP_EXPECT_OK(expr)                       \
  do {                                           \
    absl::Status s_ = (expr);                    \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_; \
  } while (0)

namespace kpack::testing {

// The value of type T at `offset` in a recorded launch's parameter buffer.
template <typename T>
T At(const fake::LaunchRecord& r, size_t offset) {
  T v;
  std::memcpy(&v, r.params.data() + offset, sizeof(T));
  return v;
}

inline fake::LaunchRecord LastLaunch() { return fake::GetLaunch(fake::LaunchCount() - 1); }

// The fake's driver table, as kpack loads it, initialized (again after fake::Reset()).
inline const internal::Driver& FakeDriver() {
  static const std::shared_ptr<const internal::Driver> driver = [] {
    auto loaded = internal::Driver::Load(KPACK_FAKE_DRIVER);
    if (!loaded.ok()) std::abort();
    return *loaded;
  }();
  driver->Init(0);
  return *driver;
}

// Makes device `ordinal`'s primary context current on the calling thread, as an
// application does before launching: with the fake, as with libcuda, a thread starts
// with no current context.
inline CUcontext UsePrimaryContext(int ordinal = 0) {
  const internal::Driver& d = FakeDriver();
  CUdevice device = 0;
  CUcontext context = nullptr;
  if (d.DeviceGet(&device, ordinal) != CUDA_SUCCESS ||
      d.DevicePrimaryCtxRetain(&context, device) != CUDA_SUCCESS ||
      d.CtxSetCurrent(context) != CUDA_SUCCESS) {
    std::abort();
  }
  return context;
}

// fake::Reset(), then device 0's primary context current on this thread.
inline void ResetFake() {
  fake::Reset();
  UsePrimaryContext();
}

inline Options FakeOptions() {
  Options o;
  o.driver_path = KPACK_FAKE_DRIVER;
  return o;
}

inline absl::StatusOr<Runtime> OpenFake(const std::string& dir = KPACK_TEST_PACK_DIR,
                                        Options options = FakeOptions()) {
  return Runtime::Open(dir, options);
}

// A fixture for tests of a Runtime on the fake: the fake reset before and after each test
// (device 0's primary context current), runtimes and streams through kpack's driver table.
class FakeRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { ResetFake(); }
  void TearDown() override { fake::Reset(); }

  // A runtime on the fake; a failure to open is a test failure.
  Runtime Open(const std::string& dir = KPACK_TEST_PACK_DIR) {
    auto rt = OpenFake(dir);
    EXPECT_TRUE(rt.ok()) << rt.status();
    return std::move(*rt);
  }
  const internal::Driver& d() { return FakeDriver(); }
  // A real (fake) stream, created through the same driver table kpack uses.
  CUstream NewStream() {
    CUstream s = nullptr;
    EXPECT_EQ(d().StreamCreate(&s, 0), CUDA_SUCCESS);
    return s;
  }
};

// A copy of a pack (kernels/testpack by default) in a fresh temporary directory, removed
// on destruction.
class TempPack {
 public:
  explicit TempPack(const std::string& source = KPACK_TEST_PACK_DIR) {
    char tmpl[] = "/tmp/kpack_test_XXXXXX";
    root_ = mkdtemp(tmpl);
    dir_ = root_ / "pack";
    std::filesystem::copy(source, dir_, std::filesystem::copy_options::recursive);
    std::ifstream in(dir_ / "manifest.json");
    manifest_ = nlohmann::json::parse(in);
  }
  ~TempPack() { std::filesystem::remove_all(root_); }

  std::string dir() const { return dir_.string(); }
  const std::filesystem::path& root() const { return root_; }
  nlohmann::json& manifest() { return manifest_; }
  nlohmann::json& kernel(const std::string& name) {
    for (auto& k : manifest_["kernels"]) {
      if (k["name"] == name) return k;
    }
    std::abort();
  }
  nlohmann::json& variant(const std::string& name) { return kernel(name)["variants"][0]; }
  void Save() {
    std::ofstream out(dir_ / "manifest.json");
    out << manifest_.dump(2);
  }

 private:
  std::filesystem::path root_;
  std::filesystem::path dir_;
  nlohmann::json manifest_;
};

}  // namespace kpack::testing

#endif  // KPACK_TESTS_UNIT_FAKE_RUNTIME_H_
