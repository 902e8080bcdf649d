// The runtime against the recording fake driver, where only the fake can tell: what
// reaches the driver (parameter bytes, launch attributes, which CUfunction, which scratch
// pointer, how many driver calls a launch makes), load-time checks against configured
// devices, hostile packs, and concurrent launches under TSan. The runtime's behaviour as
// an application sees it is tested once for both drivers in tests/conformance; driver
// faults in driver_fault_test.cc.

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <latch>
#include <limits>
#include <map>
#include <mutex>
#include <set>
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
using ::testing::Not;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

const CUdeviceptr kX = 0x7f0000001000, kY = 0x7f0000002000, kOut = 0x7f0000003000;

class RuntimeTest : public testing::FakeRuntimeTest {};

// ---- driver loading ----

TEST_F(RuntimeTest, NoDriverLibraryIsUnavailableAndSaysWhatWasTried) {
  Options o;
  o.driver_path = "/nonexistent/libcuda.so.1";
  auto rt = Runtime::Open(KPACK_TEST_PACK_DIR, o);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kUnavailable);
  // The user chose this path: the advice is about that path, not about KPACK_CUDA_DRIVER.
  EXPECT_THAT(Msg(rt.status()), AllOf(HasSubstr("dlopen(\"/nonexistent/libcuda.so.1\")"),
                                      HasSubstr("the path was given explicitly"),
                                      Not(HasSubstr("set KPACK_CUDA_DRIVER"))));
}

TEST_F(RuntimeTest, DriverPathFromEnvironment) {
  setenv("KPACK_CUDA_DRIVER", "/nonexistent/from-env.so", 1);
  auto missing = Runtime::Open(KPACK_TEST_PACK_DIR);
  setenv("KPACK_CUDA_DRIVER", KPACK_FAKE_DRIVER, 1);
  auto fake = Runtime::Open(KPACK_TEST_PACK_DIR);
  unsetenv("KPACK_CUDA_DRIVER");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(missing.status()), AllOf(HasSubstr("/nonexistent/from-env.so"),
                                           HasSubstr("the path came from KPACK_CUDA_DRIVER"),
                                           Not(HasSubstr("set KPACK_CUDA_DRIVER"))));
  EXPECT_TRUE(fake.ok()) << fake.status();
}

// Only a user who named no driver at all is told about KPACK_CUDA_DRIVER.
TEST_F(RuntimeTest, DefaultDriverPathAdvisesKpackCudaDriver) {
  absl::StatusOr<std::shared_ptr<const internal::Driver>> d = internal::Driver::Load("");
  if (d.ok()) GTEST_SKIP() << "a CUDA driver is installed here: the default path loads";
  EXPECT_THAT(Msg(d.status()), AllOf(HasSubstr("dlopen(\"libcuda.so.1\")"),
                                     HasSubstr("install the NVIDIA driver, or set "
                                               "KPACK_CUDA_DRIVER")));
}

TEST_F(RuntimeTest, InvalidLogLevelIsRefusedByOpen) {
  setenv("KPACK_LOG_LEVEL", "bogus", 1);
  auto bad = OpenFake();
  setenv("KPACK_LOG_LEVEL", "", 1);  // empty: as unset
  auto empty = OpenFake();
  setenv("KPACK_LOG_LEVEL", "error", 1);
  auto good = OpenFake();
  unsetenv("KPACK_LOG_LEVEL");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(bad.status()),
              AllOf(HasSubstr("KPACK_LOG_LEVEL='bogus' is not a log level"),
                    HasSubstr("trace, debug, info, warn, error, critical or off")));
  EXPECT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(good.ok()) << good.status();
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

TEST_F(RuntimeTest, PreloadLoadsEverythingOnceAndNeedsAContext) {
  {
    ASSERT_EQ(testing::FakeDriver().CtxSetCurrent(nullptr), CUDA_SUCCESS);
    auto rt = OpenFake();
    ASSERT_TRUE(rt.ok());
    absl::Status s = rt->Preload();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(Msg(s), HasSubstr("no CUDA context is current"));
    EXPECT_EQ(fake::LoadedLibraries(), 0);
  }
  testing::ResetFake();
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

// Device handles are not ordinals here (cuDeviceGet's answer is ordinal + 100): the
// checks and attributes must use the handle of the context's device.
TEST_F(RuntimeTest, LargeSharedMemoryOptsInOncePerContextsDevice) {
  fake::SetDevices({fake::DeviceConfig{}, fake::DeviceConfig{}});
  fake::SetDeviceHandleOffset(100);
  fake::SetKernelLimits({.max_threads_per_block = 1024, .static_shared_bytes = 1024});
  testing::UsePrimaryContext(0);
  Runtime rt = Open();
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1));
  EXPECT_TRUE(fake::KernelAttributeSets().empty()) << "no opt-in at or below 48 KiB";
  for (int device : {0, 1}) {
    testing::UsePrimaryContext(device);
    for (int i = 0; i < 3; ++i) {
      KP_ASSERT_OK(rt.Launch("matmul", Grid{1, 1}, nullptr, kX, kY, kOut, 128, 128, 128, 128, 1,
                             128, 1, 128, 1));
    }
  }
  EXPECT_EQ(LastLaunch().shared_bytes, 65536u);
  EXPECT_EQ(LastLaunch().block[0], 256u);
  std::vector<fake::KernelAttributeSet> sets = fake::KernelAttributeSets();
  ASSERT_EQ(sets.size(), 2u) << "once per context's device, not per launch";
  for (int dev = 0; dev < 2; ++dev) {
    EXPECT_EQ(sets[dev].entry, "matmul_kernel");
    EXPECT_EQ(sets[dev].attribute, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
    EXPECT_EQ(sets[dev].value, 232448 - 1024) << "opt-in limit minus static shared";
    EXPECT_EQ(sets[dev].device, 100 + dev) << "the device's handle, not its ordinal";
  }
}

TEST_F(RuntimeTest, SharedMemoryBeyondTheDeviceIsALoadError) {
  fake::DeviceConfig small;
  small.max_shared_memory_per_block_optin = 48 * 1024;
  fake::SetDevices({small});
  testing::UsePrimaryContext();
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
    testing::UsePrimaryContext();
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

// ---- contexts ----

// Each context launches with its own CUfunction (cuKernelGetFunction in it); the library
// is loaded once for all. Preload in a context loads for that context, so a launch there
// (even inside a capture) loads nothing.
TEST_F(RuntimeTest, EachContextLaunchesWithItsOwnFunction) {
  fake::SetDevices({fake::DeviceConfig{}, fake::DeviceConfig{}});
  const CUcontext first = testing::UsePrimaryContext(0);
  Runtime rt = Open();
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1));  // loads in device 0
  const CUfunction home = LastLaunch().function;
  EXPECT_EQ(fake::CallCount("KernelGetFunction"), 1);

  const CUcontext second = testing::UsePrimaryContext(1);
  KP_ASSERT_OK(rt.Preload());
  EXPECT_EQ(fake::CallCount("KernelGetFunction"), 8) << "every variant, for this context";
  EXPECT_EQ(fake::LibraryLoads(), 7) << "the libraries are shared";
  CUstream stream = NewStream();
  KP_ASSERT_OK(rt.ReserveScratch(stream, 1 << 20));
  ASSERT_EQ(d().StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, stream, kX, kY, kOut, 1));
  KP_ASSERT_OK(rt.Launch("scratch", Grid{1, 1}, stream, kX, kOut, 32, 32, 32));
  CUgraph graph = nullptr;
  ASSERT_EQ(d().StreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_EQ(d().GraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(fake::CallCount("KernelGetFunction"), 8) << "nothing loaded during the capture";
  fake::LaunchRecord r = fake::GetLaunch(fake::LaunchCount() - 2);
  EXPECT_EQ(r.context, second);
  EXPECT_NE(r.function, home) << "device 1 must not get device 0's CUfunction";
  EXPECT_NE(r.function, nullptr);

  ASSERT_EQ(d().CtxSetCurrent(first), CUDA_SUCCESS);
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1));
  EXPECT_EQ(LastLaunch().function, home);
  EXPECT_EQ(fake::CallCount("KernelGetFunction"), 8);
}

// A context destroyed and another created at the same address (the fake hands the
// handle out again) is a new context: kpack must not launch the old one's CUfunction.
TEST_F(RuntimeTest, AContextAtADestroyedOnesAddressGetsItsOwnFunction) {
  fake::SetHandleReuse(true);
  Runtime rt = Open();
  CUdevice device = 0;
  ASSERT_EQ(d().CtxGetDevice(&device), CUDA_SUCCESS);
  CUcontext first = nullptr, second = nullptr;
  ASSERT_EQ(d().CtxCreate(&first, nullptr, 0, device), CUDA_SUCCESS);
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1));
  const CUfunction old_function = LastLaunch().function;
  ASSERT_EQ(d().CtxDestroy(first), CUDA_SUCCESS);
  ASSERT_EQ(d().CtxCreate(&second, nullptr, 0, device), CUDA_SUCCESS);
  ASSERT_EQ(second, first) << "the fake reuses the handle";
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, nullptr, kX, kY, kOut, 1));
  EXPECT_NE(LastLaunch().function, old_function);
  EXPECT_EQ(fake::CallCount("KernelGetFunction"), 2);
  ASSERT_EQ(d().CtxDestroy(second), CUDA_SUCCESS);
}

// ---- the launch path's driver calls ----

// A launch of a kernel without scratch makes one driver call besides cuLaunchKernelEx
// (cuCtxGetId, a thread-local read): detecting captures adds nothing to it. A kernel
// with scratch asks for the stream's capture status and id too.
TEST_F(RuntimeTest, DriverCallsPerLaunch) {
  Runtime rt = Open();
  CUstream stream = NewStream();
  KP_ASSERT_OK(rt.Launch("add", Grid{1}, stream, kX, kY, kOut, 1));
  KP_ASSERT_OK(rt.Launch("scratch", Grid{1, 1}, stream, kX, kOut, 32, 32, 32));
  auto calls = [] {
    std::map<std::string, int64_t> c;
#define KPACK_DRIVER_SYMBOL(name, version) c[#name] = fake::CallCount(#name);
#include "driver/driver_symbols.h"
#undef KPACK_DRIVER_SYMBOL
    return c;
  };
  auto delta = [&](const std::map<std::string, int64_t>& before) {
    std::map<std::string, int64_t> d;
    for (const auto& [fn, n] : calls()) {
      if (n != before.at(fn)) d[fn] = n - before.at(fn);
    }
    return d;
  };
  using Calls = std::map<std::string, int64_t>;
  auto before = calls();
  for (int i = 0; i < 10; ++i) KP_ASSERT_OK(rt.Launch("add", Grid{1}, stream, kX, kY, kOut, 1));
  EXPECT_EQ(delta(before), (Calls{{"CtxGetId", 10}, {"LaunchKernelEx", 10}}));
  before = calls();
  for (int i = 0; i < 10; ++i) {
    KP_ASSERT_OK(rt.Launch("scratch", Grid{1, 1}, stream, kX, kOut, 32, 32, 32));
  }
  EXPECT_EQ(delta(before), (Calls{{"CtxGetId", 10},
                                  {"LaunchKernelEx", 10},
                                  {"StreamGetCaptureInfo", 10},
                                  {"StreamGetId", 10}}));
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

// CU_STREAM_PER_THREAD is one handle for a different stream on each thread: each thread
// gets its own arena, never one shared by concurrent launches.
TEST_F(RuntimeTest, EachThreadsPerThreadStreamGetsItsOwnArena) {
  Runtime rt = Open();
  CUcontext context = nullptr;
  ASSERT_EQ(d().CtxGetCurrent(&context), CUDA_SUCCESS);
  std::mutex mu;
  std::set<uint64_t> pointers;
  std::vector<std::thread> threads;
  std::latch launched(4);  // all alive at once: an exited thread's memory may be reused
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      ASSERT_EQ(d().CtxSetCurrent(context), CUDA_SUCCESS);
      for (int i = 0; i < 3; ++i) {
        ASSERT_TRUE(
            rt.Launch("scratch", Grid{2, 2}, CU_STREAM_PER_THREAD, kX, kOut, 64, 64, 64).ok());
        std::lock_guard<std::mutex> lock(mu);
        pointers.insert(At<uint64_t>(LastLaunch(), 32));
      }
      launched.arrive_and_wait();
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(pointers.size(), 4u) << "one arena per thread, reused by its launches";
  EXPECT_EQ(rt.stats().scratch_arenas, 0u) << "each freed as its thread exited";
  // Released per thread: the calling thread's.
  KP_ASSERT_OK(rt.Launch("scratch", Grid{2, 2}, CU_STREAM_PER_THREAD, kX, kOut, 64, 64, 64));
  EXPECT_EQ(rt.stats().scratch_arenas, 1u);
  KP_ASSERT_OK(rt.ReleaseScratch(CU_STREAM_PER_THREAD));
  EXPECT_EQ(rt.stats().scratch_arenas, 0u);
}

// Inside a capture a launch gets the arena reserved for the stream, owned by the graph
// through a user object; the stream's own arena stays the stream's.
TEST_F(RuntimeTest, CapturedScratchIsTheGraphsNotTheStreams) {
  Runtime rt = Open();
  CUstream stream = NewStream(), replay = NewStream();
  KP_ASSERT_OK(rt.Launch("scratch", Grid{2, 2}, stream, kX, kOut, 64, 64, 64));
  const uint64_t eager = At<uint64_t>(LastLaunch(), 32);
  KP_ASSERT_OK(rt.ReserveScratch(stream, 4096));
  const int64_t allocations = fake::CallCount("MemAlloc");
  ASSERT_EQ(d().StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  KP_ASSERT_OK(rt.Launch("scratch", Grid{2, 2}, stream, kX, kOut, 64, 64, 64));
  const uint64_t captured = At<uint64_t>(LastLaunch(), 32);
  KP_ASSERT_OK(rt.Launch("scratch", Grid{1, 1}, stream, kX, kOut, 32, 32, 32));
  EXPECT_EQ(At<uint64_t>(LastLaunch(), 32), captured) << "one arena per capture and stream";
  CUgraph graph = nullptr;
  ASSERT_EQ(d().StreamEndCapture(stream, &graph), CUDA_SUCCESS);
  EXPECT_EQ(fake::CallCount("MemAlloc"), allocations) << "nothing allocated while capturing";
  EXPECT_NE(captured, eager);
  EXPECT_EQ(fake::LiveUserObjects(), 1);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(d().GraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(d().GraphLaunch(exec, replay), CUDA_SUCCESS);
  EXPECT_EQ(At<uint64_t>(LastLaunch(), 32), captured) << "replayed with the graph's arena";
  KP_ASSERT_OK(rt.Launch("scratch", Grid{2, 2}, stream, kX, kOut, 64, 64, 64));
  EXPECT_EQ(At<uint64_t>(LastLaunch(), 32), eager) << "the stream keeps its own";
  ASSERT_EQ(d().GraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(rt.stats().scratch_in_graphs, 1u) << "the executable holds it";
  ASSERT_EQ(d().GraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(fake::LiveUserObjects(), 0);
  EXPECT_EQ(rt.stats().scratch_in_graphs, 0u);
  EXPECT_EQ(rt.stats().scratch_idle, 1u);
}

// During a capture nothing loads and nothing is allocated: refused with a precise status,
// and the capture goes on.
TEST_F(RuntimeTest, ACaptureIsNeverInvalidatedByLoadingOrAllocating) {
  Runtime rt = Open();
  CUstream stream = NewStream();
  ASSERT_EQ(d().StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  absl::Status s = rt.Launch("add", Grid{1}, stream, kX, kY, kOut, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("kernel 'add' variant 'default'"), HasSubstr("Preload")));
  CUstreamCaptureStatus status;
  ASSERT_EQ(d().StreamIsCapturing(stream, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph graph = nullptr;
  ASSERT_EQ(d().StreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_EQ(d().GraphDestroy(graph), CUDA_SUCCESS);
  KP_ASSERT_OK(rt.Preload());
  ASSERT_EQ(d().StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  s = rt.Launch("scratch", Grid{3, 2}, stream, kX, kOut, 96, 64, 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(s),
              AllOf(HasSubstr("kernel 'scratch'"), HasSubstr("ReserveScratch(stream, 768)")));
  EXPECT_EQ(rt.ReserveScratch(stream, 768).code(), absl::StatusCode::kFailedPrecondition)
      << "not during the capture";
  EXPECT_EQ(rt.ReleaseScratch(stream).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(d().StreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_EQ(d().GraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(fake::CallCount("LibraryLoadData"), 7) << "all by Preload";
}

// Loading off the capturing stream -- Preload, or a launch on another stream loading
// lazily -- while this thread captures in any mode: RELAXED for the load, so the driver
// neither refuses it nor invalidates the capture, and the thread's mode is restored.
TEST_F(RuntimeTest, LoadingOffTheCapturingStreamLeavesTheCaptureValid) {
  for (const CUstreamCaptureMode mode :
       {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL}) {
    SCOPED_TRACE(mode);
    const int loads = fake::CallCount("LibraryLoadData");
    Runtime rt = Open();
    CUstream capturing = NewStream(), other = NewStream();
    ASSERT_EQ(d().StreamBeginCapture(capturing, mode), CUDA_SUCCESS);
    KP_ASSERT_OK(rt.Launch("add", Grid{1}, other, kX, kY, kOut, 1));  // loads 'add'
    KP_ASSERT_OK(rt.Preload());                                       // loads the rest
    EXPECT_EQ(fake::CallCount("LibraryLoadData") - loads, 7);
    EXPECT_EQ(fake::CaptureStatus(capturing), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CUstreamCaptureMode now = CU_STREAM_CAPTURE_MODE_GLOBAL;
    ASSERT_EQ(d().ThreadExchangeStreamCaptureMode(&now), CUDA_SUCCESS);
    EXPECT_EQ(now, CU_STREAM_CAPTURE_MODE_GLOBAL) << "the thread's mode is back";
    KP_ASSERT_OK(rt.Launch("add", Grid{1}, capturing, kX, kY, kOut, 1));  // loaded: captured
    CUgraph graph = nullptr;
    ASSERT_EQ(d().StreamEndCapture(capturing, &graph), CUDA_SUCCESS);
    ASSERT_EQ(d().GraphDestroy(graph), CUDA_SUCCESS);
  }
}

TEST_F(RuntimeTest, ReleaseScratchFreesAStreamsArenaAndItsSlotServesAgain) {
  Runtime rt = Open();
  CUstream stream = NewStream();
  KP_ASSERT_OK(rt.Launch("scratch", Grid{2, 2}, stream, kX, kOut, 64, 64, 64));
  KP_ASSERT_OK(rt.Launch("scratch", Grid{40, 40}, stream, kX, kOut, 1280, 1280, 1280));  // grows
  KP_ASSERT_OK(rt.ReserveScratch(stream, 8192));
  EXPECT_EQ(fake::LiveAllocations(), 3) << "the grown arena, the old one, the reservation";
  KP_ASSERT_OK(rt.ReleaseScratch(stream));
  EXPECT_EQ(fake::LiveAllocations(), 0);
  EXPECT_EQ(rt.stats().scratch_arenas, 0u);
  EXPECT_EQ(rt.stats().scratch_bytes, 0u);
  KP_ASSERT_OK(rt.ReleaseScratch(stream));  // nothing left: fine
  KP_ASSERT_OK(rt.Launch("scratch", Grid{2, 2}, stream, kX, kOut, 64, 64, 64));
  EXPECT_EQ(rt.stats().scratch_arenas, 1u);
}

// A stream destroyed without ReleaseScratch and a new one at its address: the new one
// gets a new arena (by stream id), and the destroyed one's is freed then.
TEST_F(RuntimeTest, AStreamAtADestroyedOnesAddressFreesTheOldArena) {
  fake::SetHandleReuse(true);
  Runtime rt = Open();
  CUstream first = NewStream();
  KP_ASSERT_OK(rt.Launch("scratch", Grid{2, 2}, first, kX, kOut, 64, 64, 64));
  ASSERT_EQ(d().StreamDestroy(first), CUDA_SUCCESS);
  for (int i = 0; i < 2000; ++i) {  // past the 1024 streams the table once held for good
    CUstream next = NewStream();
    ASSERT_EQ(next, first);
    KP_ASSERT_OK(rt.Launch("scratch", Grid{2, 2}, next, kX, kOut, 64, 64, 64));
    ASSERT_EQ(d().StreamDestroy(next), CUDA_SUCCESS);
  }
  EXPECT_EQ(fake::LiveAllocations(), 1);
  EXPECT_EQ(rt.stats().scratch_arenas, 1u);
}

// Streams that live at once are not capped (the arena table once held 1024 streams for
// good); releasing one's arena frees its memory and its slot.
TEST_F(RuntimeTest, MoreThan1024StreamsWithScratchAtOnce) {
  Runtime rt = Open();
  std::vector<CUstream> streams;
  for (int i = 0; i < 1100; ++i) {
    streams.push_back(NewStream());
    KP_ASSERT_OK(rt.Launch("scratch", Grid{1, 1}, streams.back(), kX, kOut, 32, 32, 32));
  }
  EXPECT_EQ(rt.stats().scratch_arenas, 1100u);
  for (int i = 0; i < 1100; i += 2) KP_ASSERT_OK(rt.ReleaseScratch(streams[i]));
  EXPECT_EQ(rt.stats().scratch_arenas, 550u);
  EXPECT_EQ(fake::LiveAllocations(), 550);
  for (CUstream s : streams) ASSERT_EQ(d().StreamDestroy(s), CUDA_SUCCESS);
}

// Scratch sizes are products of grid, num_ctas and per-program sizes: checked, so that a
// huge grid is an error and never a short buffer.
TEST_F(RuntimeTest, ScratchSizesThatOverflowAreErrors) {
  Runtime rt = Open();
  absl::Status s =
      rt.Launch("scratch", Grid{(1u << 31) - 1, 65535, 65535}, nullptr, kX, kOut, 1, 1, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("kernel 'scratch'"), HasSubstr("overflows")));
  EXPECT_EQ(fake::CallCount("MemAlloc"), 0);
  // 2^31 * 2^31 * 4 programs is 2^64: not an empty grid.
  s = rt.Launch("add", Grid{1u << 31, 1u << 31, 4}, nullptr, kX, kY, kOut, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
}

// The driver's grid limits (2^31-1 blocks along x, grid x times num_ctas; 65535 along y
// and z) are checked before anything is sent, with a message that names them.
TEST_F(RuntimeTest, GridsPastTheDriversLimitsAreErrors) {
  Runtime rt = Open();
  for (const Grid grid : {Grid{1, 65536, 1}, Grid{1, 1, 65536}, Grid{1u << 31, 1, 1}}) {
    absl::Status s = rt.Launch("add", grid, nullptr, kX, kY, kOut, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(Msg(s), AllOf(HasSubstr("kernel 'add'"), HasSubstr("2^31-1 blocks along x"),
                              HasSubstr("65535 along y and z")));
  }
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
  KP_ASSERT_OK(rt.Launch("add", Grid{1, 65535, 65535}, nullptr, kX, kY, kOut, 1));
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 1);
}

// A scratch size near 2^64 is refused before anything is allocated: rounded up to the
// arenas' alignment it would wrap to a short arena.
TEST_F(RuntimeTest, ScratchArenasNearTwoToThe64AreErrors) {
  Runtime rt = Open();
  CUstream stream = NewStream();
  const absl::Status s = rt.ReserveScratch(stream, std::numeric_limits<size_t>::max());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(Msg(s), HasSubstr("its size, aligned, does not fit 64 bits"));
  EXPECT_EQ(fake::CallCount("MemAlloc"), 0);
  EXPECT_EQ(rt.stats().scratch_arenas, 0u);
  EXPECT_EQ(rt.stats().scratch_reserved, 0u);
  ASSERT_EQ(d().StreamDestroy(stream), CUDA_SUCCESS);
}

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
  CUcontext context = nullptr;
  ASSERT_EQ(d().CtxGetCurrent(&context), CUDA_SUCCESS);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (d().CtxSetCurrent(context) != CUDA_SUCCESS) failures.fetch_add(1);
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

// The launch counters stay exact with more threads than shards (threads sharing a shard
// count into it at once): every launch is counted once.
TEST_F(RuntimeTest, LaunchCountsAreExactWithMoreThreadsThanShards) {
  Runtime rt = Open();
  Kernel add = *rt.Find("add");
  constexpr int kThreads = 40, kLaunches = 250;
  CUcontext context = nullptr;
  ASSERT_EQ(d().CtxGetCurrent(&context), CUDA_SUCCESS);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (d().CtxSetCurrent(context) != CUDA_SUCCESS) failures.fetch_add(1);
      for (int i = 0; i < kLaunches; ++i) {
        failures.fetch_add(add.Launch(Grid{1}, nullptr, kX, kY, kOut, t + i).ok() ? 0 : 1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  uint64_t launches = 0;
  for (const auto& v : add.variant_stats()) launches += v.launches;
  EXPECT_EQ(launches, uint64_t{kThreads * kLaunches});
}

}  // namespace
}  // namespace kpack
