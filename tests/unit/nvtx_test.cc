// NVTX ranges as a profiler sees them: the test injection library (tests/nvtx_inject),
// loaded through NVTX_INJECTION64_PATH like nsys's, records every range kpack opens.
// NVTX reads that variable once, at the first NVTX call in the process, so main() sets it
// before anything else runs. Built with -DKPACK_ENABLE_NVTX=OFF, kpack makes no NVTX call
// at all: NVTX never loads the library, and the same launches open no range.

#include <cstdlib>

#include "fake_driver.h"
#include "fake_runtime.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "nvtx_inject/nvtx_inject.h"

namespace kpack {
namespace {

const CUdeviceptr kX = 0x10000, kY = 0x20000, kOut = 0x30000;
constexpr bool kCompiledIn = KPACK_ENABLE_NVTX;  // the build's -DKPACK_ENABLE_NVTX

class NvtxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ResetFake();
    kpack_nvtx_inject_reset();
  }
  void TearDown() override { unsetenv("KPACK_NVTX"); }
};

TEST_F(NvtxTest, OneRangePerLaunchNamedAfterTheKernel) {
  auto rt = testing::OpenFake();
  ASSERT_TRUE(rt.ok()) << rt.status();
  ASSERT_EQ(kpack_nvtx_inject_initialized(), kCompiledIn)
      << "NVTX loaded the injection library: " << kpack_nvtx_inject_initialized();
  Kernel add = *rt->Find("add");
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(add.Launch(Grid{1}, nullptr, kX, kY, kOut, 1).ok());
  ASSERT_TRUE(rt->Launch("pdl", Grid{1}, nullptr, kX, kOut, 1).ok());
  ASSERT_TRUE(add.Launch(Grid{0}, nullptr, kX, kY, kOut, 1).ok());  // empty grid: no range

  if (!kCompiledIn) {
    EXPECT_EQ(kpack_nvtx_inject_push_count(), 0u);
    return;
  }
  ASSERT_EQ(kpack_nvtx_inject_push_count(), 4u);
  EXPECT_EQ(kpack_nvtx_inject_pop_count(), 4u);
  EXPECT_EQ(kpack_nvtx_inject_max_depth(), 1);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_STREQ(kpack_nvtx_inject_push_text(i), "add");
    EXPECT_STREQ(kpack_nvtx_inject_push_domain(i), "kpack");
  }
  EXPECT_STREQ(kpack_nvtx_inject_push_text(3), "pdl");
}

TEST_F(NvtxTest, RangeClosesWhenTheLaunchFails) {
  auto rt = testing::OpenFake();
  ASSERT_TRUE(rt.ok());
  ASSERT_TRUE(rt->Preload().ok());
  fake::FailNext("LaunchKernelEx", CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_FALSE(rt->Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1).ok());
  EXPECT_EQ(kpack_nvtx_inject_push_count(), kCompiledIn ? 1u : 0u);
  EXPECT_EQ(kpack_nvtx_inject_pop_count(), kCompiledIn ? 1u : 0u);
}

TEST_F(NvtxTest, OffByOptionAndByEnvironment) {
  Options o = testing::FakeOptions();
  o.nvtx = false;
  auto off = Runtime::Open(KPACK_TEST_PACK_DIR, o);
  ASSERT_TRUE(off.ok());
  ASSERT_TRUE(off->Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1).ok());
  EXPECT_EQ(kpack_nvtx_inject_push_count(), 0u);

  setenv("KPACK_NVTX", "0", 1);
  auto env_off = testing::OpenFake();
  ASSERT_TRUE(env_off.ok());
  ASSERT_TRUE(env_off->Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1).ok());
  EXPECT_EQ(kpack_nvtx_inject_push_count(), 0u);
}

}  // namespace
}  // namespace kpack

int main(int argc, char** argv) {
  setenv("NVTX_INJECTION64_PATH", KPACK_NVTX_INJECT_PATH, 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
