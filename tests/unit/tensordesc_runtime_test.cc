// Tensor descriptor arguments at launch, observed through the recording fake driver: the
// cuTensorMapEncodeTiled arguments kpack derives from a kpack::TensorDesc and the chosen
// variant's manifest entry (Triton 3.6's fill_tma_descriptor), the map written in place
// into the 64-byte aligned parameter buffer, the shape and stride slots, the pointer form
// of a variant without TMA, every refused descriptor (nothing launched), and what a
// BoundLaunch re-encodes.

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "fake_driver.h"
#include "fake_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "launch/tensordesc.h"

namespace kpack {
namespace {

using ::kpack::testing::At;
using ::kpack::testing::LastLaunch;
using ::kpack::testing::OpenFake;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// 16-byte aligned fake device addresses; nothing is emulated here, so no memory is needed.
constexpr CUdeviceptr kIn = 0x7f0000010000, kOut = 0x7f0000020000, kThird = 0x7f0000030000;

// copy_tma's layout (kernels/descpack): in_desc's map at 48, shape at 176/180, strides at
// 184/192; out_desc's map at 240; M, N at 392/396.
constexpr size_t kInMap = 48, kOutMap = 240;

class TensorDescRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::ResetFake(); }
  void TearDown() override { fake::Reset(); }

  // The encodes since `first`.
  static std::vector<fake::TensorMapEncode> EncodesSince(int64_t first) {
    std::vector<fake::TensorMapEncode> out;
    for (int64_t i = first; i < fake::TensorMapEncodeCount(); ++i) {
      out.push_back(fake::GetTensorMapEncode(i));
    }
    return out;
  }
  // The map in a recorded launch's parameter buffer at `offset`, decoded.
  static fake::TensorMapEncode MapAt(const fake::LaunchRecord& r, size_t offset) {
    fake::TensorMapEncode e{};
    EXPECT_TRUE(fake::DecodeTensorMap(r.params.data() + offset, &e))
        << "no map written at " << offset;
    return e;
  }
};

TEST_F(TensorDescRuntimeTest, EncodesWhatTritonEncodesIntoTheParameterBuffer) {
  auto rt = OpenFake(KPACK_DESC_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  const int64_t before = fake::TensorMapEncodeCount();
  TensorDesc in = TensorDesc::RowMajor(kIn, {100, 200});
  in.strides[0] = 256;  // a strided view
  const TensorDesc out = TensorDesc::RowMajor(kOut, {100, 200}, TensorDescPadding::kNan);
  KP_ASSERT_OK(rt->Launch("copy_tma", nullptr, in, out, 100, 200));

  const std::vector<fake::TensorMapEncode> e = EncodesSince(before);
  ASSERT_EQ(e.size(), 2u) << "one encode per descriptor";
  const fake::TensorMapEncode& a = e[0];
  EXPECT_TRUE(a.ok);
  EXPECT_EQ(a.data_type, CU_TENSOR_MAP_DATA_TYPE_FLOAT16);
  EXPECT_EQ(a.rank, 2u);
  EXPECT_EQ(a.address, kIn);
  EXPECT_EQ(a.dims[0], 200u) << "innermost dimension first";
  EXPECT_EQ(a.dims[1], 100u);
  EXPECT_EQ(a.strides[0], 512u) << "bytes: 256 elements of 2";
  EXPECT_EQ(a.box[0], 64u) << "the manifest's block_size (the 128B swizzle splits 128)";
  EXPECT_EQ(a.box[1], 64u);
  EXPECT_EQ(a.element_strides[0], 1u);
  EXPECT_EQ(a.element_strides[1], 1u);
  EXPECT_EQ(a.interleave, CU_TENSOR_MAP_INTERLEAVE_NONE);
  EXPECT_EQ(a.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
  EXPECT_EQ(a.l2_promotion, CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
  EXPECT_EQ(a.oob_fill, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  EXPECT_EQ(e[1].address, kOut);
  EXPECT_EQ(e[1].strides[0], 400u);
  EXPECT_EQ(e[1].oob_fill, CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA);
  EXPECT_EQ(a.tensor_map % 64, 0u);
  EXPECT_EQ(e[1].tensor_map - a.tensor_map, kOutMap - kInMap) << "both in one buffer";

  const fake::LaunchRecord r = LastLaunch();
  EXPECT_EQ(MapAt(r, kInMap).address, kIn) << "the map went to the launch";
  EXPECT_EQ(MapAt(r, kInMap).strides[0], 512u);
  EXPECT_EQ(MapAt(r, kOutMap).address, kOut);
  EXPECT_EQ(At<int32_t>(r, 176), 100);
  EXPECT_EQ(At<int32_t>(r, 180), 200);
  EXPECT_EQ(At<int64_t>(r, 184), 256);
  EXPECT_EQ(At<int64_t>(r, 192), 1);
  EXPECT_EQ(At<int32_t>(r, 392), 100);
  EXPECT_EQ(At<int32_t>(r, 396), 200);
  EXPECT_THAT(r.grid, ElementsAre(2u, 2u, 1u)) << "cdiv(100, 64), cdiv(200, 128)";
}

// fp4 padding (Triton's packed fp4 layout): the last dimension doubled, in the encode and
// in the i32 shape slot, as Triton's make_tensordesc_arg does.
TEST_F(TensorDescRuntimeTest, Fp4PaddingDoublesTheLastDimension) {
  testing::TempPack pack(KPACK_DESC_PACK_DIR);
  pack.variant("copy_tma")["tensordesc_meta"][0]["fp4_padded"] = true;
  pack.Save();
  auto rt = OpenFake(pack.dir());
  ASSERT_TRUE(rt.ok()) << rt.status();
  const int64_t before = fake::TensorMapEncodeCount();
  const TensorDesc in = TensorDesc::RowMajor(kIn, {64, 104});
  const TensorDesc out = TensorDesc::RowMajor(kOut, {64, 104});
  KP_ASSERT_OK(rt->Launch("copy_tma", nullptr, in, out, 64, 104));
  const std::vector<fake::TensorMapEncode> e = EncodesSince(before);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].dims[0], 208u) << "in_desc: fp4 padded";
  EXPECT_EQ(e[0].strides[0], 208u) << "the strides are the caller's (104 elements of 2 bytes)";
  EXPECT_EQ(e[1].dims[0], 104u) << "out_desc: not";
  EXPECT_EQ(At<int32_t>(LastLaunch(), 180), 208);
  EXPECT_EQ(At<int32_t>(LastLaunch(), 372), 104);
  // Doubled past i32: refused, naming why.
  const TensorDesc wide = TensorDesc::RowMajor(kIn, {64, int64_t{1} << 30});
  const absl::Status s = rt->Launch("copy_tma", nullptr, wide, out, 64, 104);
  EXPECT_THAT(std::string(s.message()), HasSubstr("doubled for fp4 padding"));
  // So large that doubling it overflows int64 (to a negative that passed the i32 check).
  const int64_t launches = fake::LaunchCount();
  const TensorDesc huge = TensorDesc::RowMajor(kIn, {64, int64_t{1} << 62});
  const absl::Status h = rt->Launch("copy_tma", nullptr, huge, out, 64, 104);
  EXPECT_EQ(h.code(), absl::StatusCode::kInvalidArgument) << h;
  EXPECT_THAT(std::string(h.message()),
              HasSubstr("shape[1] = 4611686018427387904 is outside [1, 2^31) (the last "
                        "dimension is doubled for fp4 padding)"));
  EXPECT_EQ(fake::LaunchCount(), launches);
}

// RowMajor of a hostile shape: strides that do not fit saturate (and are refused at
// launch) instead of overflowing int64 (undefined behaviour the UBSan tier catches).
TEST(TensorDescTest, RowMajorStridesSaturateInsteadOfOverflowing) {
  const TensorDesc d = TensorDesc::RowMajor(kIn, {3, int64_t{1} << 40, int64_t{1} << 40});
  EXPECT_EQ(d.strides[2], 1);
  EXPECT_EQ(d.strides[1], int64_t{1} << 40);
  EXPECT_EQ(d.strides[0], std::numeric_limits<int64_t>::max());
  const TensorDesc wide = TensorDesc::RowMajor(kIn, {64, int64_t{1} << 62});
  EXPECT_EQ(wide.strides[0], int64_t{1} << 62);
  const TensorDesc negative = TensorDesc::RowMajor(kIn, {-5, 8, 2});
  EXPECT_EQ(negative.strides[0], 16);
}

// Without TMA (an sm_80 build): base pointer, shape and strides as i64, the padding flag,
// then shape as i32 and strides as i64; nothing encoded.
TEST_F(TensorDescRuntimeTest, AVariantWithoutTmaGetsThePointerForm) {
  fake::SetDevices({fake::DeviceConfig{.cc_major = 8, .cc_minor = 0}});
  testing::UsePrimaryContext();
  auto rt = OpenFake(KPACK_DESC_PACK_DIR "_sm80");
  ASSERT_TRUE(rt.ok()) << rt.status();
  const TensorDesc in = TensorDesc::RowMajor(kIn, {3, 24});
  const TensorDesc out = TensorDesc::RowMajor(kOut, {3, 24}, TensorDescPadding::kNan);
  KP_ASSERT_OK(rt->Launch("copy_ptr", nullptr, in, out, 3, 24));
  EXPECT_EQ(fake::TensorMapEncodeCount(), 0);
  const fake::LaunchRecord r = LastLaunch();
  EXPECT_EQ(At<CUdeviceptr>(r, 0), kIn);
  EXPECT_EQ(At<int64_t>(r, 8), 3);
  EXPECT_EQ(At<int64_t>(r, 16), 24);
  EXPECT_EQ(At<int64_t>(r, 24), 24);
  EXPECT_EQ(At<int64_t>(r, 32), 1);
  EXPECT_EQ(At<uint8_t>(r, 40), 0) << "padding zero";
  EXPECT_EQ(At<int32_t>(r, 44), 3);
  EXPECT_EQ(At<int32_t>(r, 48), 24);
  EXPECT_EQ(At<int64_t>(r, 56), 24);
  EXPECT_EQ(At<int64_t>(r, 64), 1);
  EXPECT_EQ(At<CUdeviceptr>(r, 72), kOut);
  EXPECT_EQ(At<uint8_t>(r, 112), 1) << "padding nan";
}

// The block shape is the chosen variant's: one set of descriptors, two buckets of the
// example pack's persistent matmul, two boxes.
TEST_F(TensorDescRuntimeTest, TheBoxIsTheChosenVariants) {
  auto rt = OpenFake(KPACK_EXAMPLES_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  Kernel mm = *rt->Find("matmul_tma");
  for (int32_t m : {64, 1000}) {
    const TensorDesc a = TensorDesc::RowMajor(kIn, {m, 512});
    const TensorDesc b = TensorDesc::RowMajor(kOut, {512, 512});
    const TensorDesc c = TensorDesc::RowMajor(kThird, {m, 512});
    const int64_t before = fake::TensorMapEncodeCount();
    KP_ASSERT_OK(mm.Launch(nullptr, a, b, c, m, 512, 512, 132));
    const std::vector<fake::TensorMapEncode> e = EncodesSince(before);
    ASSERT_EQ(e.size(), 3u);
    // b0 (M <= 64): A's block [64, 64]; b1: [128, 64], innermost first here.
    EXPECT_THAT(std::vector<uint32_t>(e[0].box.begin(), e[0].box.begin() + 2),
                ElementsAre(64u, m <= 64 ? 64u : 128u))
        << "M " << m;
    EXPECT_EQ(e[2].box[1], m <= 64 ? 64u : 128u) << "C's rows";
    // The tile is the tuned config's: C's block shape [BLOCK_M, BLOCK_N] in the chosen
    // variant's types (the encoded box may split the inner dimension for the swizzle).
    const Arg args[] = {a, b, c, m, 512, 512, 132};
    auto chosen = mm.SelectVariant(args);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    unsigned block_m = 0, block_n = 0;
    for (const kpack::VariantInfo& v : mm.info().variants) {
      if (v.name != *chosen) continue;
      ASSERT_EQ(std::sscanf(v.arg_types[2].c_str(), "tensordesc<fp16[%u, %u]>", &block_m,
                            &block_n), 2)
          << v.arg_types[2];
    }
    EXPECT_EQ(block_m, m <= 64 ? 64u : 128u);
    const unsigned tiles = (m + block_m - 1) / block_m * ((512 + block_n - 1) / block_n);
    EXPECT_EQ(LastLaunch().grid[0], std::min(132u, tiles)) << "min(NUM_SMS, tiles)";
  }
}

struct BadDesc {
  const char* name;
  void (*mutate)(TensorDesc&);
  std::vector<std::string> mentions;
};
void PrintTo(const BadDesc& c, std::ostream* os) { *os << c.name; }

class RefusedDescriptorTest : public TensorDescRuntimeTest,
                              public ::testing::WithParamInterface<BadDesc> {};

// Each of Triton's checks, and the driver's: INVALID_ARGUMENT naming the kernel, the
// variant, the argument and the values, and nothing launched.
TEST_P(RefusedDescriptorTest, IsAnInvalidArgumentAndLaunchesNothing) {
  auto rt = OpenFake(KPACK_DESC_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  TensorDesc in = TensorDesc::RowMajor(kIn, {100, 200});
  GetParam().mutate(in);
  const TensorDesc out = TensorDesc::RowMajor(kOut, {100, 200});
  const int64_t launches = fake::LaunchCount();
  const absl::Status s = rt->Launch("copy_tma", nullptr, in, out, 100, 200);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("kernel 'copy_tma' variant 'default': argument 0 ('in_desc', "
                        "tensordesc<fp16[64, 128]>)"));
  for (const std::string& m : GetParam().mentions) {
    EXPECT_THAT(std::string(s.message()), HasSubstr(m));
  }
  EXPECT_EQ(fake::LaunchCount(), launches);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RefusedDescriptorTest,
    ::testing::Values(
        BadDesc{"rank", [](TensorDesc& d) { d = TensorDesc::RowMajor(kIn, {2, 100, 200}); },
                {"has rank 3, but the parameter's block shape [64, 128] has rank 2"}},
        BadDesc{"rank_6",
                [](TensorDesc& d) { d = TensorDesc::RowMajor(kIn, {1, 1, 1, 1, 1, 1}); },
                {"has rank 6"}},
        BadDesc{"empty_dimension", [](TensorDesc& d) { d.shape[0] = 0; },
                {"shape[0] = 0 is outside [1, 2^31)", "shape [0, 200]"}},
        BadDesc{"dimension_past_i32", [](TensorDesc& d) { d.shape[1] = int64_t{1} << 31; },
                {"shape[1] = 2147483648 is outside [1, 2^31)", "as i32"}},
        BadDesc{"last_stride", [](TensorDesc& d) { d.strides[1] = 2; },
                {"strides[1] = 2: the last dimension must be contiguous"}},
        BadDesc{"base_alignment", [](TensorDesc& d) { d.base += 8; },
                {"base 0x7f0000010008 is not 16-byte aligned"}},
        BadDesc{"stride_alignment", [](TensorDesc& d) { d.strides[0] = 100; },
                {"strides[0] = 100 elements of 2 bytes is not a multiple of 16 bytes"}},
        // arg.h promises positive strides: 0 and negative multiples of 16 bytes are refused.
        BadDesc{"zero_stride", [](TensorDesc& d) { d.strides[0] = 0; },
                {"strides[0] = 0 is not positive"}},
        BadDesc{"negative_stride", [](TensorDesc& d) { d.strides[0] = -200; },
                {"strides[0] = -200 is not positive"}},
        BadDesc{"padding_value",
                [](TensorDesc& d) { d.padding = static_cast<TensorDescPadding>(7); },
                {"padding 7 is neither"}},
        // A row stride of 2^41 bytes passes kpack's checks (a multiple of 16) but not the
        // driver's (below 2^40), which the fake enforces as documented.
        BadDesc{"driver_refuses", [](TensorDesc& d) { d.strides[0] = int64_t{1} << 40; },
                {"cuTensorMapEncodeTiled for", "CUDA_ERROR_INVALID_VALUE", "box [64, 64]"}}));

TEST_F(TensorDescRuntimeTest, OtherArgumentKindsAreRefusedByName) {
  auto rt = OpenFake(KPACK_DESC_PACK_DIR);
  ASSERT_TRUE(rt.ok());
  const TensorDesc d = TensorDesc::RowMajor(kIn, {100, 200});
  absl::Status s = rt->Launch("copy_tma", nullptr, kIn, d, 100, 200);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("argument 0 ('in_desc'"), HasSubstr("expects a kpack::TensorDesc"),
                    HasSubstr("got a CUdeviceptr")));
  s = rt->Launch("copy_tma", nullptr, d, d, d, 200);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("argument 2 ('M') expects i32"), HasSubstr("got a kpack::TensorDesc")));
  // NaN padding needs floating-point elements (Triton: a floating-point base tensor).
  const TensorDesc nan = TensorDesc::RowMajor(kIn, {100, 200}, TensorDescPadding::kNan);
  s = rt->Launch("copy_i16", nullptr, nan, d, 100, 200);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("NaN padding needs floating-point elements, not i16"));
  EXPECT_EQ(fake::LaunchCount(), 0);
}

// A BoundLaunch encodes at Bind, not per launch; Set re-encodes the one descriptor it
// changes; a refused Set leaves the bound one (re-encoded if the driver saw the bad one);
// a Set that changes the variant re-encodes all from the BoundLaunch's own copies.
TEST_F(TensorDescRuntimeTest, ABoundLaunchEncodesOnlyWhatChanges) {
  auto rt = OpenFake(KPACK_EXAMPLES_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  Kernel mm = *rt->Find("matmul_tma");
  const int64_t at_start = fake::TensorMapEncodeCount();
  absl::StatusOr<BoundLaunch> bound = [&] {
    const TensorDesc a = TensorDesc::RowMajor(kIn, {64, 256});
    const TensorDesc b = TensorDesc::RowMajor(kOut, {256, 512});
    const TensorDesc c = TensorDesc::RowMajor(kThird, {64, 512});
    return mm.BindArgs(nullptr, a, b, c, 64, 512, 256, 132);
  }();  // the descriptors are gone: the BoundLaunch has copies
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(fake::TensorMapEncodeCount() - at_start, 3);
  KP_ASSERT_OK(bound->Launch());
  KP_ASSERT_OK(bound->Launch());
  EXPECT_EQ(fake::TensorMapEncodeCount() - at_start, 3) << "launches encode nothing";
  const fake::LaunchRecord first = LastLaunch();

  const TensorDesc moved = TensorDesc::RowMajor(kThird + 4096, {64, 512});
  KP_ASSERT_OK(bound->Set(2, moved));
  EXPECT_EQ(fake::TensorMapEncodeCount() - at_start, 4) << "only c_desc";
  KP_ASSERT_OK(bound->Launch());
  fake::LaunchRecord r = LastLaunch();
  EXPECT_EQ(MapAt(r, 432).address, kThird + 4096);
  EXPECT_EQ(std::memcmp(r.params.data() + 48, first.params.data() + 48, 128), 0)
      << "a_desc's map untouched";

  TensorDesc refused = moved;
  refused.strides[0] = int64_t{1} << 40;  // the driver refuses it
  EXPECT_FALSE(bound->Set(2, refused).ok());
  KP_ASSERT_OK(bound->Launch());
  EXPECT_EQ(MapAt(LastLaunch(), 432).address, kThird + 4096) << "the last good one";
  EXPECT_EQ(MapAt(LastLaunch(), 432).strides[0], 1024u);

  // M = 1000 selects bucket 1: a variant with other block shapes, encoded from the copies.
  const int64_t before = fake::TensorMapEncodeCount();
  KP_ASSERT_OK(bound->Set(3, 1000));
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 3);
  KP_ASSERT_OK(bound->Launch());
  r = LastLaunch();
  EXPECT_EQ(MapAt(r, 48).address, kIn);
  EXPECT_EQ(MapAt(r, 48).box[1], 128u) << "b1's block [128, 64]";
  EXPECT_EQ(MapAt(r, 432).address, kThird + 4096);
  EXPECT_EQ(At<int32_t>(r, 584), 1000);

  absl::StatusOr<PreparedLaunch> p = bound->Prepare();
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(static_cast<const std::byte*>(p->params) + 48) % 64, 0u)
      << "the maps lie 64-byte aligned in the buffer a PreparedLaunch hands out";
}

// ---- the memo of encoded maps (DescMemo, src/launch/tensordesc.h) at launch: a hit calls
// no encoder and launches the bytes a fresh encode writes; a refused or failed encode is
// not kept; Bind and Set share it.

// copy_tma's i32 shape[0] slot (see kInMap above).
constexpr size_t kInShape = 176;

TEST_F(TensorDescRuntimeTest, MemoAnUnchangedDescriptorIsCopiedNotEncoded) {
  auto rt = OpenFake(KPACK_DESC_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  Kernel k = *rt->Find("copy_tma");
  const TensorDesc in = TensorDesc::RowMajor(kIn, {100, 200});
  const TensorDesc out = TensorDesc::RowMajor(kOut, {100, 200}, TensorDescPadding::kNan);
  const int64_t before = fake::TensorMapEncodeCount();
  KP_ASSERT_OK(k.Launch(nullptr, in, out, 100, 200));
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 2);
  const fake::LaunchRecord encoded = LastLaunch();
  KP_ASSERT_OK(k.Launch(nullptr, in, out, 100, 200));
  KP_ASSERT_OK(rt->Launch("copy_tma", nullptr, in, out, 100, 200));  // by name: the same memo
  EXPECT_EQ(fake::TensorMapEncodeCount() - before, 2) << "hits call no encoder";
  const fake::LaunchRecord copied = LastLaunch();
  ASSERT_EQ(copied.params.size(), encoded.params.size());
  EXPECT_EQ(std::memcmp(copied.params.data(), encoded.params.data(), encoded.params.size()), 0)
      << "a hit launches the bytes the encode wrote, shape and stride slots included";
}

// Each caller-side input of the map (base, each dimension, the row stride, the padding)
// changed alone is a miss: encoded again, and the launch gets the new map and shape.
TEST_F(TensorDescRuntimeTest, MemoAnyChangedDescriptorFieldIsEncoded) {
  auto rt = OpenFake(KPACK_DESC_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  Kernel k = *rt->Find("copy_tma");
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
    const fake::TensorMapEncode launched = MapAt(LastLaunch(), kInMap);
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
TEST_F(TensorDescRuntimeTest, MemoARefusedOrFailedEncodeIsNotKept) {
  auto rt = OpenFake(KPACK_DESC_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  Kernel k = *rt->Find("copy_tma");
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
  EXPECT_EQ(MapAt(LastLaunch(), kInMap).address, kIn);
}

// kWays bases in turn are each encoded once; kWays + 1 in turn evict each other (first
// in, first out): every launch encodes, and each carries its own map.
TEST_F(TensorDescRuntimeTest, MemoACycleLongerThanTheCapacityAlwaysEncodes) {
  auto rt = OpenFake(KPACK_DESC_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  Kernel k = *rt->Find("copy_tma");
  const TensorDesc out = TensorDesc::RowMajor(kOut, {100, 200});
  auto run = [&](CUdeviceptr first, int cycle, int launches) {
    const int64_t before = fake::TensorMapEncodeCount();
    for (int i = 0; i < launches; ++i) {
      const TensorDesc in = TensorDesc::RowMajor(first + 0x1000 * (i % cycle), {100, 200});
      EXPECT_TRUE(k.Launch(nullptr, in, out, 100, 200).ok());
      EXPECT_EQ(MapAt(LastLaunch(), kInMap).address, in.base);
    }
    return fake::TensorMapEncodeCount() - before;
  };
  constexpr int ways = internal::DescMemo::kWays;
  // out_desc is encoded once, at the first launch.
  EXPECT_EQ(run(kIn, ways, 5 * ways), ways + 1) << "each base encoded once";
  EXPECT_EQ(run(kIn + 0x100000, ways + 1, 5 * (ways + 1)), 5 * (ways + 1))
      << "one encode per launch";
}

// Threads launching through one Kernel, hitting and missing on the same memos (more
// bases than entries): every launch carries the map of its own descriptor, whose shape is
// tied to its base. tools/test.sh runs it under ThreadSanitizer too.
TEST_F(TensorDescRuntimeTest, MemoConcurrentLaunchesGetTheirOwnMaps) {
  auto rt = OpenFake(KPACK_DESC_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  Kernel k = *rt->Find("copy_tma");
  KP_ASSERT_OK(rt->Preload());
  constexpr int kThreads = 4, kLaunches = 200, kBases = internal::DescMemo::kWays + 2;
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
    const fake::TensorMapEncode in = MapAt(r, kInMap), out = MapAt(r, kOutMap);
    const uint64_t b = (in.address - kIn) / 0x10000;
    EXPECT_EQ(in.dims[1], 64 + b) << "launch " << i << ": the map of another descriptor";
    EXPECT_EQ(testing::At<int32_t>(r, kInShape), static_cast<int32_t>(64 + b)) << "shape slot";
    EXPECT_EQ(out.address, kOut);
  }
}

// A BoundLaunch's Bind and Set go through the same memo: setting back a descriptor it
// had copies the map.
TEST_F(TensorDescRuntimeTest, MemoSetBackToAKnownDescriptorCopiesIt) {
  auto rt = OpenFake(KPACK_DESC_PACK_DIR);
  ASSERT_TRUE(rt.ok()) << rt.status();
  Kernel k = *rt->Find("copy_tma");
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
  EXPECT_EQ(MapAt(LastLaunch(), kInMap).address, kIn + 4096);
}

}  // namespace
}  // namespace kpack
