// The runtime against the recording fake driver: what reaches cuLaunchKernelEx for every
// kind of parameter and launch attribute, load-time checks, scratch arenas, driver faults,
// hostile packs, and concurrent launches.

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "driver/driver.h"
#include "fake_driver.h"
#include "fake_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "util/sha256.h"

namespace kpack {
namespace {

using ::kpack::testing::At;
using ::kpack::testing::FakeOptions;
using ::kpack::testing::LastLaunch;
using ::kpack::testing::OpenFake;
using ::kpack::testing::TempPack;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

const CUdeviceptr kX = 0x7f0000001000, kY = 0x7f0000002000, kOut = 0x7f0000003000;

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { fake::Reset(); }
  void TearDown() override { fake::Reset(); }

  Runtime Open(const std::string& dir = KPACK_TEST_PACK_DIR) {
    auto rt = OpenFake(dir);
    EXPECT_TRUE(rt.ok()) << rt.status();
    return std::move(*rt);
  }
  // A real (fake) stream, created through the same driver table kpack uses.
  CUstream NewStream() {
    auto driver = internal::Driver::Load(KPACK_FAKE_DRIVER);
    EXPECT_TRUE(driver.ok()) << driver.status();
    CUstream s = nullptr;
    EXPECT_EQ((*driver)->StreamCreate(&s, 0), CUDA_SUCCESS);
    return s;
  }
};

// ---- driver loading ----

TEST_F(RuntimeTest, NoDriverLibraryIsUnavailableAndSaysWhatWasTried) {
  Options o;
  o.driver_path = "/nonexistent/libcuda.so.1";
  auto rt = Runtime::Open(KPACK_TEST_PACK_DIR, o);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(rt.status()), AllOf(HasSubstr("dlopen(\"/nonexistent/libcuda.so.1\")"),
                                      HasSubstr("KPACK_CUDA_DRIVER")));
}

TEST_F(RuntimeTest, DriverPathFromEnvironment) {
  setenv("KPACK_CUDA_DRIVER", "/nonexistent/from-env.so", 1);
  auto missing = Runtime::Open(KPACK_TEST_PACK_DIR);
  setenv("KPACK_CUDA_DRIVER", KPACK_FAKE_DRIVER, 1);
  auto fake = Runtime::Open(KPACK_TEST_PACK_DIR);
  unsetenv("KPACK_CUDA_DRIVER");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(Msg(missing.status()), HasSubstr("/nonexistent/from-env.so"));
  EXPECT_TRUE(fake.ok()) << fake.status();
}

TEST_F(RuntimeTest, DriverWithoutDevicesIsUnavailable) {
  fake::SetInitError(CUDA_ERROR_NO_DEVICE);
  auto rt = OpenFake();
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(rt.status()), AllOf(HasSubstr("cuInit"), HasSubstr("CUDA_ERROR_NO_DEVICE")));
}

TEST_F(RuntimeTest, DriverMissingAFunctionIsUnavailable) {
  fake::HideSymbol("LaunchKernelEx");
  auto rt = OpenFake();
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(rt.status()), HasSubstr("cuLaunchKernelEx"));
}

// ---- finding and loading ----

TEST_F(RuntimeTest, OpensTestPackLazily) {
  Runtime rt = Open();
  EXPECT_THAT(rt.kernel_names(), ::testing::ElementsAre("add", "scalars", "matmul", "cluster",
                                                        "pdl", "scratch", "softmax"));
  EXPECT_EQ(fake::LibraryLoads(), 0) << "Open must not load kernels (lazy by default)";
  auto add = rt.Find("add");
  ASSERT_TRUE(add.ok());
  EXPECT_EQ(add->num_args(), 4u);
  EXPECT_EQ(add->arg_name(3), "n");
  EXPECT_EQ(add->arg_type(0), "*fp32");
  EXPECT_EQ(*add->ArgIndex("out_ptr"), 2u);
  EXPECT_EQ(add->ArgIndex("BLOCK").status().code(), absl::StatusCode::kNotFound);

  auto missing = rt.Find("sub");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), AllOf(HasSubstr("'sub'"), HasSubstr("testpack")));

  KP_ASSERT_OK(add->Launch(Grid{1}, nullptr, kX, kY, kOut, 10));
  KP_ASSERT_OK(add->Launch(Grid{1}, nullptr, kX, kY, kOut, 10));
  EXPECT_EQ(fake::LibraryLoads(), 1) << "one load per variant, on first use";
  EXPECT_EQ(rt.stats().libraries_loaded, 1u);
}

TEST_F(RuntimeTest, PreloadLoadsEverythingOnceAndNeedsAContext) {
  {
    fake::SetAutoContext(false);
    auto rt = OpenFake();
    ASSERT_TRUE(rt.ok());
    absl::Status s = rt->Preload();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(Msg(s), HasSubstr("no CUDA context is current"));
    EXPECT_EQ(fake::LoadedLibraries(), 0);
  }
  fake::Reset();
  Options o = FakeOptions();
  o.preload = true;
  auto rt = Runtime::Open(KPACK_TEST_PACK_DIR, o);
  ASSERT_TRUE(rt.ok()) << rt.status();
  EXPECT_EQ(fake::LibraryLoads(), 7);
  KP_ASSERT_OK(rt->Preload());
  EXPECT_EQ(fake::LibraryLoads(), 7);
  EXPECT_EQ(fake::LoadedLibraries(), 7);
}

TEST_F(RuntimeTest, DestructionUnloadsEverything) {
  {
    Runtime rt = Open();
    KP_ASSERT_OK(rt.Preload());
    KP_ASSERT_OK(rt.Launch("scratch", Grid{2, 2}, nullptr, kX, kOut, 64, 64, 64));
    EXPECT_EQ(fake::LoadedLibraries(), 7);
    EXPECT_EQ(fake::LiveAllocations(), 1);
  }
  EXPECT_EQ(fake::LoadedLibraries(), 0);
  EXPECT_EQ(fake::LiveAllocations(), 0);
}

// ---- argument bytes ----

TEST_F(RuntimeTest, VectorAddBytesBlockAndGrid) {
  Runtime rt = Open();
  KP_ASSERT_OK(rt.Launch("add", Grid{7}, nullptr, kX, reinterpret_cast<float*>(kY),
                         reinterpret_cast<void*>(kOut), 5000));
  fake::LaunchRecord r = LastLaunch();
  EXPECT_STREQ(r.entry.data(), "add_kernel");
  EXPECT_THAT(r.grid, ::testing::ElementsAre(7u, 1u, 1u));
  EXPECT_THAT(r.block, ::testing::ElementsAre(128u, 1u, 1u));
  EXPECT_EQ(r.shared_bytes, 0u);
  EXPECT_TRUE(r.params_via_extra);
  EXPECT_EQ(r.num_attrs, 0u);
  EXPECT_EQ(r.param_size, 48u);
  EXPECT_EQ(At<uint64_t>(r, 0), kX);
  EXPECT_EQ(At<uint64_t>(r, 8), kY);
  EXPECT_EQ(At<uint64_t>(r, 16), kOut);
  EXPECT_EQ(At<int32_t>(r, 24), 5000);
  EXPECT_EQ(At<uint32_t>(r, 28), 0u) << "padding";
  EXPECT_EQ(At<uint64_t>(r, 32), 0u) << "global scratch is null when its size is 0";
  EXPECT_EQ(At<uint64_t>(r, 40), 0u) << "profile scratch is null when its size is 0";
}

TEST_F(RuntimeTest, ScalarBytesFp32Bf16Fp16BoolI64) {
  Runtime rt = Open();
  const int64_t big = (int64_t{1} << 40) + 12345;
  KP_ASSERT_OK(
      rt.Launch("scalars", Grid{3}, nullptr, kX, kOut, 700, 1.1, 0.375, -0.8125f, true, big));
  fake::LaunchRecord r = LastLaunch();
  EXPECT_EQ(r.param_size, 56u);
  EXPECT_EQ(At<uint64_t>(r, 0), kX);
  EXPECT_EQ(At<uint64_t>(r, 8), kOut);
  EXPECT_EQ(At<int32_t>(r, 16), 700);
  EXPECT_EQ(At<float>(r, 20), 1.1f) << "a double for an fp32 parameter goes as a 4-byte float";
  EXPECT_EQ(At<uint16_t>(r, 24), 0x3ec0) << "0.375 as bf16";
  EXPECT_EQ(At<uint16_t>(r, 26), 0xba80) << "-0.8125 as fp16";
  EXPECT_EQ(At<uint8_t>(r, 28), 1) << "bool as one byte";
  EXPECT_EQ(At<int64_t>(r, 32), big) << "all 8 bytes of an i64";

  KP_ASSERT_OK(rt.Launch("scalars", Grid{3}, nullptr, kX, kOut, 700, 1.0f, BFloat16{0x1234},
                         Half{0x4321}, false, int64_t{-1}));
  r = LastLaunch();
  EXPECT_EQ(At<uint16_t>(r, 24), 0x1234);
  EXPECT_EQ(At<uint16_t>(r, 26), 0x4321);
  EXPECT_EQ(At<uint8_t>(r, 28), 0);
  EXPECT_EQ(At<int64_t>(r, 32), -1);
}

TEST_F(RuntimeTest, DynamicArgsAndBoundLaunchPatchOnlyTheirSlot) {
  Runtime rt = Open();
  Kernel add = *rt.Find("add");
  std::vector<Arg> args = {Arg(kX), Arg(kY), Arg(kOut), Arg(int64_t{64})};
  KP_ASSERT_OK(add.LaunchArgs(Grid{1}, nullptr, args));
  EXPECT_EQ(At<int32_t>(LastLaunch(), 24), 64);

  auto bound = add.Bind(Grid{2}, nullptr, args);
  ASSERT_TRUE(bound.ok()) << bound.status();
  KP_ASSERT_OK(bound->Launch());
  fake::LaunchRecord before = LastLaunch();
  KP_ASSERT_OK(bound->Set(3, 99));
  bound->set_grid(Grid{5});
  KP_ASSERT_OK(bound->Launch());
  fake::LaunchRecord after = LastLaunch();
  EXPECT_EQ(after.grid[0], 5u);
  EXPECT_EQ(At<int32_t>(after, 24), 99);
  EXPECT_EQ(std::memcmp(before.params.data(), after.params.data(), 24), 0);
  EXPECT_EQ(std::memcmp(before.params.data() + 28, after.params.data() + 28, 20), 0);

  absl::Status s = bound->Set(4, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  s = bound->Set(3, 1.5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("'n'"));
  KP_ASSERT_OK(bound->Launch());
  EXPECT_EQ(At<int32_t>(LastLaunch(), 24), 99) << "a refused Set leaves the slot as it was";
}

TEST_F(RuntimeTest, WrongArgumentsAreErrorsAndNeverLaunch) {
  Runtime rt = Open();
  absl::Status s = rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("kernel 'add' takes 4 arguments"), HasSubstr("n: i32"),
                            HasSubstr("got 3")));
  s = rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1, 2);
  EXPECT_THAT(Msg(s), HasSubstr("got 5"));
  s = rt.Launch("add", Grid{1}, nullptr, kX, 3.0f, kOut, 1);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("argument 1 ('y_ptr')"), HasSubstr("expects *fp32"),
                            HasSubstr("got a float")));
  s = rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, int64_t{1} << 33);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("'n'"), HasSubstr("does not fit")));
  s = rt.Launch("scalars", Grid{1}, nullptr, kX, kOut, 1, 1.0, 1.0, 1.0, 1, int64_t{0});
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("'flag'"), HasSubstr("expects i1")));
  s = rt.Launch("nope", Grid{1}, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Kernel().Launch(Grid{1}, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
}

TEST_F(RuntimeTest, EmptyGridLaunchesNothing) {
  Runtime rt = Open();
  KP_ASSERT_OK(rt.Launch("add", Grid{0}, nullptr, kX, kY, kOut, 0));
  KP_ASSERT_OK(rt.Launch("matmul", Grid{3, 0}, nullptr, kX, kY, kOut, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
  // Arguments are still checked.
  EXPECT_FALSE(rt.Launch("add", Grid{0}, nullptr, kX, kY, kOut).ok());
}

// ---- launch attributes and load-time device checks ----

TEST_F(RuntimeTest, ClusterKernelMultipliesGridAndSetsClusterAttributes) {
  Runtime rt = Open();
  KP_ASSERT_OK(rt.Launch("cluster", Grid{5, 2, 3}, nullptr, kX, kOut, 4096));
  fake::LaunchRecord r = LastLaunch();
  EXPECT_THAT(r.grid, ::testing::ElementsAre(10u, 2u, 3u));
  ASSERT_EQ(r.num_attrs, 2u);
  EXPECT_EQ(r.attrs[0].id, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
  EXPECT_EQ(r.attrs[0].value.clusterDim.x, 2u);
  EXPECT_EQ(r.attrs[0].value.clusterDim.y, 1u);
  EXPECT_EQ(r.attrs[0].value.clusterDim.z, 1u);
  EXPECT_EQ(r.attrs[1].id, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE);
  EXPECT_EQ(r.attrs[1].value.clusterSchedulingPolicyPreference,
            CU_CLUSTER_SCHEDULING_POLICY_SPREAD);

  absl::Status s = rt.Launch("cluster", Grid{1u << 30}, nullptr, kX, kOut, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("2^31-1"));
}

TEST_F(RuntimeTest, PdlKernelSetsProgrammaticStreamSerialization) {
  Runtime rt = Open();
  KP_ASSERT_OK(rt.Launch("pdl", Grid{4}, nullptr, kX, kOut, 4096));
  fake::LaunchRecord r = LastLaunch();
  ASSERT_EQ(r.num_attrs, 1u);
  EXPECT_EQ(r.attrs[0].id, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
  EXPECT_EQ(r.attrs[0].value.programmaticStreamSerializationAllowed, 1);
}

TEST_F(RuntimeTest, CooperativeVariantSetsCooperativeAttribute) {
  TempPack pack;
  pack.variant("add")["launch_cooperative_grid"] = true;
  pack.Save();
  Runtime rt = Open(pack.dir());
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1));
  fake::LaunchRecord r = LastLaunch();
  ASSERT_EQ(r.num_attrs, 1u);
  EXPECT_EQ(r.attrs[0].id, CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
  EXPECT_EQ(r.attrs[0].value.cooperative, 1);
}

TEST_F(RuntimeTest, LargeSharedMemoryOptsInOncePerDevice) {
  fake::SetDevices({fake::DeviceConfig{}, fake::DeviceConfig{}});
  fake::SetKernelLimits({.max_threads_per_block = 1024, .static_shared_bytes = 1024});
  Runtime rt = Open();
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1));
  EXPECT_TRUE(fake::KernelAttributeSets().empty()) << "no opt-in at or below 48 KiB";
  for (int i = 0; i < 3; ++i) {
    KP_ASSERT_OK(rt.Launch("matmul", Grid{1, 1}, nullptr, kX, kY, kOut, 128, 128, 128, 128, 1, 128,
                           1, 128, 1));
  }
  EXPECT_EQ(LastLaunch().shared_bytes, 65536u);
  EXPECT_EQ(LastLaunch().block[0], 256u);
  std::vector<fake::KernelAttributeSet> sets = fake::KernelAttributeSets();
  ASSERT_EQ(sets.size(), 2u) << "once per device, not per launch";
  for (int dev = 0; dev < 2; ++dev) {
    EXPECT_EQ(sets[dev].entry, "matmul_kernel");
    EXPECT_EQ(sets[dev].attribute, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
    EXPECT_EQ(sets[dev].value, 232448 - 1024) << "opt-in limit minus static shared";
    EXPECT_EQ(sets[dev].device, dev);
  }
}

TEST_F(RuntimeTest, SharedMemoryBeyondTheDeviceIsALoadError) {
  fake::DeviceConfig small;
  small.max_shared_memory_per_block_optin = 48 * 1024;
  fake::SetDevices({small});
  Runtime rt = Open();
  absl::Status s =
      rt.Launch("matmul", Grid{1, 1}, nullptr, kX, kY, kOut, 1, 1, 1, 1, 1, 1, 1, 1, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("kernel 'matmul' variant 'default'"), HasSubstr("65536"),
                            HasSubstr("49152")));
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
  EXPECT_EQ(fake::LoadedLibraries(), 0) << "a refused variant is unloaded";
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1));  // others still serve
}

TEST_F(RuntimeTest, TooManyWarpsIsALoadError) {
  fake::SetKernelLimits({.max_threads_per_block = 64});
  Runtime rt = Open();
  absl::Status s = rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("variant 'default'"), HasSubstr("num_warps 4"),
                            HasSubstr("128 threads")));
}

TEST_F(RuntimeTest, ArchMismatchIsALoadErrorNamingTheVariant) {
  for (auto [major, minor] : {std::pair{8, 0}, std::pair{10, 0}, std::pair{9, 1}}) {
    fake::Reset();
    fake::DeviceConfig dev;
    dev.cc_major = major;
    dev.cc_minor = minor;
    fake::SetDevices({dev});
    Runtime rt = Open();
    absl::Status s = rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(Msg(s), AllOf(HasSubstr("kernel 'add' variant 'default'"), HasSubstr("sm_90a"),
                              HasSubstr(std::to_string(major) + "." + std::to_string(minor))));
    EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
  }
}

TEST_F(RuntimeTest, RealSm80AndSm100CubinsAreRefusedOnComputeCapability90) {
  Runtime rt = Open(KPACK_ARCH_PACK_DIR);
  absl::Status s80 = rt.Launch("add_sm80", Grid{1}, nullptr, kX, kY, kOut, 1);
  EXPECT_EQ(s80.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(s80), AllOf(HasSubstr("kernel 'add_sm80' variant 'default'"),
                              HasSubstr("arch 80 (sm_80)"), HasSubstr("compute capability 9.0")));
  absl::Status s100 = rt.Launch("add_sm100", Grid{1}, nullptr, kX, kY, kOut, 1);
  EXPECT_EQ(s100.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(s100), AllOf(HasSubstr("kernel 'add_sm100'"), HasSubstr("sm_100a")));
  EXPECT_EQ(fake::CallCount("LibraryLoadData"), 0) << "refused before the driver sees them";
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
}

// What the cubin's ELF can contradict is refused at Open, before any launch and before
// the driver sees the cubin (these used to open and fail at the first launch).
TEST_F(RuntimeTest, ManifestLayoutThatDisagreesWithTheCubinIsRefusedAtOpen) {
  TempPack pack;
  // Claims 'n' at offset 28: a consistent manifest, but not what the cubin says (24).
  pack.variant("add")["layout"][3]["offset"] = 28;
  pack.Save();
  auto rt = OpenFake(pack.dir());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(rt.status()),
              AllOf(HasSubstr("kernel 'add': variant 'default': field 'layout'"),
                    HasSubstr("KPARAM_INFO records of entry 'add_kernel'"),
                    HasSubstr("parameter 'n' (#3): expected offset 28 size 4 (manifest), "
                              "found offset 24 size 4 (cubin)")));
  EXPECT_EQ(fake::CallCount("LibraryLoadData"), 0);
}

TEST_F(RuntimeTest, ManifestWithFewerParametersThanTheCubinIsRefusedAtOpen) {
  TempPack pack;
  auto& layout = pack.variant("add")["layout"];
  layout.erase(5);  // drop $profile_scratch
  pack.Save();
  auto rt = OpenFake(pack.dir());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(rt.status()), HasSubstr("parameter #5: the cubin has it (offset 40 size 8), "
                                          "the manifest's layout does not"));
}

TEST_F(RuntimeTest, MissingEntrySymbolIsRefusedAtOpen) {
  TempPack pack;
  pack.variant("add")["entry"] = "not_in_the_cubin";
  pack.Save();
  auto rt = OpenFake(pack.dir());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(rt.status()),
              AllOf(HasSubstr("kernel 'add': variant 'default': field 'entry'"),
                    HasSubstr("'not_in_the_cubin' is not a kernel of cubin "
                              "'cubins/add/default.cubin' (it has: add_kernel)")));
  EXPECT_EQ(fake::CallCount("LibraryLoadData"), 0);
}

TEST_F(RuntimeTest, ArchThatDisagreesWithTheCubinIsRefusedAtOpen) {
  // An sm_80 cubin that the manifest calls arch 90 used to open, then fail at the first
  // launch on an H100 with the driver's NO_BINARY_FOR_GPU; the ELF says what it is.
  TempPack pack(KPACK_ARCH_PACK_DIR);
  pack.variant("add_sm80")["arch"] = 90;
  pack.Save();
  auto rt = OpenFake(pack.dir());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(rt.status()),
              AllOf(HasSubstr("kernel 'add_sm80': variant 'default': field 'arch'"),
                    HasSubstr("the manifest says 90"), HasSubstr("was built for 80")));
}

TEST_F(RuntimeTest, LoadingContextUsesItsFunctionOtherContextsTheContextFreeKernel) {
  fake::SetDevices({fake::DeviceConfig{}, fake::DeviceConfig{}});
  Runtime rt = Open();
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1));  // loads in device 0
  const CUfunction home = LastLaunch().function;

  auto driver = internal::Driver::Load(KPACK_FAKE_DRIVER);
  ASSERT_TRUE(driver.ok());
  CUcontext other = nullptr;
  ASSERT_EQ((*driver)->DevicePrimaryCtxRetain(&other, 1), CUDA_SUCCESS);
  ASSERT_EQ((*driver)->CtxPushCurrent(other), CUDA_SUCCESS);
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1));
  fake::LaunchRecord r = LastLaunch();
  EXPECT_EQ(r.context, other);
  EXPECT_NE(r.function, home) << "device 1 must not get device 0's CUfunction";
  CUcontext popped;
  (*driver)->CtxPopCurrent(&popped);
  (*driver)->DevicePrimaryCtxRelease(1);
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1));
  EXPECT_EQ(LastLaunch().function, home);
  EXPECT_EQ(fake::LibraryLoads(), 1) << "one load serves both devices";
}

// ---- scratch ----

TEST_F(RuntimeTest, GlobalScratchComesFromAPerStreamArenaSizedByGrid) {
  Runtime rt = Open();
  KP_ASSERT_OK(rt.Launch("scratch", Grid{4, 3}, nullptr, kX, kOut, 128, 96, 96));
  fake::LaunchRecord r = LastLaunch();
  uint64_t gs = At<uint64_t>(r, 32);
  EXPECT_NE(gs, 0u) << "a kernel with global_scratch_size > 0 must not get null";
  EXPECT_EQ(gs % 128, 0u) << "global_scratch_align";
  EXPECT_EQ(At<uint64_t>(r, 40), 0u) << "no profile scratch";
  EXPECT_EQ(fake::LiveAllocations(), 1);
  EXPECT_GE(fake::LiveBytes(), 4 * 3 * 128);
  EXPECT_EQ(rt.stats().scratch_arenas, 1u);

  // The same or a smaller grid reuses the arena; no allocation per launch.
  int64_t allocs = fake::CallCount("MemAlloc");
  for (int i = 0; i < 10; ++i) {
    KP_ASSERT_OK(rt.Launch("scratch", Grid{2, 3}, nullptr, kX, kOut, 64, 96, 96));
  }
  EXPECT_EQ(fake::CallCount("MemAlloc"), allocs);
  EXPECT_EQ(At<uint64_t>(LastLaunch(), 32), gs);

  // A larger grid grows it (the old buffer is kept for kernels still in flight).
  KP_ASSERT_OK(rt.Launch("scratch", Grid{40, 30}, nullptr, kX, kOut, 1280, 960, 960));
  EXPECT_EQ(fake::LiveAllocations(), 2);
  EXPECT_GE(fake::LiveBytes(), 40 * 30 * 128);
  EXPECT_EQ(rt.stats().scratch_arenas, 1u);
}

TEST_F(RuntimeTest, EachStreamGetsItsOwnArena) {
  Runtime rt = Open();
  CUstream a = NewStream(), b = NewStream();
  KP_ASSERT_OK(rt.Launch("scratch", Grid{1, 1}, a, kX, kOut, 32, 32, 32));
  uint64_t pa = At<uint64_t>(LastLaunch(), 32);
  KP_ASSERT_OK(rt.Launch("scratch", Grid{1, 1}, b, kX, kOut, 32, 32, 32));
  uint64_t pb = At<uint64_t>(LastLaunch(), 32);
  EXPECT_NE(pa, pb) << "concurrent streams must not share scratch";
  EXPECT_EQ(rt.stats().scratch_arenas, 2u);
  KP_ASSERT_OK(rt.ReserveScratch(a, 1 << 20));
  EXPECT_GE(rt.stats().scratch_bytes, uint64_t{1 << 20});
  int64_t allocs = fake::CallCount("MemAlloc");
  KP_ASSERT_OK(rt.Launch("scratch", Grid{64, 64}, a, kX, kOut, 2048, 2048, 2048));
  EXPECT_EQ(fake::CallCount("MemAlloc"), allocs) << "reserved ahead: no allocation";
}

TEST_F(RuntimeTest, ProfileScratchFollowsGlobalScratchAtItsAlignment) {
  TempPack pack;
  pack.variant("scratch")["profile_scratch_size"] = 64;
  pack.variant("scratch")["profile_scratch_align"] = 512;
  pack.Save();
  Runtime rt = Open(pack.dir());
  KP_ASSERT_OK(rt.Launch("scratch", Grid{3, 1}, nullptr, kX, kOut, 96, 32, 32));
  fake::LaunchRecord r = LastLaunch();
  uint64_t gs = At<uint64_t>(r, 32), ps = At<uint64_t>(r, 40);
  // 3 programs x 128 B = 384 B of global scratch, then profile scratch at 512.
  EXPECT_EQ(ps - gs, 512u);
  EXPECT_EQ(ps % 512, 0u);
  EXPECT_GE(fake::LiveBytes(), 512 + 3 * 64);
}

// ---- driver faults: each call failing in turn gives a clean status, leaks nothing, and
// leaves a runtime that still serves its other kernels ----

struct Fault {
  const char* fn;
  const char* kernel;
  CUresult code;
};

class DriverFaultTest : public RuntimeTest, public ::testing::WithParamInterface<Fault> {};

absl::Status LaunchNamed(Runtime& rt, const std::string& kernel) {
  if (kernel == "matmul") {
    return rt.Launch("matmul", Grid{1, 1}, nullptr, kX, kY, kOut, 1, 1, 1, 1, 1, 1, 1, 1, 1);
  }
  if (kernel == "scratch") return rt.Launch("scratch", Grid{2, 2}, nullptr, kX, kOut, 64, 64, 64);
  return rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1);
}

TEST_P(DriverFaultTest, CleanStatusNoLeakStillServes) {
  const Fault& f = GetParam();
  {
    Runtime rt = Open();
    fake::FailNext(f.fn, f.code);
    absl::Status s = LaunchNamed(rt, f.kernel);
    ASSERT_FALSE(s.ok()) << f.fn;
    EXPECT_THAT(Msg(s), HasSubstr(std::string("cu") + f.fn)) << s;
    EXPECT_THAT(Msg(s), HasSubstr(f.code == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
                                                                     : "CUDA_ERROR_INVALID_VALUE"));
    // The same kernel works once the fault is gone, and so do the others.
    KP_ASSERT_OK(LaunchNamed(rt, f.kernel));
    KP_ASSERT_OK(LaunchNamed(rt, "add"));
    KP_ASSERT_OK(LaunchNamed(rt, "scratch"));
  }
  EXPECT_EQ(fake::LoadedLibraries(), 0);
  EXPECT_EQ(fake::LiveAllocations(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    EachCall, DriverFaultTest,
    ::testing::Values(Fault{"CtxGetCurrent", "add", CUDA_ERROR_INVALID_VALUE},
                      Fault{"CtxGetDevice", "add", CUDA_ERROR_INVALID_VALUE},
                      Fault{"LibraryLoadData", "add", CUDA_ERROR_OUT_OF_MEMORY},
                      Fault{"LibraryGetKernel", "add", CUDA_ERROR_INVALID_VALUE},
                      Fault{"KernelGetParamInfo", "add", CUDA_ERROR_INVALID_VALUE},
                      Fault{"DeviceGetCount", "add", CUDA_ERROR_INVALID_VALUE},
                      Fault{"DeviceGetAttribute", "add", CUDA_ERROR_INVALID_VALUE},
                      Fault{"KernelGetAttribute", "add", CUDA_ERROR_INVALID_VALUE},
                      Fault{"KernelSetAttribute", "matmul", CUDA_ERROR_INVALID_VALUE},
                      Fault{"LaunchKernelEx", "add", CUDA_ERROR_OUT_OF_MEMORY},
                      Fault{"StreamGetCtx", "scratch", CUDA_ERROR_INVALID_VALUE},
                      Fault{"MemAlloc", "scratch", CUDA_ERROR_OUT_OF_MEMORY}),
    [](const ::testing::TestParamInfo<Fault>& info) { return info.param.fn; });

// ---- hostile pack files ----

TEST_F(RuntimeTest, CubinPathsMayNotLeaveThePack) {
  {
    TempPack pack;
    pack.variant("add")["cubin"] = "../outside.cubin";
    pack.Save();
    auto rt = OpenFake(pack.dir());
    EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(rt.status()), AllOf(HasSubstr("kernel 'add'"), HasSubstr("'..'")));
  }
  {
    TempPack pack;
    pack.variant("add")["cubin"] = std::string(KPACK_TEST_PACK_DIR) + "/cubins/add/default.cubin";
    pack.Save();
    auto rt = OpenFake(pack.dir());
    EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(rt.status()), HasSubstr("absolute"));
  }
  {
    TempPack pack;
    auto outside = pack.root() / "outside.cubin";
    std::filesystem::copy_file(std::filesystem::path(pack.dir()) / "cubins/add/default.cubin",
                               outside);
    std::filesystem::path link = std::filesystem::path(pack.dir()) / "cubins/add/link.cubin";
    std::filesystem::create_symlink(outside, link);
    pack.variant("add")["cubin"] = "cubins/add/link.cubin";
    pack.Save();
    auto rt = OpenFake(pack.dir());
    EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(rt.status()), HasSubstr("outside the pack directory"));
  }
}

TEST_F(RuntimeTest, CubinContentsAreChecked) {
  {
    TempPack pack;
    std::ofstream(std::filesystem::path(pack.dir()) / "cubins/add/default.cubin", std::ios::app)
        << "x";
    auto rt = OpenFake(pack.dir());
    EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(rt.status()), AllOf(HasSubstr("kernel 'add'"), HasSubstr("'sha256'"),
                                        HasSubstr("changed or corrupted")));
  }
  {
    TempPack pack;
    std::ofstream(std::filesystem::path(pack.dir()) / "cubins/add/default.cubin", std::ios::trunc);
    auto rt = OpenFake(pack.dir());
    EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(rt.status()), HasSubstr("is empty"));
  }
  {
    TempPack pack;
    std::filesystem::remove(std::filesystem::path(pack.dir()) / "cubins/add/default.cubin");
    auto rt = OpenFake(pack.dir());
    EXPECT_EQ(rt.status().code(), absl::StatusCode::kNotFound);
  }
  for (uintmax_t size : {uintmax_t{10}, uintmax_t{100}, uintmax_t{3000}}) {
    // A truncated cubin whose manifest sha256 matches it: refused at Open, before the
    // driver, which would read as far as the image's ELF headers say.
    TempPack pack;
    auto path = std::filesystem::path(pack.dir()) / "cubins/add/default.cubin";
    std::filesystem::resize_file(path, size);
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    pack.variant("add")["sha256"] =
        internal::Sha256Hex(std::as_bytes(std::span(bytes.data(), bytes.size())));
    pack.Save();
    auto rt = OpenFake(pack.dir());
    EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument) << size;
    EXPECT_THAT(Msg(rt.status()), AllOf(HasSubstr("kernel 'add'"), HasSubstr("variant 'default'"),
                                        HasSubstr("not a valid cubin")))
        << size;
    EXPECT_EQ(fake::CallCount("LibraryLoadData"), 0);
  }
}

TEST_F(RuntimeTest, MissingPackOrManifest) {
  auto rt = OpenFake("/nonexistent/pack");
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kNotFound);
  TempPack pack;
  std::filesystem::remove(std::filesystem::path(pack.dir()) / "manifest.json");
  rt = OpenFake(pack.dir());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(rt.status()), HasSubstr("manifest.json"));
}

// ---- concurrency ----

// Run under ThreadSanitizer in CI: eight threads race on first-use loading of the same
// kernels, on growing one scratch arena and on per-stream arenas, and on the dispatch
// counters.
TEST_F(RuntimeTest, ManyThreadsLaunchWhileTheKernelLoadsLazily) {
  Runtime rt = Open();
  auto dispatch = OpenFake(KPACK_DISPATCH_PACK_DIR);
  ASSERT_TRUE(dispatch.ok());
  Kernel add = *rt.Find("add");
  Kernel scratch = *rt.Find("scratch");
  Kernel axpy = *dispatch->Find("axpy");
  constexpr int kThreads = 8, kLaunches = 300;
  std::vector<CUstream> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(NewStream());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kLaunches; ++i) {
        const uint32_t blocks = 1 + (t * kLaunches + i) % 17;  // grows the shared arena
        absl::Status s[] = {
            add.Launch(Grid{1}, nullptr, kX, kY, kOut, t * 1000 + i),
            rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, i),
            scratch.Launch(Grid{blocks, 1}, nullptr, kX, kOut, 32 * blocks, 32, 32),
            scratch.Launch(Grid{blocks, 2}, streams[t], kX, kOut, 32 * blocks, 64, 64),
            axpy.Launch(streams[t], kX + 4 * (i % 2), kY, kOut, 16 * (1 + i * 997 % 20000), 1,
                        1.0f)};
        for (const absl::Status& st : s) failures.fetch_add(st.ok() ? 0 : 1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  // add, scratch, and axpy's generic and div16_unit variants of its three buckets: the
  // racing first launches load each variant they use once, and no other.
  EXPECT_EQ(fake::LibraryLoads(), 2 + 6);
  EXPECT_EQ(fake::LaunchCount(), kThreads * kLaunches * 5);
  EXPECT_EQ(rt.stats().scratch_arenas, 1u + kThreads);
  uint64_t axpy_launches = 0, fallbacks = 0;
  for (const auto& v : axpy.variant_stats()) {
    axpy_launches += v.launches;
    fallbacks += v.fallback_launches;
  }
  EXPECT_EQ(axpy_launches, uint64_t{kThreads * kLaunches});
  EXPECT_EQ(fallbacks, uint64_t{kThreads * kLaunches / 2}) << "the misaligned half";
}

}  // namespace
}  // namespace kpack
