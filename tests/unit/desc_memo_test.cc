// The memo of encoded CUtensorMaps per TMA descriptor parameter (DescMemo,
// src/launch/tensordesc.h) on its own: every key field, eviction, concurrent readers and
// writers. Its use at launch is in tensordesc_runtime_test.cc (the Memo* tests).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "launch/tensordesc.h"

namespace kpack {
namespace {

using internal::DescMemo;

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

}  // namespace
}  // namespace kpack
