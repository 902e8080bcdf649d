// Dispatch through the runtime, on the committed dispatch pack (kernels/dispatchpack:
// axpy with 3 buckets x {generic, div16, div16 + stride_x == 1} and an i64 variant; see
// tools/README.md), against the recording fake driver: which variant launches, what
// bytes reach the driver, the grid from the grid expressions, counters, BoundLaunch.

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fake_driver.h"
#include "fake_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"

namespace kpack {
namespace {

using ::kpack::testing::At;
using ::kpack::testing::LastLaunch;
using ::kpack::testing::OpenFake;
using ::kpack::testing::TempPack;
using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kPack = KPACK_DISPATCH_PACK_DIR;
const CUdeviceptr kX = 0x100000, kY = 0x200000, kOut = 0x300000;
using Names = std::vector<std::string>;

class DispatchRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ResetFake();
    auto rt = OpenFake(kPack);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = std::make_unique<Runtime>(std::move(*rt));
    axpy_ = *rt_->Find("axpy");
  }
  void TearDown() override {
    rt_.reset();
    fake::Reset();
  }
  std::string Selected(CUdeviceptr x, int64_t n, int64_t stride) {
    const Arg args[] = {Arg(x), Arg(kY), Arg(kOut), Arg(n), Arg(stride), Arg(2.0f)};
    auto name = axpy_.SelectVariant(args);
    return name.ok() ? std::string(*name) : name.status().ToString();
  }
  uint64_t Launches(const std::string& variant, bool fallbacks = false) {
    for (const auto& s : axpy_.variant_stats()) {
      if (s.variant == variant) return fallbacks ? s.fallback_launches : s.launches;
    }
    return ~uint64_t{0};
  }
  std::unique_ptr<Runtime> rt_;
  Kernel axpy_;
};

TEST_F(DispatchRuntimeTest, EachBucketLaunchesItsOwnConfigWithTheGridExpression) {
  struct Case {
    int64_t n;
    const char* variant;
    unsigned block;
    unsigned grid;
  } cases[] = {
      {16, "b0_div16_unit", 64, 1},       {4096, "b0_div16_unit", 64, 16},
      {4112, "b1_div16_unit", 128, 5},    {262144, "b1_div16_unit", 128, 256},
      {262160, "b2_div16_unit", 256, 65}, {1 << 24, "b2_div16_unit", 256, 4096},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Selected(kX, c.n, 1), c.variant) << c.n;
    KP_ASSERT_OK(axpy_.Launch(nullptr, kX, kY, kOut, c.n, 1, 2.0f));
    fake::LaunchRecord r = LastLaunch();
    EXPECT_EQ(r.block[0], c.block) << c.n;
    EXPECT_EQ(r.grid[0], c.grid) << "cdiv(n, BLOCK) with the chosen variant's BLOCK, n=" << c.n;
  }
  EXPECT_EQ(Launches("b0_div16_unit"), 2u);
  EXPECT_EQ(Launches("b1_div16_unit"), 2u);
  EXPECT_EQ(Launches("b2_div16_unit"), 2u);
  // An explicit grid overrides the expressions.
  KP_ASSERT_OK(axpy_.Launch(Grid{7}, nullptr, kX, kY, kOut, 16, 1, 2.0f));
  EXPECT_EQ(LastLaunch().grid[0], 7u);
}

// A BoundLaunch without a grid evaluates its expressions once per change of its
// arguments (BoundState::evaluated_version): each launch after a Set, a repack into
// another variant, a grid that fails to evaluate (refused at every launch until a Set
// mends it) and set_grid gets the grid of the arguments as they are.
TEST_F(DispatchRuntimeTest, BoundGridFollowsEverySet) {
  const Arg args[] = {Arg(kX), Arg(kY), Arg(kOut), Arg(4096), Arg(1), Arg(2.0f)};
  absl::StatusOr<BoundLaunch> bound = axpy_.Bind(nullptr, args);
  ASSERT_TRUE(bound.ok()) << bound.status();
  auto grid_x = [&]() -> int64_t {
    absl::Status s = bound->Launch();
    if (!s.ok()) return -1;
    return LastLaunch().grid[0];
  };
  EXPECT_EQ(grid_x(), 16) << "cdiv(4096, 256)";
  EXPECT_EQ(grid_x(), 16);
  KP_ASSERT_OK(bound->Set(3, 3840));
  EXPECT_EQ(grid_x(), 15) << "the same variant, a new n";
  absl::StatusOr<PreparedLaunch> prepared = bound->Prepare();
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->config.gridDimX, 15u);
  KP_ASSERT_OK(bound->Set(3, 262144));
  EXPECT_EQ(grid_x(), 256) << "another bucket: cdiv(262144, 1024)";
  KP_ASSERT_OK(bound->Set(3, -4096));  // packs, but cdiv(-4096, 256) < 0
  absl::Status refused = bound->Launch();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("grid[0]"));
  EXPECT_FALSE(bound->Launch().ok()) << "refused again, not remembered as a grid";
  EXPECT_FALSE(bound->Prepare().ok());
  KP_ASSERT_OK(bound->Set(3, 512));
  EXPECT_EQ(grid_x(), 2);
  bound->set_grid(Grid{9});
  EXPECT_EQ(grid_x(), 9) << "an explicit grid overrides the expressions";
}

TEST_F(DispatchRuntimeTest, Eq1ArgumentIsDroppedFromTheBuffer) {
  KP_ASSERT_OK(axpy_.Launch(nullptr, kX, kY, kOut, 4096, 1, 0.5f));
  fake::LaunchRecord unit = LastLaunch();
  EXPECT_EQ(unit.param_size, 48u) << "stride_x compiled away";
  EXPECT_EQ(At<int32_t>(unit, 24), 4096);
  EXPECT_EQ(At<float>(unit, 28), 0.5f) << "alpha moves up into stride_x's place";
  EXPECT_EQ(At<uint64_t>(unit, 32), 0u);

  KP_ASSERT_OK(axpy_.Launch(nullptr, kX, kY, kOut, 4096, 3, 0.5f));
  fake::LaunchRecord strided = LastLaunch();
  EXPECT_EQ(Selected(kX, 4096, 3), "b0_div16");
  EXPECT_EQ(strided.param_size, 56u);
  EXPECT_EQ(At<int32_t>(strided, 28), 3);
  EXPECT_EQ(At<float>(strided, 32), 0.5f);
}

TEST_F(DispatchRuntimeTest, MisalignmentFallsBackToGenericAndIsCounted) {
  for (int i = 0; i < 5; ++i) KP_ASSERT_OK(axpy_.Launch(nullptr, kX + 4, kY, kOut, 1000, 1, 1.0f));
  KP_ASSERT_OK(axpy_.Launch(nullptr, kX, kY, kOut, 1001, 1, 1.0f));  // n not divisible
  KP_ASSERT_OK(axpy_.Launch(nullptr, kX, kY, kOut, 1008, 1, 1.0f));
  EXPECT_EQ(Selected(kX + 4, 1000, 1), "b0_generic");
  EXPECT_EQ(Launches("b0_generic"), 6u);
  EXPECT_EQ(Launches("b0_generic", true), 6u) << "each was a fallback";
  EXPECT_EQ(Launches("b0_div16_unit"), 1u);
  EXPECT_EQ(Launches("b0_div16_unit", true), 0u);
}

// A launch the driver refuses is not counted, neither as a launch nor as a fallback.
TEST_F(DispatchRuntimeTest, ALaunchTheDriverRefusesIsNotCounted) {
  KP_ASSERT_OK(axpy_.Launch(nullptr, kX + 4, kY, kOut, 1000, 1, 1.0f));
  fake::FailNext("LaunchKernelEx", CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
  EXPECT_FALSE(axpy_.Launch(nullptr, kX + 4, kY, kOut, 1000, 1, 1.0f).ok());
  KP_ASSERT_OK(axpy_.Launch(nullptr, kX + 4, kY, kOut, 1000, 1, 1.0f));
  EXPECT_EQ(Launches("b0_generic"), 2u);
  EXPECT_EQ(Launches("b0_generic", true), 2u);
}

// Kernel::Restrict: a view that launches only some variants. Ignoring buckets, the b1
// configuration (BLOCK 1024, 4 warps) serves every n, still specialized per call.
TEST_F(DispatchRuntimeTest, RestrictedToOneConfigurationIgnoringBuckets) {
  const Names b1 = {"b1_generic", "b1_div16", "b1_div16_unit"};
  absl::StatusOr<Kernel> view = axpy_.Restrict(b1, /*ignore_buckets=*/true);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->name(), "axpy");
  EXPECT_TRUE(view->info().buckets.empty());
  ASSERT_EQ(view->info().variants.size(), 3u);
  EXPECT_EQ(view->info().variants[0].name, "b1_generic");
  EXPECT_TRUE(view->info().variants[0].bucket.empty());
  EXPECT_EQ(axpy_.info().variants.size(), 10u) << "the kernel itself is unchanged";
  struct Case {
    CUdeviceptr x;
    int64_t n, stride;
    const char* variant;
  } cases[] = {{kX, 16, 1, "b1_div16_unit"}, {kX, 1 << 20, 1, "b1_div16_unit"},
               {kX, 1 << 20, 3, "b1_div16"},  {kX + 4, 16, 1, "b1_generic"}};
  for (const Case& c : cases) {
    const Arg args[] = {Arg(c.x), Arg(kY), Arg(kOut), Arg(c.n), Arg(c.stride), Arg(2.0f)};
    absl::StatusOr<std::string_view> chosen = view->SelectVariant(args);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    EXPECT_EQ(*chosen, c.variant) << c.n;
    KP_ASSERT_OK(view->Launch(nullptr, c.x, kY, kOut, c.n, c.stride, 2.0f));
    fake::LaunchRecord r = LastLaunch();
    EXPECT_EQ(r.block[0], 128u) << "4 warps, whatever the bucket of n = " << c.n;
    EXPECT_EQ(r.grid[0], static_cast<unsigned>((c.n + 1023) / 1024)) << "BLOCK 1024";
  }
  // The variants' counters, seen through both handles; the fallback counted too.
  EXPECT_EQ(Launches("b1_div16_unit"), 2u);
  EXPECT_EQ(Launches("b1_generic", true), 1u);
  for (const Kernel::VariantStats& s : view->variant_stats()) {
    if (s.variant == "b1_div16_unit") EXPECT_EQ(s.launches, 2u);
  }
  // A bound launch of the view re-selects within the view.
  const Arg args[] = {Arg(kX), Arg(kY), Arg(kOut), Arg(int64_t{16}), Arg(1), Arg(2.0f)};
  absl::StatusOr<BoundLaunch> bound = view->Bind(nullptr, args);
  ASSERT_TRUE(bound.ok()) << bound.status();
  KP_ASSERT_OK(bound->Set(4, Arg(5)));
  KP_ASSERT_OK(bound->Launch());
  EXPECT_EQ(Launches("b1_div16"), 2u);
  // The same request gets the same view: nothing is rebuilt per call.
  absl::StatusOr<Kernel> again = axpy_.Restrict(Names{"b1_div16_unit", "b1_generic", "b1_div16"}, true);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(&again->info(), &view->info());
}

TEST_F(DispatchRuntimeTest, RestrictedKeepingBucketsAndItsErrors) {
  // Keeping buckets, the named variants must serve every bucket.
  absl::StatusOr<Kernel> generic =
      axpy_.Restrict(Names{"b0_generic", "b1_generic", "b2_generic"}, /*ignore_buckets=*/false);
  ASSERT_TRUE(generic.ok()) << generic.status();
  EXPECT_EQ(generic->info().buckets.size(), 1u);
  EXPECT_EQ(Selected(kX, 16, 1), "b0_div16_unit");
  const Arg args[] = {Arg(kX), Arg(kY), Arg(kOut), Arg(int64_t{5000}), Arg(1), Arg(2.0f)};
  EXPECT_EQ(*generic->SelectVariant(args), "b1_generic");
  absl::StatusOr<Kernel> b0 = axpy_.Restrict(Names{"b0_generic"});
  EXPECT_EQ(b0.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(b0.status().message()),
              AllOf(HasSubstr("kernel 'axpy' restricted to b0_generic"),
                    HasSubstr("no variant serves bucket 1")));
  // b0_generic alone takes no n past i32: a launch no variant of the view takes fails.
  absl::StatusOr<Kernel> one = axpy_.Restrict(Names{"b0_generic"}, true);
  ASSERT_TRUE(one.ok()) << one.status();
  const int64_t big = int64_t{1} << 33;
  absl::Status s = one->Launch(nullptr, kX, kY, kOut, big, 1, 2.0f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'n'"));

  absl::StatusOr<Kernel> unknown = axpy_.Restrict(Names{"b0_generic", "nosuch"});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              AllOf(HasSubstr("kernel 'axpy' has no variant 'nosuch'"),
                    HasSubstr("b2_generic_i64")));
  absl::StatusOr<Kernel> twice = axpy_.Restrict(Names{"b0_generic", "b0_generic"}, true);
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("listed twice"));
  absl::StatusOr<Kernel> none = axpy_.Restrict(Names{}, true);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  // Every variant, keeping buckets: the kernel itself.
  std::vector<std::string> all;
  for (const VariantInfo& v : axpy_.info().variants) all.push_back(v.name);
  absl::StatusOr<Kernel> same = axpy_.Restrict(all);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(&same->info(), &axpy_.info());
  EXPECT_EQ(Kernel().Restrict(all).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Views are made under the runtime's lock: threads asking for the same view at once get
// one view, and launch through it while others make theirs (TSan runs this).
TEST_F(DispatchRuntimeTest, RestrictFromManyThreads) {
  constexpr int kThreads = 8;
  const Names configs[3] = {{"b0_generic", "b0_div16", "b0_div16_unit"},
                            {"b1_generic", "b1_div16", "b1_div16_unit"},
                            {"b2_generic", "b2_div16", "b2_div16_unit"}};
  std::vector<const KernelInfo*> seen(kThreads, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      testing::UsePrimaryContext();
      for (int i = 0; i < 20; ++i) {
        absl::StatusOr<Kernel> view = axpy_.Restrict(configs[(t + i) % 3], true);
        if (!view.ok()) return;
        if ((t + i) % 3 == 0) seen[t] = &view->info();
        if (!view->Launch(nullptr, kX, kY, kOut, int64_t{4096}, 1, 1.0f).ok()) return;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_NE(seen[t], nullptr) << "thread " << t << " failed";
    EXPECT_EQ(seen[t], seen[0]) << "one view per request";
  }
  EXPECT_EQ(Launches("b0_div16_unit") + Launches("b1_div16_unit") + Launches("b2_div16_unit"),
            uint64_t{kThreads} * 20);
}

TEST_F(DispatchRuntimeTest, LargeNGoesToTheI64Variant) {
  const int64_t n = (int64_t{1} << 33) + 16;
  EXPECT_EQ(Selected(kX, n, 1), "b2_generic_i64");
  KP_ASSERT_OK(axpy_.Launch(nullptr, kX, kY, kOut, n, 1, 1.0f));
  fake::LaunchRecord r = LastLaunch();
  EXPECT_EQ(At<int64_t>(r, 24), n) << "all 8 bytes";
  EXPECT_EQ(At<int32_t>(r, 32), 1) << "stride_x after the 8-byte n";
  EXPECT_EQ(r.grid[0], static_cast<unsigned>((n + 4095) / 4096));
  EXPECT_EQ(Launches("b2_generic_i64", true), 1u) << "the div16 variants did not fit";
}

TEST_F(DispatchRuntimeTest, BoundLaunchSelectsAgainWhenADispatchArgumentChanges) {
  auto bound = axpy_.BindArgs(nullptr, kX, kY, kOut, 96, 1, 2.0f);
  ASSERT_TRUE(bound.ok()) << bound.status();
  KP_ASSERT_OK(bound->Launch());
  EXPECT_EQ(LastLaunch().block[0], 64u);
  EXPECT_EQ(LastLaunch().param_size, 48u);

  KP_ASSERT_OK(bound->Set(3, 5008));  // into bucket 1
  KP_ASSERT_OK(bound->Launch());
  EXPECT_EQ(LastLaunch().block[0], 128u);
  EXPECT_EQ(LastLaunch().grid[0], 5u);
  EXPECT_EQ(At<int32_t>(LastLaunch(), 24), 5008);

  KP_ASSERT_OK(bound->Set(4, 2));  // stride 2: the variant that keeps stride_x
  KP_ASSERT_OK(bound->Launch());
  EXPECT_EQ(LastLaunch().param_size, 56u);
  EXPECT_EQ(At<int32_t>(LastLaunch(), 28), 2);
  EXPECT_EQ(At<float>(LastLaunch(), 32), 2.0f);

  KP_ASSERT_OK(bound->Set(0, kX + 8));  // misaligned: generic
  KP_ASSERT_OK(bound->Launch());
  EXPECT_EQ(At<uint64_t>(LastLaunch(), 0), kX + 8);
  EXPECT_EQ(Launches("b1_generic"), 1u);
  EXPECT_EQ(Launches("b1_generic", true), 1u);

  KP_ASSERT_OK(bound->Set(5, 3.0));  // alpha: no dispatch, just the slot
  KP_ASSERT_OK(bound->Launch());
  EXPECT_EQ(At<float>(LastLaunch(), 32), 3.0f);
  EXPECT_EQ(Launches("b1_generic"), 2u);
}

// BoundLaunch::snapshot(): the public view of what a BoundLaunch holds (the CLI and
// StepGraph used to read it through internal access classes), following every Set.
TEST_F(DispatchRuntimeTest, ASnapshotShowsTheVariantGridAndBytesABoundLaunchHolds) {
  auto bound = axpy_.BindArgs(nullptr, kX, kY, kOut, 96, 1, 2.0f);
  ASSERT_TRUE(bound.ok()) << bound.status();
  BoundLaunchSnapshot snap = bound->snapshot();
  EXPECT_EQ(snap.kernel.name(), "axpy");
  ASSERT_NE(snap.variant, nullptr);
  EXPECT_EQ(snap.variant->name, "b0_div16_unit");
  EXPECT_EQ(snap.variant, &axpy_.info().variants[2]) << "one of the kernel's descriptions";
  EXPECT_FALSE(snap.fallback);
  EXPECT_FALSE(snap.grid.has_value()) << "the grid expressions, at each launch";
  EXPECT_EQ(snap.stream, nullptr);
  ASSERT_EQ(snap.args.size(), 6u);
  EXPECT_EQ(snap.args[3].bits(), 96u);
  ASSERT_EQ(snap.params.size(), snap.variant->param_bytes);
  auto at = [&](size_t offset, auto value) {
    std::memcpy(&value, snap.params.data() + offset, sizeof(value));
    return value;
  };
  EXPECT_EQ(at(0, uint64_t{0}), kX);
  EXPECT_EQ(at(24, int32_t{0}), 96);

  // A Set that changes the bucket, then one that breaks an assumption: the snapshot
  // follows, and its bytes are what Launch sends.
  KP_ASSERT_OK(bound->Set(3, 5008));
  KP_ASSERT_OK(bound->Set(0, kX + 8));
  snap = bound->snapshot();
  EXPECT_EQ(snap.variant->name, "b1_generic");
  EXPECT_TRUE(snap.fallback) << "a div16 variant of the bucket exists";
  EXPECT_EQ(at(0, uint64_t{0}), kX + 8);
  bound->set_grid(Grid{7, 1, 1});
  bound->set_stream(reinterpret_cast<CUstream>(0x1234));
  snap = bound->snapshot();
  ASSERT_TRUE(snap.grid.has_value());
  EXPECT_EQ(snap.grid->x, 7u);
  EXPECT_EQ(snap.stream, reinterpret_cast<CUstream>(0x1234));
  bound->set_stream(nullptr);
  KP_ASSERT_OK(bound->Launch());
  snap = bound->snapshot();
  ASSERT_EQ(LastLaunch().param_size, snap.params.size());
  EXPECT_EQ(std::memcmp(LastLaunch().params.data(), snap.params.data(), snap.params.size()), 0);
  // Moving the BoundLaunch keeps the views valid.
  BoundLaunch moved = *std::move(bound);
  EXPECT_EQ(moved.snapshot().params.data(), snap.params.data());
  EXPECT_EQ(moved.snapshot().variant, snap.variant);
}

TEST_F(DispatchRuntimeTest, NoValidVariantLaunchesNothing) {
  TempPack pack(kPack);
  auto& variants = pack.kernel("axpy")["variants"];
  for (size_t i = variants.size(); i-- > 0;) {
    if (variants[i]["name"] == "b0_generic") variants.erase(i);
  }
  pack.Save();
  auto rt = OpenFake(pack.dir());
  ASSERT_TRUE(rt.ok()) << rt.status();
  absl::Status s = rt->Launch("axpy", nullptr, kX + 4, kY, kOut, 96, 1, 1.0f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("kernel 'axpy'"), HasSubstr("n=96"),
                    HasSubstr("x_ptr divisible by 16"), HasSubstr("x_ptr=0x100004")));
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
}

// A bucket no variant serves would fail every call that lands there: the pack is refused
// at Open, naming the kernel and the bucket's range, and nothing is loaded.
TEST_F(DispatchRuntimeTest, BucketWithoutVariantIsRefusedAtOpen) {
  TempPack pack(kPack);
  auto& variants = pack.kernel("axpy")["variants"];
  for (size_t i = variants.size(); i-- > 0;) {
    if (variants[i]["bucket"] == nlohmann::json::array({1})) variants.erase(i);
  }
  pack.Save();
  fake::Reset();
  auto rt = OpenFake(pack.dir());
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(rt.status().message()),
              AllOf(HasSubstr("manifest.json: kernel 'axpy'"),
                    HasSubstr("no variant serves bucket 1 (4097 <= n <= 262144)")));
  EXPECT_EQ(fake::CallCount("LibraryLoadData"), 0);
}

TEST_F(DispatchRuntimeTest, GridExpressionErrors) {
  auto rt = OpenFake(KPACK_TEST_PACK_DIR);
  ASSERT_TRUE(rt.ok());
  absl::Status s = rt->Launch("add", nullptr, kX, kY, kOut, 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no grid expression"));

  for (auto [expr, mentions] : {std::pair{"cdiv(n, BLOK)", "unknown name 'BLOK'"},
                                std::pair{"n / (BLOCK - BLOCK)", "division by zero"},
                                std::pair{"alpha + 1", "'alpha' is a fp32 parameter"},
                                std::pair{"cdiv(n, ", "expected a number"}}) {
    TempPack pack;
    pack.kernel("add")["grid"] = {expr};
    pack.kernel("add")["params"][4]["name"] = "BLOCK";
    pack.Save();
    auto bad = OpenFake(pack.dir());
    ASSERT_FALSE(bad.ok()) << expr;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        std::string(bad.status().message()),
        AllOf(HasSubstr("kernel 'add'"), HasSubstr("variant 'default'"), HasSubstr("'grid[0]'")))
        << expr;
    if (std::string(expr) != "alpha + 1") {
      EXPECT_THAT(std::string(bad.status().message()), HasSubstr(mentions)) << expr;
    }
  }

  TempPack pack;
  pack.kernel("add")["grid"] = {"n * 1048576"};
  pack.Save();
  auto big = OpenFake(pack.dir());
  ASSERT_TRUE(big.ok()) << big.status();
  KP_ASSERT_OK(big->Launch("add", nullptr, kX, kY, kOut, 2));
  EXPECT_EQ(LastLaunch().grid[0], 2u * 1048576);
  s = big->Launch("add", nullptr, kX, kY, kOut, 1 << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("outside [0, 2^32)"));
}

}  // namespace
}  // namespace kpack
