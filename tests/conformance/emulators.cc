// The test packs' kernels emulated on the host (emulators.h).

#include "emulators.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "fake_driver.h"

namespace kpack::conformance {
namespace {

using fake::DeviceArray;
using fake::EmulatedLaunch;

uint64_t Programs(const EmulatedLaunch& l) { return uint64_t{l.grid[0]} * l.grid[1] * l.grid[2]; }

float HalfToFloatSlow(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                         : (e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024.0f + m, e - 25));
  return (h & 0x8000) ? -v : v;
}

// By table: the emulated matmuls and norms convert millions of halves.
float HalfToFloat(uint16_t h) {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < t.size(); ++i) t[i] = HalfToFloatSlow(static_cast<uint16_t>(i));
    return t;
  }();
  return table[h];
}

// float -> fp16, round to nearest even, as the GPU's cvt.rn.f16.f32.
uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    const uint32_t sig = mant | 0x800000u;
    const int shift = 14 - e;
    uint32_t h = sig >> shift;
    const uint32_t rem = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(h);
}

// ---- kernels/testpack ----

void Add(const EmulatedLaunch& l) {
  const size_t n = std::min<uint64_t>(l.Arg<int32_t>(3), Programs(l) * 1024);
  const float* x = DeviceArray<float>(l.Arg<CUdeviceptr>(0), n, "add x_ptr");
  const float* y = DeviceArray<float>(l.Arg<CUdeviceptr>(1), n, "add y_ptr");
  float* out = DeviceArray<float>(l.Arg<CUdeviceptr>(2), n, "add out_ptr");
  if (x == nullptr || y == nullptr || out == nullptr) return;
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

void Scalars(const EmulatedLaunch& l) {
  const size_t n = std::min<uint64_t>(l.Arg<int32_t>(2), Programs(l) * 256);
  const float* x = DeviceArray<float>(l.Arg<CUdeviceptr>(0), n, "scalars x_ptr");
  float* out = DeviceArray<float>(l.Arg<CUdeviceptr>(1), n, "scalars out_ptr");
  if (x == nullptr || out == nullptr) return;
  const float alpha = l.Arg<float>(3);
  const float beta = std::bit_cast<float>(uint32_t{l.Arg<uint16_t>(4)} << 16);
  const float gamma = HalfToFloat(l.Arg<uint16_t>(5));
  const float e = l.Arg<uint8_t>(6) ? static_cast<float>(l.Arg<int64_t>(7) - (int64_t{1} << 40))
                                    : -1.0f;
  for (size_t i = 0; i < n; ++i) {
    volatile float t = x[i] * alpha;  // each operation rounded on its own, as compiled
    t = t + beta;
    t = t + gamma;
    out[i] = t + e;
  }
}

// testpack's matmul and kernels/graphpack's matmul_fp16 (the example's; its `contig`
// variants compile the unit strides stride_ak, stride_bn and stride_cn away).
void Matmul(const EmulatedLaunch& l) {
  const int64_t M = std::min<int64_t>(l.Arg<int32_t>(3), int64_t{l.grid[0]} * 128);
  const int64_t N = std::min<int64_t>(l.Arg<int32_t>(4), int64_t{l.grid[1]} * 128);
  const int64_t K = l.Arg<int32_t>(5);
  const bool contig = l.num_params == 11;
  const int64_t sam = l.Arg<int32_t>(6), sak = contig ? 1 : l.Arg<int32_t>(7),
                sbk = l.Arg<int32_t>(contig ? 7 : 8), sbn = contig ? 1 : l.Arg<int32_t>(9),
                scm = l.Arg<int32_t>(contig ? 8 : 10), scn = contig ? 1 : l.Arg<int32_t>(11);
  if (M <= 0 || N <= 0) return;
  const uint16_t* a = DeviceArray<uint16_t>(l.Arg<CUdeviceptr>(0),
                                            (M - 1) * sam + (K - 1) * sak + 1, "matmul a_ptr");
  const uint16_t* b = DeviceArray<uint16_t>(l.Arg<CUdeviceptr>(1),
                                            (K - 1) * sbk + (N - 1) * sbn + 1, "matmul b_ptr");
  uint16_t* c = DeviceArray<uint16_t>(l.Arg<CUdeviceptr>(2), (M - 1) * scm + (N - 1) * scn + 1,
                                      "matmul c_ptr");
  if (a == nullptr || b == nullptr || c == nullptr) return;
  // The operands as floats first (converting in the inner loop dominated the run time).
  std::vector<float> af(M * K), bf(K * N);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) af[m * K + k] = HalfToFloat(a[m * sam + k * sak]);
  }
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) bf[n * K + k] = HalfToFloat(b[k * sbk + n * sbn]);
  }
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += af[m * K + k] * bf[n * K + k];
      c[m * scm + n * scn] = FloatToHalf(acc);
    }
  }
}

void Cluster(const EmulatedLaunch& l) {  // num_ctas 2: two CTAs per program
  const size_t n = std::min<uint64_t>(l.Arg<int32_t>(2), Programs(l) / 2 * 1024);
  const float* x = DeviceArray<float>(l.Arg<CUdeviceptr>(0), n, "cluster x_ptr");
  float* out = DeviceArray<float>(l.Arg<CUdeviceptr>(1), n, "cluster out_ptr");
  if (x == nullptr || out == nullptr) return;
  for (size_t i = 0; i < n; ++i) out[i] = std::fma(x[i], 3.0f, 1.0f);
}

void Pdl(const EmulatedLaunch& l) {
  const size_t n = std::min<uint64_t>(l.Arg<int32_t>(2), Programs(l) * 1024);
  const float* x = DeviceArray<float>(l.Arg<CUdeviceptr>(0), n, "pdl x_ptr");
  float* out = DeviceArray<float>(l.Arg<CUdeviceptr>(1), n, "pdl out_ptr");
  if (x == nullptr || out == nullptr) return;
  for (size_t i = 0; i < n; ++i) out[i] = x[i] * 2;
}

// Each program builds a TMA descriptor in its 128 bytes of global scratch (here: writes
// its id there), then copies its 32x32 tile of x, doubled, to out.
void Scratch(const EmulatedLaunch& l) {
  const CUdeviceptr scratch = l.Arg<CUdeviceptr>(5);
  const uint64_t programs = Programs(l);
  if (scratch % 128 != 0) {
    DeviceArray<char>(0, 1, "scratch $global_scratch not 128-byte aligned");
    return;
  }
  uint64_t* descriptors = DeviceArray<uint64_t>(scratch, programs * 16, "scratch $global_scratch");
  if (descriptors == nullptr) return;
  for (uint64_t p = 0; p < programs; ++p) descriptors[p * 16] = p;
  const int64_t M = l.Arg<int32_t>(2), N = l.Arg<int32_t>(3), stride = l.Arg<int32_t>(4);
  const int64_t rows = std::min<int64_t>(M, int64_t{l.grid[0]} * 32);
  const int64_t cols = std::min<int64_t>(N, int64_t{l.grid[1]} * 32);
  if (rows <= 0 || cols <= 0) return;
  const float* x = DeviceArray<float>(l.Arg<CUdeviceptr>(0), (rows - 1) * stride + cols, "scratch x_ptr");
  float* out = DeviceArray<float>(l.Arg<CUdeviceptr>(1), (rows - 1) * stride + cols, "scratch out_ptr");
  if (x == nullptr || out == nullptr) return;
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t n = 0; n < cols; ++n) out[m * stride + n] = x[m * stride + n] * 2;
  }
}

// testpack's softmax (one 1024-wide block per row) and kernels/graphpack's (the
// example's, with n_rows, any row length). One program per row, rows not checked.
void Softmax(const EmulatedLaunch& l) {
  const bool example = l.num_params == 8;
  const int64_t rows = l.grid[0], in_stride = l.Arg<int32_t>(2), out_stride = l.Arg<int32_t>(3),
                cols = example ? l.Arg<int32_t>(5) : std::min<int64_t>(l.Arg<int32_t>(4), 1024);
  if (rows <= 0 || cols <= 0) return;
  float* out = DeviceArray<float>(l.Arg<CUdeviceptr>(0), (rows - 1) * out_stride + cols, "softmax out_ptr");
  const float* in = DeviceArray<float>(l.Arg<CUdeviceptr>(1), (rows - 1) * in_stride + cols, "softmax in_ptr");
  if (out == nullptr || in == nullptr) return;
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, sum = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::max<double>(m, in[r * in_stride + c]);
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(in[r * in_stride + c] - m);
    for (int64_t c = 0; c < cols; ++c) {
      out[r * out_stride + c] = static_cast<float>(std::exp(in[r * in_stride + c] - m) / sum);
    }
  }
}

// ---- kernels/graphpack (the example kernels of kernels/examples/graph_step.py) ----

// BLOCK 1024 per program, masked by n.
void VectorAdd(const EmulatedLaunch& l) {
  const size_t n = std::min<uint64_t>(std::max(l.Arg<int32_t>(3), 0), Programs(l) * 1024);
  const float* x = DeviceArray<float>(l.Arg<CUdeviceptr>(0), n, "vector_add x_ptr");
  const float* y = DeviceArray<float>(l.Arg<CUdeviceptr>(1), n, "vector_add y_ptr");
  float* out = DeviceArray<float>(l.Arg<CUdeviceptr>(2), n, "vector_add out_ptr");
  if (x == nullptr || y == nullptr || out == nullptr) return;
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

// fp16 rows of N (stride `stride`), one program per row, rows not checked against M.
void LayerNorm(const EmulatedLaunch& l) {
  const int64_t rows = l.grid[0], stride = l.Arg<int32_t>(4), N = l.Arg<int32_t>(6);
  const float eps = l.Arg<float>(7);
  if (rows <= 0 || N <= 0) return;
  const size_t span = static_cast<size_t>((rows - 1) * stride + N);
  const uint16_t* x = DeviceArray<uint16_t>(l.Arg<CUdeviceptr>(0), span, "layer_norm x_ptr");
  uint16_t* y = DeviceArray<uint16_t>(l.Arg<CUdeviceptr>(1), span, "layer_norm y_ptr");
  const uint16_t* w = DeviceArray<uint16_t>(l.Arg<CUdeviceptr>(2), N, "layer_norm w_ptr");
  const uint16_t* b = DeviceArray<uint16_t>(l.Arg<CUdeviceptr>(3), N, "layer_norm b_ptr");
  if (x == nullptr || y == nullptr || w == nullptr || b == nullptr) return;
  std::vector<float> row(N), wf(N), bf(N);
  for (int64_t c = 0; c < N; ++c) {
    wf[c] = HalfToFloat(w[c]);
    bf[c] = HalfToFloat(b[c]);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float mean = 0, var = 0;
    for (int64_t c = 0; c < N; ++c) mean += row[c] = HalfToFloat(x[r * stride + c]);
    mean /= static_cast<float>(N);
    for (int64_t c = 0; c < N; ++c) var += (row[c] - mean) * (row[c] - mean);
    const float rstd = 1.0f / std::sqrt(var / static_cast<float>(N) + eps);
    for (int64_t c = 0; c < N; ++c) {
      y[r * stride + c] = FloatToHalf((row[c] - mean) * rstd * wf[c] + bf[c]);
    }
  }
}

// ---- kernels/dispatchpack: axpy, whose variants differ in BLOCK (by num_warps), in
// whether stride_x == 1 was compiled away (one parameter fewer) and in n's width ----

void Axpy(const EmulatedLaunch& l) {
  const uint64_t block = l.block[0] == 64 ? 256 : (l.block[0] == 128 ? 1024 : 4096);
  const bool unit = l.num_params == 7;
  const int64_t n_param = l.param_layout[3][1] == 8 ? l.Arg<int64_t>(3) : l.Arg<int32_t>(3);
  const int64_t stride = unit ? 1 : l.Arg<int32_t>(4);
  const float alpha = l.Arg<float>(unit ? 4 : 5);
  const int64_t n = std::min<int64_t>(n_param, static_cast<int64_t>(Programs(l) * block));
  if (n <= 0) return;
  const float* x = DeviceArray<float>(l.Arg<CUdeviceptr>(0), (n - 1) * stride + 1, "axpy x_ptr");
  const float* y = DeviceArray<float>(l.Arg<CUdeviceptr>(1), n, "axpy y_ptr");
  float* out = DeviceArray<float>(l.Arg<CUdeviceptr>(2), n, "axpy out_ptr");
  if (x == nullptr || y == nullptr || out == nullptr) return;
  for (int64_t i = 0; i < n; ++i) {
    volatile float prod = alpha * x[i * stride];
    out[i] = prod + y[i];
  }
}

// ---- kernels/scalarpack: fill stores each scalar's bits ----

void Fill(const EmulatedLaunch& l) {
  const size_t n = std::min<uint64_t>(l.Arg<int32_t>(4), Programs(l) * 128);
  uint16_t* h = DeviceArray<uint16_t>(l.Arg<CUdeviceptr>(0), n, "fill h_ptr");
  uint16_t* b = DeviceArray<uint16_t>(l.Arg<CUdeviceptr>(1), n, "fill b_ptr");
  uint32_t* f = DeviceArray<uint32_t>(l.Arg<CUdeviceptr>(2), n, "fill f_ptr");
  uint64_t* d = DeviceArray<uint64_t>(l.Arg<CUdeviceptr>(3), n, "fill d_ptr");
  if (h == nullptr || b == nullptr || f == nullptr || d == nullptr) return;
  std::fill_n(h, n, l.Arg<uint16_t>(5));
  std::fill_n(b, n, l.Arg<uint16_t>(6));
  std::fill_n(f, n, l.Arg<uint32_t>(7));
  std::fill_n(d, n, l.Arg<uint64_t>(8));
}

// ---- Tensor descriptors: kernels/descpack and the example pack's TMA kernels ----
//
// A descriptor argument is read the way the kernel reads it: from the CUtensorMap the
// fake's cuTensorMapEncodeTiled wrote into the parameter buffer (fake::DecodeTensorMap),
// or from Triton's pointer form. Either way the trailing i32 shape and i64 strides must
// agree with it (a fault otherwise). TMA loads give zeros outside the shape, TMA stores
// drop what falls outside it, as the hardware does.

struct DescView {
  int rank = 0;
  int64_t dims[5] = {};     // outer first
  int64_t strides[5] = {};  // elements, outer first
  CUdeviceptr base = 0;
  unsigned next = 0;  // the ordinal of the parameter after the descriptor's parts
  size_t Extent() const {
    size_t n = 1;
    for (int i = 0; i < rank; ++i) n += static_cast<size_t>((dims[i] - 1) * strides[i]);
    return n;
  }
};

bool ReadDesc(const EmulatedLaunch& l, unsigned ordinal, int rank, int elem_size,
              DescView* v) {
  v->rank = rank;
  unsigned tail = 0;
  if (l.param_layout[ordinal][1] == 128) {
    fake::TensorMapEncode e;
    if (!fake::DecodeTensorMap(l.params + l.param_layout[ordinal][0], &e) ||
        static_cast<int>(e.rank) != rank) {
      DeviceArray<char>(0, 1, "descriptor parameter holds no CUtensorMap of that rank");
      return false;
    }
    v->base = e.address;
    for (int i = 0; i < rank; ++i) v->dims[i] = static_cast<int64_t>(e.dims[rank - 1 - i]);
    for (int i = 0; i + 1 < rank; ++i) {
      v->strides[i] = static_cast<int64_t>(e.strides[rank - 2 - i]) / elem_size;
    }
    v->strides[rank - 1] = 1;
    tail = ordinal + 1;
  } else {
    v->base = l.Arg<CUdeviceptr>(ordinal);
    for (int i = 0; i < rank; ++i) {
      v->dims[i] = l.Arg<int64_t>(ordinal + 1 + i);
      v->strides[i] = l.Arg<int64_t>(ordinal + 1 + rank + i);
    }
    tail = ordinal + 2 + 2 * rank;  // after the padding flag
  }
  for (int i = 0; i < rank; ++i) {
    if (l.Arg<int32_t>(tail + i) != v->dims[i] || l.Arg<int64_t>(tail + rank + i) != v->strides[i]) {
      DeviceArray<char>(0, 1, "descriptor's shape/stride parameters disagree with it");
      return false;
    }
  }
  v->next = tail + 2 * rank;
  return true;
}

// The element at `index` (rank coordinates) of a descriptor, 0 outside its shape.
template <typename T>
T DescLoad(const T* data, const DescView& v, const int64_t* index) {
  int64_t offset = 0;
  for (int i = 0; i < v.rank; ++i) {
    if (index[i] < 0 || index[i] >= v.dims[i]) return T{};
    offset += index[i] * v.strides[i];
  }
  return data[offset];
}

template <typename T>
void DescStore(T* data, const DescView& v, const int64_t* index, T value) {
  int64_t offset = 0;
  for (int i = 0; i < v.rank; ++i) {
    if (index[i] < 0 || index[i] >= v.dims[i]) return;
    offset += index[i] * v.strides[i];
  }
  data[offset] = value;
}

// descpack copy_kernel (TMA or pointer form): each program copies its 64x128 tile.
void CopyDesc(const EmulatedLaunch& l) {
  DescView in, out;
  if (!ReadDesc(l, 0, 2, 2, &in) || !ReadDesc(l, in.next, 2, 2, &out)) return;
  const auto* src = DeviceArray<uint16_t>(in.base, in.Extent(), "copy in_desc");
  auto* dst = DeviceArray<uint16_t>(out.base, out.Extent(), "copy out_desc");
  if (src == nullptr || dst == nullptr) return;
  for (int64_t pm = 0; pm < l.grid[0]; ++pm) {
    for (int64_t pn = 0; pn < l.grid[1]; ++pn) {
      for (int64_t i = 0; i < 64; ++i) {
        for (int64_t j = 0; j < 128; ++j) {
          const int64_t at[2] = {pm * 64 + i, pn * 128 + j};
          DescStore(dst, out, at, DescLoad(src, in, at));
        }
      }
    }
  }
}

// descpack axpy_pair: y = coefs.0 * x + coefs.1 * y through the flattened tuples.
void AxpyPair(const EmulatedLaunch& l) {
  const int64_t n = std::min<int64_t>(l.Arg<int32_t>(2), Programs(l) * 1024);
  if (n <= 0) return;
  const float* x = DeviceArray<float>(l.Arg<CUdeviceptr>(0), n, "axpy_pair ptrs.0");
  float* y = DeviceArray<float>(l.Arg<CUdeviceptr>(1), n, "axpy_pair ptrs.1");
  if (x == nullptr || y == nullptr) return;
  const float a = l.Arg<float>(3), b = l.Arg<float>(4);
  for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b * y[i];
}

// The example pack's matmul_tma (persistent): C = fp16(A @ B), fp32 accumulation, over
// the tiles its min(NUM_SMS, tiles) programs cover between them (all of them).
void MatmulTma(const EmulatedLaunch& l) {
  DescView a, b, c;
  if (!ReadDesc(l, 0, 2, 2, &a) || !ReadDesc(l, a.next, 2, 2, &b) ||
      !ReadDesc(l, b.next, 2, 2, &c)) {
    return;
  }
  const int64_t M = l.Arg<int32_t>(c.next), N = l.Arg<int32_t>(c.next + 1),
                K = l.Arg<int32_t>(c.next + 2);
  const auto* pa = DeviceArray<uint16_t>(a.base, a.Extent(), "matmul_tma a_desc");
  const auto* pb = DeviceArray<uint16_t>(b.base, b.Extent(), "matmul_tma b_desc");
  auto* pc = DeviceArray<uint16_t>(c.base, c.Extent(), "matmul_tma c_desc");
  if (pa == nullptr || pb == nullptr || pc == nullptr) return;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t ai[2] = {m, k}, bi[2] = {k, n};
        acc += HalfToFloat(DescLoad(pa, a, ai)) * HalfToFloat(DescLoad(pb, b, bi));
      }
      const int64_t ci[2] = {m, n};
      DescStore(pc, c, ci, FloatToHalf(acc));
    }
  }
}

// The example pack's attention_fwd(_causal): per (z, h), O = softmax(scale Q K^T) V and
// L = log2(sum exp(scale q.k)), over rank-4 [Z, H, N_CTX, 64] descriptors.
template <bool kCausal>
void Attention(const EmulatedLaunch& l) {
  const float sm_scale = l.Arg<float>(0);
  const CUdeviceptr L_ptr = l.Arg<CUdeviceptr>(1);
  const int64_t Z = l.Arg<int32_t>(2), H = l.Arg<int32_t>(3);
  DescView q, k, v, o;
  if (!ReadDesc(l, 4, 4, 2, &q) || !ReadDesc(l, q.next, 4, 2, &k) ||
      !ReadDesc(l, k.next, 4, 2, &v) || !ReadDesc(l, v.next, 4, 2, &o)) {
    return;
  }
  const int64_t n_ctx = l.Arg<int32_t>(o.next);
  const auto* pq = DeviceArray<uint16_t>(q.base, q.Extent(), "attention q_desc");
  const auto* pk = DeviceArray<uint16_t>(k.base, k.Extent(), "attention k_desc");
  const auto* pv = DeviceArray<uint16_t>(v.base, v.Extent(), "attention v_desc");
  auto* po = DeviceArray<uint16_t>(o.base, o.Extent(), "attention o_desc");
  float* lse = DeviceArray<float>(L_ptr, Z * H * n_ctx, "attention L_ptr");
  if (pq == nullptr || pk == nullptr || pv == nullptr || po == nullptr || lse == nullptr) return;
  std::vector<double> s(n_ctx);
  for (int64_t z = 0; z < Z; ++z) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < n_ctx; ++i) {
        const int64_t end = kCausal ? i + 1 : n_ctx;
        double top = -INFINITY;
        for (int64_t j = 0; j < end; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < 64; ++d) {
            const int64_t qi[4] = {z, h, i, d}, ki[4] = {z, h, j, d};
            dot += double{HalfToFloat(DescLoad(pq, q, qi))} * HalfToFloat(DescLoad(pk, k, ki));
          }
          s[j] = dot * sm_scale;
          top = std::max(top, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < end; ++j) sum += std::exp(s[j] - top);
        lse[(z * H + h) * n_ctx + i] = static_cast<float>((top + std::log(sum)) / std::log(2.0));
        for (int64_t d = 0; d < 64; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < end; ++j) {
            const int64_t vi[4] = {z, h, j, d};
            acc += std::exp(s[j] - top) * HalfToFloat(DescLoad(pv, v, vi));
          }
          const int64_t oi[4] = {z, h, i, d};
          DescStore(po, o, oi, FloatToHalf(static_cast<float>(acc / sum)));
        }
      }
    }
  }
}

}  // namespace

void RegisterKernelEmulators() {
  for (auto [entry, emulator] :
       {std::pair{"add_kernel", &Add}, {"scalars_kernel", &Scalars}, {"matmul_kernel", &Matmul},
        {"cluster_kernel", &Cluster}, {"pdl_kernel", &Pdl}, {"scratch_kernel", &Scratch},
        {"softmax_kernel", &Softmax}, {"axpy_kernel", &Axpy}, {"fill_kernel", &Fill},
        {"copy_kernel", &CopyDesc}, {"axpy_pair", &AxpyPair},
        {"matmul_tma_persistent", &MatmulTma}, {"attention_fwd", &Attention<false>},
        {"attention_fwd_causal", &Attention<true>},
        {"vector_add_kernel", &VectorAdd}, {"layer_norm_kernel", &LayerNorm}}) {
    fake::SetKernelEmulator(entry, emulator);
  }
}

}  // namespace kpack::conformance
