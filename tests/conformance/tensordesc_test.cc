// Conformance: kernels taking host tensor descriptors, launched with kpack::TensorDesc
// (kernels/descpack's TMA copy, the example pack's persistent TMA matmul and fused
// attention), and flattened tuple parameters. On the GPU the descriptors are real
// CUtensorMaps read by TMA (shapes that are not multiples of the block check its
// clipping); on the fake driver the kernels are emulated from the maps the fake encoded.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "conformance.h"
#include "gmock/gmock.h"

namespace kpack::conformance {
namespace {

using ::testing::HasSubstr;

class TensorDescTest : public ConformanceTest {};

float HalfToFloat(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                   : (e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024.0f + m, e - 25));
  return (h & 0x8000) ? -v : v;
}

// fp16 bits of small integers (|v| <= 2048), exact: sums of their products are exact in
// fp32 and in fp16 while they stay within 2048, whatever the summation order.
uint16_t IntHalf(int v) {
  if (v == 0) return 0;
  const int a = std::abs(v);
  int e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  return static_cast<uint16_t>((v < 0 ? 0x8000 : 0) | ((e + 15) << 10) | ((a << (10 - e)) & 0x3ff));
}

std::vector<uint16_t> RandomHalfInts(size_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = IntHalf(dist(gen));
  return v;
}

// The descpack TMA copy over a strided view: a 100 x 200 window (neither a multiple of the
// 64 x 128 block) of a 120 x 256 buffer. Every element inside the window is copied, every
// element outside it untouched: TMA zero-fills the loads past the shape and drops the
// stores past it.
TEST_P(TensorDescTest, TmaCopyClipsToTheDescriptorsShape) {
  auto rt = Open(KPACK_DESC_PACK_DIR);
  const int64_t rows = 120, cols = 256, M = 100, N = 200;
  const std::vector<uint16_t> host = RandomHalfInts(rows * cols, 3, -1000, 1000);
  CUdeviceptr in = Upload(host);
  CUdeviceptr out = Alloc(rows * cols * 2);  // 0xffff everywhere
  TensorDesc src = TensorDesc::RowMajor(in, {M, N});
  src.strides[0] = cols;
  TensorDesc dst = TensorDesc::RowMajor(out, {M, N});
  dst.strides[0] = cols;
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    return rt->Launch("copy_tma", s, src, dst, int32_t{M}, int32_t{N});
  }));
  const std::vector<uint16_t> got = Download<uint16_t>(out, rows * cols);
  size_t wrong = 0, touched = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      if (r < M && c < N) {
        wrong += got[i] != host[i];
      } else {
        touched += got[i] != 0xffff;
      }
    }
  }
  EXPECT_EQ(wrong, 0u) << "elements inside the descriptor not copied";
  EXPECT_EQ(touched, 0u) << "elements outside the descriptor's shape written";
}

// The same descriptors bound once, then the destination changed with Set: the copy goes
// to the new one.
TEST_P(TensorDescTest, ABoundLaunchSetsANewDescriptor) {
  auto rt = Open(KPACK_DESC_PACK_DIR);
  const int64_t M = 70, N = 136;  // rows of 272 bytes: TMA needs multiples of 16
  const std::vector<uint16_t> host = RandomHalfInts(M * N, 5, -50, 50);
  CUdeviceptr in = Upload(host);
  CUdeviceptr first = Alloc(M * N * 2), second = Alloc(M * N * 2);
  Kernel copy = *rt->Find("copy_tma");
  absl::StatusOr<BoundLaunch> bound = [&] {
    // Temporaries: the BoundLaunch keeps its own copies.
    const TensorDesc a = TensorDesc::RowMajor(in, {M, N}), b = TensorDesc::RowMajor(first, {M, N});
    return copy.BindArgs(main_.stream, a, b, int32_t{M}, int32_t{N});
  }();
  ASSERT_TRUE(bound.ok()) << bound.status();
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    bound->set_stream(s);
    return bound->Launch();
  }));
  EXPECT_EQ(Download<uint16_t>(first, M * N), host);
  const TensorDesc to_second = TensorDesc::RowMajor(second, {M, N});
  const TensorDesc misaligned = TensorDesc::RowMajor(second + 2, {M, N});
  KP_ASSERT_OK(bound->Set(1, to_second));
  absl::Status bad = bound->Set(1, misaligned);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("is not 16-byte aligned"));
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    bound->set_stream(s);
    return bound->Launch();
  }));
  EXPECT_EQ(Download<uint16_t>(second, M * N), host) << "the refused Set kept the last good one";
}

// A map copied from the parameter's memo (DescMemo) is the driver's encode byte for byte:
// two bindings of the same descriptors, the first encoding, the second copying, prepare
// the same parameter bytes, and the copy moves the data.
TEST_P(TensorDescTest, AKeptMapIsTheDriversEncode) {
  auto rt = Open(KPACK_DESC_PACK_DIR);
  const int64_t M = 70, N = 136;
  const std::vector<uint16_t> host = RandomHalfInts(M * N, 7, -50, 50);
  CUdeviceptr in = Upload(host);
  CUdeviceptr out = Alloc(M * N * 2);
  Kernel copy = *rt->Find("copy_tma");
  const TensorDesc a = TensorDesc::RowMajor(in, {M, N}), b = TensorDesc::RowMajor(out, {M, N});
  absl::StatusOr<BoundLaunch> encoded = copy.BindArgs(main_.stream, a, b, int32_t{M}, int32_t{N});
  absl::StatusOr<BoundLaunch> copied = copy.BindArgs(main_.stream, a, b, int32_t{M}, int32_t{N});
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  ASSERT_TRUE(copied.ok()) << copied.status();
  absl::StatusOr<PreparedLaunch> p1 = encoded->Prepare(), p2 = copied->Prepare();
  ASSERT_TRUE(p1.ok()) << p1.status();
  ASSERT_TRUE(p2.ok()) << p2.status();
  ASSERT_EQ(p1->param_bytes, p2->param_bytes);
  EXPECT_EQ(std::memcmp(p1->params, p2->params, p1->param_bytes), 0);
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    copied->set_stream(s);
    return copied->Launch();
  }));
  EXPECT_EQ(Download<uint16_t>(out, M * N), host);
}

// The example pack's persistent TMA matmul at shapes that are not multiples of its tiles,
// in both buckets (M <= 64 and above, whose variants have different block shapes), exact
// against the host (small integers: no rounding anywhere).
TEST_P(TensorDescTest, PersistentTmaMatmulIsExact) {
  auto rt = Open(KPACK_EXAMPLES_PACK_DIR);
  int sms = 0;
  CUdevice device;
  CU_ASSERT(d().CtxGetDevice(&device));
  CU_ASSERT(d().DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device));
  struct Shape {
    int32_t M, N, K;
    const char* variant;
  } shapes[] = {{40, 136, 72, "b0_generic"}, {64, 128, 64, "b0_aligned"},
                {200, 264, 40, "b1_generic"}, {256, 128, 128, "b1_aligned"}};
  Kernel mm = *rt->Find("matmul_tma");
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(sh.variant);
    const std::vector<uint16_t> a = RandomHalfInts(size_t(sh.M) * sh.K, 11, -2, 2);
    const std::vector<uint16_t> b = RandomHalfInts(size_t(sh.K) * sh.N, 12, -2, 2);
    CUdeviceptr pa = Upload(a), pb = Upload(b), pc = Alloc(size_t(sh.M) * sh.N * 2);
    const TensorDesc da = TensorDesc::RowMajor(pa, {sh.M, sh.K});
    const TensorDesc db = TensorDesc::RowMajor(pb, {sh.K, sh.N});
    const TensorDesc dc = TensorDesc::RowMajor(pc, {sh.M, sh.N});
    const Arg args[] = {da, db, dc, sh.M, sh.N, sh.K, int32_t{sms}};
    EXPECT_EQ(*mm.SelectVariant(args), sh.variant);
    KP_ASSERT_OK(Run(*rt, [&](CUstream s) { return mm.LaunchArgs(s, args); }));
    const std::vector<uint16_t> c = Download<uint16_t>(pc, size_t(sh.M) * sh.N);
    size_t wrong = 0;
    for (int32_t m = 0; m < sh.M; ++m) {
      for (int32_t n = 0; n < sh.N; ++n) {
        int sum = 0;
        for (int32_t k = 0; k < sh.K; ++k) {
          sum += static_cast<int>(HalfToFloat(a[size_t(m) * sh.K + k])) *
                 static_cast<int>(HalfToFloat(b[size_t(k) * sh.N + n]));
        }
        wrong += c[size_t(m) * sh.N + n] != IntHalf(sum);
      }
    }
    EXPECT_EQ(wrong, 0u);
  }
}

// The example pack's fused attention forward (rank-4 descriptors, one head's rows per
// tile) with N_CTX not a multiple of the blocks, causal and not, against a float64 host
// reference within fp16 tolerance.
TEST_P(TensorDescTest, TmaAttentionForwardMatchesTheHost) {
  auto rt = Open(KPACK_EXAMPLES_PACK_DIR);
  const int32_t Z = 1, H = 2, n = 100, D = 64;
  const size_t elems = size_t(Z) * H * n * D;
  std::vector<uint16_t> q(elems), k(elems), v(elems);
  std::mt19937 gen(17);
  std::uniform_real_distribution<float> dist(-1, 1);
  // Multiples of 1/8 in [-1, 1]: the fp16 of i, its exponent lowered by 3.
  auto eighth = [](int i) { return static_cast<uint16_t>(i == 0 ? 0 : IntHalf(i) - (3 << 10)); };
  for (auto* t : {&q, &k, &v}) {
    for (uint16_t& x : *t) x = eighth(static_cast<int>(std::lround(dist(gen) * 8)));
  }
  CUdeviceptr pq = Upload(q), pk = Upload(k), pv = Upload(v);
  const float scale = 0.125f;
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    CUdeviceptr po = Alloc(elems * 2), pl = Alloc(size_t(Z) * H * n * 4);
    auto desc = [&](CUdeviceptr p) { return TensorDesc::RowMajor(p, {Z, H, n, D}); };
    const TensorDesc dq = desc(pq), dk = desc(pk), dv = desc(pv), dout = desc(po);
    KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
      return rt->Launch(causal ? "attention_fwd_causal" : "attention_fwd", s, scale, pl, Z, H,
                        dq, dk, dv, dout, n);
    }));
    const std::vector<uint16_t> o = Download<uint16_t>(po, elems);
    const std::vector<float> lse = Download<float>(pl, size_t(Z) * H * n);
    double worst_o = 0, worst_l = 0;
    for (int32_t h = 0; h < H; ++h) {
      for (int32_t i = 0; i < n; ++i) {
        std::vector<double> s;
        const int32_t end = causal ? i + 1 : n;
        double top = -INFINITY;
        for (int32_t j = 0; j < end; ++j) {
          double dot = 0;
          for (int32_t d = 0; d < D; ++d) {
            dot += double{HalfToFloat(q[(size_t(h) * n + i) * D + d])} *
                   HalfToFloat(k[(size_t(h) * n + j) * D + d]);
          }
          s.push_back(dot * scale);
          top = std::max(top, s.back());
        }
        double sum = 0;
        for (double x : s) sum += std::exp(x - top);
        worst_l = std::max(worst_l, std::abs(lse[size_t(h) * n + i] -
                                             (top + std::log(sum)) / std::log(2.0)));
        for (int32_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int32_t j = 0; j < end; ++j) {
            acc += std::exp(s[j] - top) * HalfToFloat(v[(size_t(h) * n + j) * D + d]);
          }
          worst_o = std::max(worst_o, std::abs(HalfToFloat(o[(size_t(h) * n + i) * D + d]) -
                                               acc / sum));
        }
      }
    }
    EXPECT_LT(worst_o, 2e-2) << "max |O - reference|";
    EXPECT_LT(worst_l, 5e-3) << "max |L - reference|";
  }
}

// A kernel whose tuple parameters Triton flattened takes their elements as arguments.
TEST_P(TensorDescTest, TupleParametersAreFlattened) {
  auto rt = Open(KPACK_DESC_PACK_DIR);
  const size_t n = 3000;
  const std::vector<float> x = RandomFloats(n, 1), y = RandomFloats(n, 2);
  CUdeviceptr px = Upload(x), py = Upload(y);
  KP_ASSERT_OK(Run(*rt, [&](CUstream s) {
    return rt->Launch("axpy_pair", s, px, py, int32_t{n}, 2.0f, -0.5f);
  }));
  const std::vector<float> got = Download<float>(py, n);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    volatile float ax = 2.0f * x[i];
    volatile float by = -0.5f * y[i];
    const float want = ax + by;
    wrong += std::abs(got[i] - want) > 1e-6f * (1 + std::abs(want));
  }
  EXPECT_EQ(wrong, 0u);
}

INSTANTIATE_TEST_SUITE_P(Suite, TensorDescTest,
                         ::testing::Values(Mode{TheBackend(), false}, Mode{TheBackend(), true}),
                         ModeName);

}  // namespace
}  // namespace kpack::conformance
