// The cache of encoded CUtensorMaps (src/launch/tensor_map_cache.h): on its own (every
// key field, eviction, concurrent readers and writers) and in the runtime, observed
// through the recording fake driver's cuTensorMapEncodeTiled (a hit calls no encoder and
// launches the bytes a fresh encode writes; a failed encode is not kept; the counters in
// Kernel::variant_stats(); Options::cache_tensor_maps off).

#include "launch/tensor_map_cache.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
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

using internal::TensorMapCache;
using internal::TensorMapEncodeArgs;
using ::kpack::testing::LastLaunch;
using ::kpack::testing::OpenFake;

// A 2-D fp16 map like copy_tma's: 128-byte swizzle, 64x64 box.
TensorMapEncodeArgs Key(uint64_t address) {
  TensorMapEncodeArgs k;
  k.address = address;
  k.rank = 2;
  k.dims[0] = 200;
  k.dims[1] = 100;
  k.strides[0] = 400;
  k.box[0] = k.box[1] = 64;
  k.element_strides[0] = k.element_strides[1] = 1;
  k.data_type = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  k.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  k.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  return k;
}

// A map that is a function of every byte of its key (what a Find must return for it).
struct alignas(64) Map {
  std::byte bytes[128];
};
Map MapOf(const TensorMapEncodeArgs& k) {
  Map m;
  unsigned char raw[sizeof(k)];
  std::memcpy(raw, &k, sizeof(k));
  uint64_t h = 1469598103934665603ull;
  for (int w = 0; w < 16; ++w) {
    for (unsigned char c : raw) h = (h ^ c) * 1099511628211ull;
    std::memcpy(m.bytes + 8 * w, &h, 8);
  }
  return m;
}

bool Holds(const TensorMapCache& cache, const TensorMapEncodeArgs& k) {
  Map out;
  if (!cache.Find(k, out.bytes)) return false;
  const Map want = MapOf(k);
  EXPECT_EQ(std::memcmp(out.bytes, want.bytes, 128), 0) << "a hit returns the key's own map";
  return true;
}

TEST(TensorMapCacheTest, FindsWhatWasInserted) {
  TensorMapCache cache;
  const TensorMapEncodeArgs k = Key(0x10000);
  EXPECT_FALSE(Holds(cache, k)) << "empty";
  cache.Insert(k, MapOf(k).bytes);
  EXPECT_TRUE(Holds(cache, k));
}

// Every input of the encode is part of the key: changing any one 32-bit word of it (each
// field, each array element, either half of a 64-bit value) is a miss.
TEST(TensorMapCacheTest, AnyChangedKeyWordIsAMiss) {
  const TensorMapEncodeArgs base = Key(0x10000);
  constexpr size_t kWords = sizeof(TensorMapEncodeArgs) / 4;
  for (size_t w = 0; w < kWords; ++w) {
    TensorMapCache cache;
    cache.Insert(base, MapOf(base).bytes);
    TensorMapEncodeArgs changed = base;
    uint32_t word;
    std::memcpy(&word, reinterpret_cast<const char*>(&changed) + 4 * w, 4);
    word ^= 0x10;
    std::memcpy(reinterpret_cast<char*>(&changed) + 4 * w, &word, 4);
    EXPECT_FALSE(Holds(cache, changed)) << "word " << w << " of the key";
    EXPECT_TRUE(Holds(cache, base));
  }
}

// FIFO over kWays entries: the (kWays + 1)-th distinct map evicts the first.
TEST(TensorMapCacheTest, EvictsTheOldestPastItsCapacity) {
  TensorMapCache cache;
  const int n = TensorMapCache::kWays;
  for (int i = 0; i < n; ++i) cache.Insert(Key(0x10000 * (i + 1)), MapOf(Key(0x10000 * (i + 1))).bytes);
  for (int i = 0; i < n; ++i) EXPECT_TRUE(Holds(cache, Key(0x10000 * (i + 1)))) << i;
  const TensorMapEncodeArgs extra = Key(0x10000 * (n + 1));
  cache.Insert(extra, MapOf(extra).bytes);
  EXPECT_TRUE(Holds(cache, extra));
  EXPECT_FALSE(Holds(cache, Key(0x10000))) << "the oldest went";
  for (int i = 1; i < n; ++i) EXPECT_TRUE(Holds(cache, Key(0x10000 * (i + 1)))) << i;
}

// Threads finding and inserting over the same entries (more keys than entries, so
// writers keep replacing what readers read): every hit is exactly its key's map, never
// a torn or another key's one. Run under TSan by tools/test.sh.
TEST(TensorMapCacheTest, ConcurrentFindsAndInsertsNeverReturnAnotherMap) {
  TensorMapCache cache;
  constexpr int kThreads = 4, kKeys = TensorMapCache::kWays + 2, kRounds = 20000;
  std::atomic<int64_t> hits{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const TensorMapEncodeArgs k = Key(0x10000 * (1 + (i * 7 + t) % kKeys));
        const Map want = MapOf(k);
        Map out;
        if (cache.Find(k, out.bytes)) {
          hits.fetch_add(1, std::memory_order_relaxed);
          if (std::memcmp(out.bytes, want.bytes, 128) != 0) wrong.fetch_add(1);
        } else {
          cache.Insert(k, want.bytes);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(hits.load(), 0);
}

// ---- in the runtime (the test pack's copy_tma: two TMA descriptors)

// copy_tma's layout (kernels/descpack): in_desc's map at 48, out_desc's at 240.
constexpr size_t kInMap = 48, kOutMap = 240;
constexpr CUdeviceptr kIn = 0x7f0000010000, kOut = 0x7f0000020000;

class TensorMapCacheRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::ResetFake(); }
  void TearDown() override { fake::Reset(); }

  // copy_tma of a new Runtime on the descriptor pack (the fixture keeps the Runtime).
  Kernel CopyTma(const Options& options = testing::FakeOptions()) {
    absl::StatusOr<Runtime> rt = OpenFake(KPACK_DESC_PACK_DIR, options);
    if (!rt.ok()) {
      ADD_FAILURE() << rt.status();
      return Kernel();
    }
    runtimes_.push_back(std::make_unique<Runtime>(*std::move(rt)));
    return *runtimes_.back()->Find("copy_tma");
  }
  Runtime& runtime() { return *runtimes_.front(); }

  static Kernel::VariantStats Stats(const Kernel& k) {
    Kernel::VariantStats sum;
    for (const Kernel::VariantStats& s : k.variant_stats()) {
      sum.launches += s.launches;
      sum.tensor_map_hits += s.tensor_map_hits;
      sum.tensor_map_encodes += s.tensor_map_encodes;
    }
    return sum;
  }

 private:
  std::vector<std::unique_ptr<Runtime>> runtimes_;
};

TEST_F(TensorMapCacheRuntimeTest, AnUnchangedDescriptorIsCopiedNotEncoded) {
  Kernel k = CopyTma();
  const TensorDesc in = TensorDesc::RowMajor(kIn, {100, 200});
  const TensorDesc out = TensorDesc::RowMajor(kOut, {100, 200}, TensorDescPadding::kNan);
  const int64_t before = fake::TensorMapEncodeCount();
  KP_ASSERT_OK(k.Launch(nullptr, in, out, 100, 200));
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 2);
  const fake::LaunchRecord encoded = LastLaunch();
  KP_ASSERT_OK(k.Launch(nullptr, in, out, 100, 200));
  KP_ASSERT_OK(runtime().Launch("copy_tma", nullptr, in, out, 100, 200));  // by name: the same cache
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 2) << "hits call no encoder";
  const fake::LaunchRecord cached = LastLaunch();
  ASSERT_EQ(cached.params.size(), encoded.params.size());
  EXPECT_EQ(std::memcmp(cached.params.data(), encoded.params.data(), encoded.params.size()), 0)
      << "a hit launches the bytes the encode wrote";
  const Kernel::VariantStats s = Stats(k);
  EXPECT_EQ(s.launches, 3u);
  EXPECT_EQ(s.tensor_map_encodes, 2u);
  EXPECT_EQ(s.tensor_map_hits, 4u);
  EXPECT_EQ(runtime().stats().tensor_map_hits, 4u) << "the runtime's sum";
  EXPECT_EQ(runtime().stats().tensor_map_encodes, 2u);

  // The same launches with the cache off: every map encoded, the same bytes.
  Options off = testing::FakeOptions();
  off.cache_tensor_maps = false;
  Kernel u = CopyTma(off);
  const int64_t encodes = fake::TensorMapEncodeCount();
  for (int i = 0; i < 3; ++i) KP_ASSERT_OK(u.Launch(nullptr, in, out, 100, 200));
  EXPECT_EQ(fake::TensorMapEncodeCount() - encodes, 6);
  EXPECT_EQ(std::memcmp(LastLaunch().params.data(), encoded.params.data(), encoded.params.size()),
            0);
  EXPECT_EQ(Stats(u).tensor_map_encodes, 6u);
  EXPECT_EQ(Stats(u).tensor_map_hits, 0u);
}

// Each caller-side input of the map (base, each dimension, the row stride, the padding)
// changed alone is a miss: encoded again, and the launch gets the new map.
TEST_F(TensorMapCacheRuntimeTest, AnyChangedDescriptorFieldIsEncoded) {
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
    KP_ASSERT_OK(k.Launch(nullptr, base, out, 100, 200));  // cached (after the first)
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
  }
}

// A failed encode (the driver refuses, or fails once) is not cached: the next launch
// encodes again.
TEST_F(TensorMapCacheRuntimeTest, AFailedEncodeIsNotCached) {
  Kernel k = CopyTma();
  const TensorDesc in = TensorDesc::RowMajor(kIn, {100, 200});
  const TensorDesc out = TensorDesc::RowMajor(kOut, {100, 200});
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
  EXPECT_EQ(Stats(k).tensor_map_encodes, 5u);
  EXPECT_EQ(Stats(k).tensor_map_hits, 0u);
}

// kWays bases in turn hit once cached; kWays + 1 in turn evict each other (FIFO): every
// launch encodes.
TEST_F(TensorMapCacheRuntimeTest, ACycleLongerThanTheCapacityAlwaysMisses) {
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
  const int ways = TensorMapCache::kWays;
  // out_desc is encoded once, at the first launch.
  EXPECT_EQ(run(kIn, ways, 5 * ways), ways + 1) << "each base encoded once";
  EXPECT_EQ(run(kIn + 0x100000, ways + 1, 5 * (ways + 1)), 5 * (ways + 1))
      << "one encode per launch";
}

// Threads launching through one Kernel, hitting and missing on the same caches (more
// bases than entries): every launch carries the map of its own descriptor, whose shape
// is tied to its base, and the counters add up. Run under TSan by tools/test.sh.
TEST_F(TensorMapCacheRuntimeTest, ConcurrentLaunchesGetTheirOwnMaps) {
  Kernel k = CopyTma();
  KP_ASSERT_OK(runtime().Preload());
  constexpr int kThreads = 4, kLaunches = 200, kBases = TensorMapCache::kWays + 2;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  const int64_t first = fake::LaunchCount();
  const int64_t encodes = fake::TensorMapEncodeCount();
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
    EXPECT_EQ(testing::At<int32_t>(r, 176), static_cast<int32_t>(64 + b)) << "shape slot";
    EXPECT_EQ(out.address, kOut);
  }
  const Kernel::VariantStats s = Stats(k);
  EXPECT_EQ(s.tensor_map_hits + s.tensor_map_encodes, 2u * total);
  EXPECT_EQ(static_cast<int64_t>(s.tensor_map_encodes), fake::TensorMapEncodeCount() - encodes);
  EXPECT_GT(s.tensor_map_hits, 0u);
}

// A BoundLaunch's Bind and Set go through the same cache: setting back a descriptor it
// had copies the map.
TEST_F(TensorMapCacheRuntimeTest, SetBackToACachedDescriptorCopiesIt) {
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
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 1) << "both maps were cached";
  KP_ASSERT_OK(bound->Launch());
  fake::TensorMapEncode launched{};
  ASSERT_TRUE(fake::DecodeTensorMap(LastLaunch().params.data() + kInMap, &launched));
  EXPECT_EQ(launched.address, kIn + 4096);
  EXPECT_EQ(Stats(k).tensor_map_hits, 2u);
  EXPECT_EQ(Stats(k).tensor_map_encodes, 3u);
}

}  // namespace
}  // namespace kpack
