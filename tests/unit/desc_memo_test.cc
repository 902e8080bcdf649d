// The memo of encoded CUtensorMaps per TMA descriptor parameter (DescMemo,
// src/launch/tensordesc.h): on its own (every key field, eviction, concurrent readers
// and writers) and in the runtime, observed through the recording fake driver's
// cuTensorMapEncodeTiled (a hit calls no encoder and launches the bytes a fresh encode
// writes; a refused or failed encode is not kept; Bind and Set share it).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "fake_driver.h"
#include "fake_runtime.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "launch/tensordesc.h"

namespace kpack {
namespace {

using internal::DescMemo;
using ::kpack::testing::LastLaunch;
using ::kpack::testing::OpenFake;

TensorDesc Desc(CUdeviceptr base) { return TensorDesc::RowMajor(base, {100, 200}); }

// A map that is a function of every field of its descriptor (what a Find must return).
struct alignas(64) Map {
  std::byte bytes[128];
};
Map MapOf(const TensorDesc& d) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(d.base);
  mix(static_cast<uint64_t>(d.rank));
  for (int i = 0; i < TensorDesc::kMaxRank; ++i) {
    mix(static_cast<uint64_t>(d.shape[i]));
    mix(static_cast<uint64_t>(d.strides[i]));
  }
  mix(static_cast<uint64_t>(d.padding));
  Map m;
  for (int w = 0; w < 16; ++w) {
    mix(static_cast<uint64_t>(w));
    std::memcpy(m.bytes + 8 * w, &h, 8);
  }
  return m;
}

bool Holds(const DescMemo& memo, const TensorDesc& d) {
  Map out;
  if (!memo.Find(d, out.bytes)) return false;
  const Map want = MapOf(d);
  EXPECT_EQ(std::memcmp(out.bytes, want.bytes, 128), 0) << "a hit returns the key's own map";
  return true;
}

TEST(DescMemoTest, FindsWhatWasInserted) {
  auto memo = std::make_unique<DescMemo>();
  const TensorDesc d = Desc(0x10000);
  EXPECT_FALSE(Holds(*memo, d)) << "empty";
  memo->Insert(d, MapOf(d).bytes);
  EXPECT_TRUE(Holds(*memo, d));
  // A zero descriptor is no entry that was never written.
  EXPECT_FALSE(Holds(*memo, TensorDesc{}));
}

// Every field of the descriptor is part of the key, entries past the rank included:
// changing any one of them alone is a miss.
TEST(DescMemoTest, AnyChangedFieldIsAMiss) {
  const TensorDesc base = Desc(0x10000);
  struct Change {
    const char* name;
    void (*apply)(TensorDesc&);
  };
  const Change changes[] = {
      {"base", [](TensorDesc& d) { d.base += 16; }},
      {"base, high half", [](TensorDesc& d) { d.base += uint64_t{1} << 40; }},
      {"rank", [](TensorDesc& d) { d.rank = 3; }},
      {"shape[0]", [](TensorDesc& d) { d.shape[0] = 99; }},
      {"shape[1]", [](TensorDesc& d) { d.shape[1] = 192; }},
      {"shape[1], high half", [](TensorDesc& d) { d.shape[1] += int64_t{1} << 33; }},
      {"shape[4] (past the rank)", [](TensorDesc& d) { d.shape[4] = 1; }},
      {"strides[0]", [](TensorDesc& d) { d.strides[0] = 256; }},
      {"strides[1]", [](TensorDesc& d) { d.strides[1] = 2; }},
      {"strides[4] (past the rank)", [](TensorDesc& d) { d.strides[4] = 1; }},
      {"padding", [](TensorDesc& d) { d.padding = TensorDescPadding::kNan; }},
  };
  for (const Change& c : changes) {
    auto memo = std::make_unique<DescMemo>();
    memo->Insert(base, MapOf(base).bytes);
    TensorDesc changed = base;
    c.apply(changed);
    EXPECT_FALSE(Holds(*memo, changed)) << c.name;
    EXPECT_TRUE(Holds(*memo, base)) << c.name;
  }
}

// First in, first out over kWays entries: the (kWays + 1)-th distinct map evicts the first.
TEST(DescMemoTest, EvictsTheOldestPastItsCapacity) {
  auto memo = std::make_unique<DescMemo>();
  constexpr int n = DescMemo::kWays;
  for (int i = 0; i < n; ++i) memo->Insert(Desc(0x10000 * (i + 1)), MapOf(Desc(0x10000 * (i + 1))).bytes);
  for (int i = 0; i < n; ++i) EXPECT_TRUE(Holds(*memo, Desc(0x10000 * (i + 1)))) << i;
  const TensorDesc extra = Desc(0x10000 * (n + 1));
  memo->Insert(extra, MapOf(extra).bytes);
  EXPECT_TRUE(Holds(*memo, extra));
  EXPECT_FALSE(Holds(*memo, Desc(0x10000))) << "the oldest went";
  for (int i = 1; i < n; ++i) EXPECT_TRUE(Holds(*memo, Desc(0x10000 * (i + 1)))) << i;
}

// Threads finding and inserting over the same entries (more keys than entries, so
// writers keep replacing what readers read): every hit is exactly its key's map, never a
// torn one or another key's. tools/test.sh runs it under ThreadSanitizer too.
TEST(DescMemoTest, ConcurrentFindsAndInsertsNeverReturnAnotherMap) {
  auto memo = std::make_unique<DescMemo>();
  constexpr int kThreads = 4, kKeys = DescMemo::kWays + 2, kRounds = 20000;
  std::atomic<int64_t> hits{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const TensorDesc d = Desc(0x10000 * (1 + (i * 7 + t) % kKeys));
        const Map want = MapOf(d);
        Map out;
        if (memo->Find(d, out.bytes)) {
          hits.fetch_add(1, std::memory_order_relaxed);
          if (std::memcmp(out.bytes, want.bytes, 128) != 0) wrong.fetch_add(1);
        } else {
          memo->Insert(d, want.bytes);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(hits.load(), 0);
}

// ---- in the runtime (the descriptor pack's copy_tma: two TMA descriptors)

// copy_tma's layout (kernels/descpack): in_desc's map at 48, its i32 shape at 176;
// out_desc's map at 240.
constexpr size_t kInMap = 48, kInShape = 176, kOutMap = 240;
constexpr CUdeviceptr kIn = 0x7f0000010000, kOut = 0x7f0000020000;

class DescMemoRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::ResetFake(); }
  void TearDown() override { fake::Reset(); }

  // copy_tma of a new Runtime on the descriptor pack (the fixture keeps the Runtime).
  Kernel CopyTma() {
    absl::StatusOr<Runtime> rt = OpenFake(KPACK_DESC_PACK_DIR);
    if (!rt.ok()) {
      ADD_FAILURE() << rt.status();
      return Kernel();
    }
    runtimes_.push_back(std::make_unique<Runtime>(*std::move(rt)));
    return *runtimes_.back()->Find("copy_tma");
  }
  Runtime& runtime() { return *runtimes_.front(); }

 private:
  std::vector<std::unique_ptr<Runtime>> runtimes_;
};

TEST_F(DescMemoRuntimeTest, AnUnchangedDescriptorIsCopiedNotEncoded) {
  Kernel k = CopyTma();
  const TensorDesc in = TensorDesc::RowMajor(kIn, {100, 200});
  const TensorDesc out = TensorDesc::RowMajor(kOut, {100, 200}, TensorDescPadding::kNan);
  const int64_t before = fake::TensorMapEncodeCount();
  KP_ASSERT_OK(k.Launch(nullptr, in, out, 100, 200));
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 2);
  const fake::LaunchRecord encoded = LastLaunch();
  KP_ASSERT_OK(k.Launch(nullptr, in, out, 100, 200));
  KP_ASSERT_OK(runtime().Launch("copy_tma", nullptr, in, out, 100, 200));  // by name: the same memo
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 2) << "hits call no encoder";
  const fake::LaunchRecord copied = LastLaunch();
  ASSERT_EQ(copied.params.size(), encoded.params.size());
  EXPECT_EQ(std::memcmp(copied.params.data(), encoded.params.data(), encoded.params.size()), 0)
      << "a hit launches the bytes the encode wrote, shape and stride slots included";
}

// Each caller-side input of the map (base, each dimension, the row stride, the padding)
// changed alone is a miss: encoded again, and the launch gets the new map and shape.
TEST_F(DescMemoRuntimeTest, AnyChangedDescriptorFieldIsEncoded) {
  Kernel k = CopyTma();
  const TensorDesc base = TensorDesc::RowMajor(kIn, {100, 200});
  const TensorDesc out = TensorDesc::RowMajor(kOut, {100, 200});
  struct Change {
    const char* name;
    void (*apply)(TensorDesc&);
  };
  const Change changes[] = {
      {"base", [](TensorDesc& d) { d.base += 256; }},
      {"shape[0]", [](TensorDesc& d) { d.shape[0] = 99; }},
      {"shape[1]", [](TensorDesc& d) { d.shape[1] = 192; }},
      {"strides[0]", [](TensorDesc& d) { d.strides[0] = 256; }},
      {"padding", [](TensorDesc& d) { d.padding = TensorDescPadding::kNan; }},
  };
  for (const Change& c : changes) {
    KP_ASSERT_OK(k.Launch(nullptr, base, out, 100, 200));  // copied (after the first)
    TensorDesc changed = base;
    c.apply(changed);
    const int64_t before = fake::TensorMapEncodeCount();
    KP_ASSERT_OK(k.Launch(nullptr, changed, out, 100, 200));
    ASSERT_EQ(fake::TensorMapEncodeCount() - before, 1) << c.name << ": in_desc only";
    const fake::TensorMapEncode e = fake::GetTensorMapEncode(before);
    fake::TensorMapEncode launched{};
    ASSERT_TRUE(fake::DecodeTensorMap(LastLaunch().params.data() + kInMap, &launched));
    EXPECT_EQ(launched.address, e.address) << c.name;
    EXPECT_EQ(launched.dims, e.dims) << c.name;
    EXPECT_EQ(launched.strides, e.strides) << c.name;
    EXPECT_EQ(launched.oob_fill, e.oob_fill) << c.name;
    EXPECT_EQ(e.address, changed.base) << c.name;
    EXPECT_EQ(e.dims[0], static_cast<uint64_t>(changed.shape[1])) << c.name;
    EXPECT_EQ(e.dims[1], static_cast<uint64_t>(changed.shape[0])) << c.name;
    EXPECT_EQ(e.strides[0], static_cast<uint64_t>(changed.strides[0]) * 2) << c.name;
    EXPECT_EQ(testing::At<int32_t>(LastLaunch(), kInShape), changed.shape[0]) << c.name;
  }
}

// A descriptor kpack refuses, or one the driver refuses or fails to encode, is not kept:
// the same descriptor is checked and encoded again, and still refused.
TEST_F(DescMemoRuntimeTest, ARefusedOrFailedEncodeIsNotKept) {
  Kernel k = CopyTma();
  const TensorDesc in = TensorDesc::RowMajor(kIn, {100, 200});
  const TensorDesc out = TensorDesc::RowMajor(kOut, {100, 200});
  TensorDesc misaligned = in;
  misaligned.base += 8;
  EXPECT_FALSE(k.Launch(nullptr, misaligned, out, 100, 200).ok());
  EXPECT_FALSE(k.Launch(nullptr, misaligned, out, 100, 200).ok()) << "refused every time";
  TensorDesc refused = in;
  refused.strides[0] = int64_t{1} << 40;  // passes kpack's checks, not the driver's
  const int64_t before = fake::TensorMapEncodeCount();
  EXPECT_FALSE(k.Launch(nullptr, refused, out, 100, 200).ok());
  EXPECT_FALSE(k.Launch(nullptr, refused, out, 100, 200).ok());
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 2) << "each refusal asked the driver";

  fake::FailNext("TensorMapEncodeTiled", CUDA_ERROR_UNKNOWN);
  const absl::Status failed = k.Launch(nullptr, in, out, 100, 200);
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  const int64_t launches = fake::LaunchCount();
  KP_ASSERT_OK(k.Launch(nullptr, in, out, 100, 200));
  // The fake records the calls it carries out: not the one FailNext failed.
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 2 + 2) << "in_desc encoded again, out_desc too";
  EXPECT_EQ(fake::LaunchCount(), launches + 1);
  fake::TensorMapEncode launched{};
  ASSERT_TRUE(fake::DecodeTensorMap(LastLaunch().params.data() + kInMap, &launched));
  EXPECT_EQ(launched.address, kIn);
}

// kWays bases in turn are each encoded once; kWays + 1 in turn evict each other (first
// in, first out): every launch encodes, and each carries its own map.
TEST_F(DescMemoRuntimeTest, ACycleLongerThanTheCapacityAlwaysEncodes) {
  Kernel k = CopyTma();
  const TensorDesc out = TensorDesc::RowMajor(kOut, {100, 200});
  auto run = [&](CUdeviceptr first, int cycle, int launches) {
    const int64_t before = fake::TensorMapEncodeCount();
    for (int i = 0; i < launches; ++i) {
      const TensorDesc in = TensorDesc::RowMajor(first + 0x1000 * (i % cycle), {100, 200});
      EXPECT_TRUE(k.Launch(nullptr, in, out, 100, 200).ok());
      fake::TensorMapEncode launched{};
      EXPECT_TRUE(fake::DecodeTensorMap(LastLaunch().params.data() + kInMap, &launched));
      EXPECT_EQ(launched.address, in.base);
    }
    return fake::TensorMapEncodeCount() - before;
  };
  constexpr int ways = DescMemo::kWays;
  // out_desc is encoded once, at the first launch.
  EXPECT_EQ(run(kIn, ways, 5 * ways), ways + 1) << "each base encoded once";
  EXPECT_EQ(run(kIn + 0x100000, ways + 1, 5 * (ways + 1)), 5 * (ways + 1))
      << "one encode per launch";
}

// Threads launching through one Kernel, hitting and missing on the same memos (more
// bases than entries): every launch carries the map of its own descriptor, whose shape is
// tied to its base. tools/test.sh runs it under ThreadSanitizer too.
TEST_F(DescMemoRuntimeTest, ConcurrentLaunchesGetTheirOwnMaps) {
  Kernel k = CopyTma();
  KP_ASSERT_OK(runtime().Preload());
  constexpr int kThreads = 4, kLaunches = 200, kBases = DescMemo::kWays + 2;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  const int64_t first = fake::LaunchCount();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      testing::UsePrimaryContext();
      for (int i = 0; i < kLaunches; ++i) {
        const int b = (i + t) % kBases;
        const TensorDesc in = TensorDesc::RowMajor(kIn + 0x10000 * b, {64 + b, 200});
        const TensorDesc out = TensorDesc::RowMajor(kOut, {64, 200});
        if (!k.Launch(nullptr, in, out, 64, 200).ok()) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const int64_t total = kThreads * kLaunches;
  ASSERT_EQ(fake::LaunchCount() - first, total);
  ASSERT_LE(total, fake::kLaunchRingCapacity);
  for (int64_t i = first; i < first + total; ++i) {
    const fake::LaunchRecord r = fake::GetLaunch(i);
    fake::TensorMapEncode in{}, out{};
    ASSERT_TRUE(fake::DecodeTensorMap(r.params.data() + kInMap, &in)) << i;
    ASSERT_TRUE(fake::DecodeTensorMap(r.params.data() + kOutMap, &out)) << i;
    const uint64_t b = (in.address - kIn) / 0x10000;
    EXPECT_EQ(in.dims[1], 64 + b) << "launch " << i << ": the map of another descriptor";
    EXPECT_EQ(testing::At<int32_t>(r, kInShape), static_cast<int32_t>(64 + b)) << "shape slot";
    EXPECT_EQ(out.address, kOut);
  }
}

// A BoundLaunch's Bind and Set go through the same memo: setting back a descriptor it
// had copies the map.
TEST_F(DescMemoRuntimeTest, SetBackToAKnownDescriptorCopiesIt) {
  Kernel k = CopyTma();
  const TensorDesc in = TensorDesc::RowMajor(kIn, {100, 200});
  const TensorDesc moved = TensorDesc::RowMajor(kIn + 4096, {100, 200});
  const TensorDesc out = TensorDesc::RowMajor(kOut, {100, 200});
  auto bound = k.BindArgs(nullptr, in, out, 100, 200);
  ASSERT_TRUE(bound.ok()) << bound.status();
  const int64_t before = fake::TensorMapEncodeCount();
  KP_ASSERT_OK(bound->Set(0, moved));
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 1);
  KP_ASSERT_OK(bound->Set(0, in));
  KP_ASSERT_OK(bound->Set(0, moved));
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 1) << "both maps were kept";
  KP_ASSERT_OK(bound->Launch());
  fake::TensorMapEncode launched{};
  ASSERT_TRUE(fake::DecodeTensorMap(LastLaunch().params.data() + kInMap, &launched));
  EXPECT_EQ(launched.address, kIn + 4096);
}

}  // namespace
}  // namespace kpack
