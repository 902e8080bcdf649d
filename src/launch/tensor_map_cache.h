// A bounded, lock-free cache of encoded CUtensorMaps, so that a launch whose tensor
// descriptor did not change copies 128 bytes instead of calling cuTensorMapEncodeTiled.
//
// Key: the encode's inputs exactly (TensorMapEncodeArgs: PackDesc fills one and passes
// its fields to the driver, nothing else), compared in full, word by word; there is no
// hash-only equality. A CUtensorMap is a function of those inputs alone
// (cuTensorMapEncodeTiled takes no context or device and reads no memory: the map holds
// the address, not the contents), so a hit is the bytes a fresh encode would write, and
// nothing needs to be invalidated: memory freed and reallocated at the same address with
// the same geometry encodes the same map (still correct), and any other geometry,
// element type, swizzle, box, fill ... is a different key (a miss). Only successful
// encodes are stored.
//
// Capacity and eviction: one cache per TMA descriptor parameter of each variant
// (VariantData::tensor_map_caches), of kWays entries (the last kWays distinct maps that
// parameter encoded, e.g. double or quadruple buffering). A miss encodes and replaces the
// entries in turn (FIFO, by a per-cache counter), so a cycle of kWays + 1 or more maps
// misses every time. 4 entries of 320 bytes: 1280 bytes per TMA parameter and variant.
//
// Thread safety: any number of threads may Find and Insert at once. Each entry is a
// seqlock over atomic words (acquire/release, no fences: no data race, TSan-clean;
// tensor_map_cache.cc): readers never block or write, and a writer that finds the entry
// being written by another thread leaves it to that one (the map is encoded either way).
// No allocation, lock, formatting or logging.

#ifndef KPACK_SRC_LAUNCH_TENSOR_MAP_CACHE_H_
#define KPACK_SRC_LAUNCH_TENSOR_MAP_CACHE_H_

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kpack::internal {

// The arguments of one cuTensorMapEncodeTiled call but the output address, innermost
// dimension first as the driver takes them. Zero-initialized, so that the entries past
// `rank` are zero and equal inputs are equal bytes; no padding (static_asserts below).
struct TensorMapEncodeArgs {
  static constexpr int kMaxRank = 5;
  uint64_t address = 0;
  cuuint64_t dims[kMaxRank] = {};
  cuuint64_t strides[kMaxRank - 1] = {};  // bytes; rank - 1 of them
  cuuint32_t box[kMaxRank] = {};
  cuuint32_t element_strides[kMaxRank] = {};
  uint32_t data_type = 0;     // CUtensorMapDataType
  uint32_t rank = 0;
  uint32_t interleave = 0;    // CUtensorMapInterleave
  uint32_t swizzle = 0;       // CUtensorMapSwizzle
  uint32_t l2_promotion = 0;  // CUtensorMapL2promotion
  uint32_t oob_fill = 0;      // CUtensorMapFloatOOBfill
};
static_assert(std::has_unique_object_representations_v<TensorMapEncodeArgs>,
              "the cache compares TensorMapEncodeArgs by its bytes: no padding allowed");
static_assert(sizeof(TensorMapEncodeArgs) % 8 == 0);
static_assert(sizeof(CUtensorMap) == 128);

class TensorMapCache {
 public:
  static constexpr int kWays = 4;

  TensorMapCache() = default;
  TensorMapCache(const TensorMapCache&) = delete;
  TensorMapCache& operator=(const TensorMapCache&) = delete;

  // Copies the map encoded from `key` to `map` (128 bytes) and returns true if held;
  // false leaves `map` unspecified (the caller encodes into it).
  bool Find(const TensorMapEncodeArgs& key, std::byte* map) const;
  // Stores `map`, which the driver encoded from `key` successfully, over the oldest
  // entry (or not at all while another thread writes that entry).
  void Insert(const TensorMapEncodeArgs& key, const std::byte* map);

 private:
  static constexpr int kKeyWords = sizeof(TensorMapEncodeArgs) / 8;
  static constexpr int kMapWords = sizeof(CUtensorMap) / 8;
  struct alignas(64) Entry {
    // 0: never written; odd: being written; otherwise even and counting writes.
    std::atomic<uint64_t> seq{0};
    std::atomic<uint64_t> key[kKeyWords] = {};
    std::atomic<uint64_t> map[kMapWords] = {};
  };
  Entry entries_[kWays];
  std::atomic<uint32_t> next_{0};  // the entry the next Insert replaces (mod kWays)
};

}  // namespace kpack::internal

#endif  // KPACK_SRC_LAUNCH_TENSOR_MAP_CACHE_H_
