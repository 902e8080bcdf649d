#include "llama_emulators.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fake_driver.h"
#include "nlohmann/json.hpp"

namespace kpack::llama::testing {
namespace {

using fake::DeviceArray;
using fake::EmulatedLaunch;

// One parameter layout of an entry: the slots' names by position, and the constexprs all
// of its variants agree on.
struct Layout {
  std::vector<std::pair<uint16_t, uint16_t>> slots;  // (offset, size), cubin order
  std::vector<std::string> names;
  std::map<std::string, int64_t> constexprs;
};

struct Registry {
  std::mutex mu;
  std::map<std::string, std::vector<Layout>> layouts;  // by entry
  int64_t head_dim = 0;
  std::vector<std::string> errors;
  std::atomic<int64_t> launches{0};
};

Registry& R() {
  static Registry* r = new Registry();
  return *r;
}

void Error(std::string message) {
  Registry& r = R();
  std::lock_guard<std::mutex> lock(r.mu);
  r.errors.push_back(std::move(message));
}

// A launch's arguments by parameter name.
class Args {
 public:
  explicit Args(const EmulatedLaunch& l) : l_(l) {
    Registry& r = R();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.layouts.find(l.entry);
    if (it == r.layouts.end()) return;
    for (const Layout& layout : it->second) {
      if (layout.slots.size() != l.num_params) continue;
      bool same = true;
      for (unsigned i = 0; same && i < l.num_params; ++i) {
        same = layout.slots[i].first == l.param_layout[i][0] &&
               layout.slots[i].second == l.param_layout[i][1];
      }
      if (same) {
        layout_ = &layout;
        break;
      }
    }
  }
  bool ok() const { return layout_ != nullptr; }

  CUdeviceptr Ptr(const char* name) const { return Get<CUdeviceptr>(name); }
  int32_t I32(const char* name) const { return Get<int32_t>(name); }
  float F32(const char* name) const { return Get<float>(name); }
  std::optional<int64_t> Constexpr(const char* name) const {
    auto it = layout_->constexprs.find(name);
    if (it == layout_->constexprs.end()) return std::nullopt;
    return it->second;
  }

 private:
  template <typename T>
  T Get(const char* name) const {
    for (size_t i = 0; i < layout_->names.size(); ++i) {
      if (layout_->names[i] == name) {
        if (layout_->slots[i].second != sizeof(T)) {
          Error(absl::StrCat(l_.entry, ": parameter '", name, "' is ", layout_->slots[i].second,
                             " bytes, not ", sizeof(T)));
          return T{};
        }
        return l_.Param<T>(layout_->slots[i].first);
      }
    }
    // Compiled away: an `eq1` integer is 1.
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, CUdeviceptr>) return T{1};
    Error(absl::StrCat(l_.entry, ": no parameter '", name, "' in the launch's layout"));
    return T{};
  }

  const EmulatedLaunch& l_;
  const Layout* layout_ = nullptr;
};

int64_t Cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Decode attention: a row of at most this many KV tiles is attended by split 0 alone
// (docs/llama.md; llama_kernels.py's _DIRECT_TILES).
constexpr int64_t kDirectTiles = 4;

// ---- the contract's math ----

float Bf(const uint16_t* p, size_t i) { return Bf16ToFloat(p[i]); }

// rmsnorm(x, g) of docs/llama.md into xn (bf16 values held as float).
void RmsNorm(const float* x, const uint16_t* g, int64_t h, float eps, float* xn) {
  float sum = 0;
  for (int64_t k = 0; k < h; ++k) sum += x[k] * x[k];
  const float r = 1.0f / std::sqrt(sum / static_cast<float>(h) + eps);
  for (int64_t k = 0; k < h; ++k) {
    xn[k] = Bf16ToFloat(
        FloatToBf16(Bf16ToFloat(FloatToBf16(x[k] * r)) * Bf(g, static_cast<size_t>(k))));
  }
}

// The normalized rows a projection reads (docs/llama.md): rmsnorm(h[r], norm_w) computed by
// the kernel at M = 1; llama_rmsnorm's bf16 rows xn at M > 1. Into xn_rows ([m, h]); false
// when an array is out of reach (the fault recorded).
bool NormedRows(const Args& a, int64_t m, int64_t h, const std::string& what,
                std::vector<float>* xn_rows) {
  const size_t count = static_cast<size_t>(m * h);
  xn_rows->assign(count, 0.0f);
  if (m > 1) {
    const uint16_t* xn = DeviceArray<uint16_t>(a.Ptr("xn"), count, what + " xn");
    if (xn == nullptr) return false;
    for (size_t i = 0; i < count; ++i) (*xn_rows)[i] = Bf(xn, i);
    return true;
  }
  const float* hs = DeviceArray<float>(a.Ptr("h"), count, what + " h");
  const uint16_t* norm =
      DeviceArray<uint16_t>(a.Ptr("norm_w"), static_cast<size_t>(h), what + " norm_w");
  if (hs == nullptr || norm == nullptr) return false;
  const float eps = a.F32("eps");
  for (int64_t r = 0; r < m; ++r) RmsNorm(hs + r * h, norm, h, eps, xn_rows->data() + r * h);
  return true;
}

// Σ_k x[k] · float(w[k]), fp32, in order.
float Dot(const float* x, const uint16_t* w, int64_t k) {
  float acc = 0;
  for (int64_t i = 0; i < k; ++i) acc += x[i] * Bf(w, static_cast<size_t>(i));
  return acc;
}

// A kernel of one program per row (grid.x) must have at least M of them.
void CheckRowGrid(const EmulatedLaunch& l, const char* kernel, int64_t m) {
  if (l.grid[0] < static_cast<uint64_t>(m)) {
    Error(absl::StrCat(kernel, ": grid.x ", l.grid[0], " < M ", m));
  }
}

void Embed(const EmulatedLaunch& l) {
  Args a(l);
  if (!a.ok()) return Error(absl::StrCat(l.entry, ": unknown parameter layout"));
  const int32_t m = a.I32("M"), h = a.I32("H");
  CheckRowGrid(l, "llama_embed", m);
  const int32_t* tokens =
      DeviceArray<int32_t>(a.Ptr("tokens"), static_cast<size_t>(m), "embed tokens");
  if (tokens == nullptr) return;
  for (int32_t r = 0; r < m; ++r) {
    if (tokens[r] < 0) return Error(absl::StrCat("llama_embed: token ", tokens[r], " in row ", r));
    const uint16_t* row = DeviceArray<uint16_t>(
        a.Ptr("table") + static_cast<size_t>(tokens[r]) * static_cast<size_t>(h) * 2,
        static_cast<size_t>(h), "embed table row");
    float* out =
        DeviceArray<float>(a.Ptr("h") + static_cast<size_t>(r) * static_cast<size_t>(h) * 4,
                           static_cast<size_t>(h), "embed h row");
    if (row == nullptr || out == nullptr) return;
    for (int32_t k = 0; k < h; ++k) out[k] = Bf(row, static_cast<size_t>(k));
  }
}

void RmsNormRows(const EmulatedLaunch& l) {
  Args a(l);
  if (!a.ok()) return Error(absl::StrCat(l.entry, ": unknown parameter layout"));
  const int64_t m = a.I32("M"), h = a.I32("H");
  CheckRowGrid(l, "llama_rmsnorm", m);
  const float* hs = DeviceArray<float>(a.Ptr("h"), static_cast<size_t>(m * h), "rmsnorm h");
  const uint16_t* norm =
      DeviceArray<uint16_t>(a.Ptr("norm_w"), static_cast<size_t>(h), "rmsnorm norm_w");
  uint16_t* xn = DeviceArray<uint16_t>(a.Ptr("xn"), static_cast<size_t>(m * h), "rmsnorm xn");
  if (!hs || !norm || !xn) return;
  std::vector<float> row(static_cast<size_t>(h));
  for (int64_t r = 0; r < m; ++r) {
    RmsNorm(hs + r * h, norm, h, a.F32("eps"), row.data());
    for (int64_t k = 0; k < h; ++k) xn[r * h + k] = FloatToBf16(row[static_cast<size_t>(k)]);
  }
}

void QkvRope(const EmulatedLaunch& l) {
  Args a(l);
  if (!a.ok()) return Error(absl::StrCat(l.entry, ": unknown parameter layout"));
  const int64_t m = a.I32("M"), h = a.I32("H"), nh = a.I32("NH"), nkv = a.I32("NKV"),
                cap = a.I32("CAP"), d = R().head_dim;
  const int64_t heads = nh + 2 * nkv;
  std::vector<float> xn;
  if (!NormedRows(a, m, h, "qkv", &xn)) return;
  const uint16_t* w =
      DeviceArray<uint16_t>(a.Ptr("w"), static_cast<size_t>(heads * d * h), "qkv w");
  const float* inv =
      DeviceArray<float>(a.Ptr("inv_freq"), static_cast<size_t>(d / 2), "qkv inv_freq");
  const int32_t* pos = DeviceArray<int32_t>(a.Ptr("pos"), static_cast<size_t>(m), "qkv pos");
  const int32_t* seq = DeviceArray<int32_t>(a.Ptr("seq"), static_cast<size_t>(m), "qkv seq");
  uint16_t* q = DeviceArray<uint16_t>(a.Ptr("q"), static_cast<size_t>(m * nh * d), "qkv q");
  if (!w || !inv || !pos || !seq || !q) return;
  std::vector<float> y(static_cast<size_t>(heads * d));
  for (int64_t r = 0; r < m; ++r) {
    if (pos[r] < 0) return Error(absl::StrCat("llama_qkv_rope: row ", r, " position ", pos[r]));
    const bool append = pos[r] < cap;  // docs/llama.md: past the cache, nothing is appended
    for (int64_t n = 0; n < heads * d; ++n)
      y[static_cast<size_t>(n)] = Dot(xn.data() + r * h, w + n * h, h);
    for (int64_t head = 0; head < heads; ++head) {
      uint16_t* out;
      const bool v_head = head >= nh + nkv;
      if (head < nh) {
        out = q + (r * nh + head) * d;
      } else {
        if (!append) continue;
        const int64_t g = head < nh + nkv ? head - nh : head - nh - nkv;
        const CUdeviceptr cache = v_head ? a.Ptr("v_cache") : a.Ptr("k_cache");
        out = DeviceArray<uint16_t>(
            cache + static_cast<size_t>(((seq[r] * nkv + g) * cap + pos[r]) * d) * 2,
            static_cast<size_t>(d), v_head ? "qkv v_cache row" : "qkv k_cache row");
        if (out == nullptr) return;
      }
      const float* yh = y.data() + head * d;
      for (int64_t j = 0; j < d / 2; ++j) {
        const float av = yh[j], bv = yh[j + d / 2];
        if (v_head) {
          out[j] = FloatToBf16(av);
          out[j + d / 2] = FloatToBf16(bv);
          continue;
        }
        const float angle = static_cast<float>(pos[r]) * inv[j];
        const float c = std::cos(angle), s = std::sin(angle);
        out[j] = FloatToBf16(av * c - bv * s);
        out[j + d / 2] = FloatToBf16(bv * c + av * s);
      }
    }
  }
}

// softmax(q·Kᵀ · scale) · V over positions [lo, hi) of one (sequence, kv head) of the
// cache: the unnormalized output, its max and its sum (max -inf, sum 0 when empty).
void AttendRange(const uint16_t* qh, const uint16_t* keys, const uint16_t* values, int64_t lo,
                 int64_t hi, int64_t d, float scale, float* o, float* mx, float* sum) {
  std::vector<float> scores(static_cast<size_t>(std::max<int64_t>(hi - lo, 0)));
  *mx = -std::numeric_limits<float>::infinity();
  for (int64_t p = lo; p < hi; ++p) {
    float acc = 0;
    for (int64_t i = 0; i < d; ++i)
      acc += Bf(qh, static_cast<size_t>(i)) * Bf(keys, static_cast<size_t>(p * d + i));
    scores[static_cast<size_t>(p - lo)] = acc * scale;
    *mx = std::max(*mx, acc * scale);
  }
  *sum = 0;
  std::fill(o, o + d, 0.0f);
  for (int64_t p = lo; p < hi; ++p) {
    const float e = std::exp(scores[static_cast<size_t>(p - lo)] - *mx);
    *sum += e;
    for (int64_t i = 0; i < d; ++i) o[i] += e * Bf(values, static_cast<size_t>(p * d + i));
  }
}

void AttnDecode(const EmulatedLaunch& l) {
  Args a(l);
  if (!a.ok()) return Error(absl::StrCat(l.entry, ": unknown parameter layout"));
  const int64_t m = a.I32("M"), nh = a.I32("NH"), nkv = a.I32("NKV"), cap = a.I32("CAP"),
                s_count = a.I32("S"), d = R().head_dim;
  const float scale = a.F32("sm_scale");
  const int64_t block_n = a.Constexpr("BLOCK_N").value_or(64);
  if (l.grid[0] < s_count || l.grid[1] < nkv || l.grid[2] < m) {
    Error(absl::StrCat("llama_attn_decode: grid (", l.grid[0], ", ", l.grid[1], ", ", l.grid[2],
                       ") < (S ", s_count, ", NKV ", nkv, ", M ", m, ")"));
  }
  const int32_t* pos = DeviceArray<int32_t>(a.Ptr("pos"), static_cast<size_t>(m), "attn pos");
  const int32_t* seq = DeviceArray<int32_t>(a.Ptr("seq"), static_cast<size_t>(m), "attn seq");
  int32_t* counters =
      DeviceArray<int32_t>(a.Ptr("counters"), static_cast<size_t>(m * nkv), "attn counters");
  const uint16_t* q = DeviceArray<uint16_t>(a.Ptr("q"), static_cast<size_t>(m * nh * d), "attn q");
  float* o_part = nullptr;
  float* ml_part = nullptr;
  if (s_count > 1) {
    o_part = DeviceArray<float>(a.Ptr("o_part"), static_cast<size_t>(m * nh * s_count * d),
                                "attn o_part");
    ml_part = DeviceArray<float>(a.Ptr("ml_part"), static_cast<size_t>(m * nh * s_count * 2),
                                 "attn ml_part");
    if (!o_part || !ml_part) return;
  }
  uint16_t* out = DeviceArray<uint16_t>(a.Ptr("out"), static_cast<size_t>(m * nh * d), "attn out");
  if (!pos || !seq || !counters || !q || !out) return;
  const int64_t group = nh / nkv;
  std::vector<float> o(static_cast<size_t>(d)), num(static_cast<size_t>(d));
  for (int64_t r = 0; r < m; ++r) {
    const int64_t len = pos[r] + 1;
    if (pos[r] < 0 || pos[r] >= cap) {
      return Error(
          absl::StrCat("llama_attn_decode: row ", r, " position ", pos[r], " outside CAP"));
    }
    // docs/llama.md: the splits with work follow from the row's KV tiles (up to
    // kDirectTiles: split 0 alone, writing out), whatever S is.
    const int64_t tiles = Cdiv(len, block_n);
    const int64_t per = tiles <= kDirectTiles ? tiles : Cdiv(tiles, s_count);
    const int64_t splits = Cdiv(tiles, per), chunk = per * block_n;
    for (int64_t g = 0; g < nkv; ++g) {
      if (counters[r * nkv + g] != 0) {
        Error(absl::StrCat("llama_attn_decode: counter of row ", r, " head ", g, " is ",
                           counters[r * nkv + g], " at the start"));
      }
      const size_t cache_row = static_cast<size_t>((seq[r] * nkv + g) * cap * d) * 2;
      const uint16_t* keys = DeviceArray<uint16_t>(a.Ptr("k_cache") + cache_row,
                                                   static_cast<size_t>(len * d), "attn k_cache");
      const uint16_t* values = DeviceArray<uint16_t>(a.Ptr("v_cache") + cache_row,
                                                     static_cast<size_t>(len * d), "attn v_cache");
      if (!keys || !values) return;
      for (int64_t head = g * group; head < (g + 1) * group; ++head) {
        if (splits == 1) {  // docs/llama.md: split 0 writes out, no partials
          float mx, sum;
          AttendRange(q + (r * nh + head) * d, keys, values, 0, len, d, scale, o.data(), &mx, &sum);
          for (int64_t i = 0; i < d; ++i)
            out[(r * nh + head) * d + i] = FloatToBf16(o[static_cast<size_t>(i)] / sum);
          continue;
        }
        const int64_t base = (r * nh + head) * s_count;
        for (int64_t s = 0; s < splits; ++s) {  // the idle splits write nothing
          const int64_t lo = s * chunk, hi = std::min((s + 1) * chunk, len);
          float mx, sum;
          AttendRange(q + (r * nh + head) * d, keys, values, lo, hi, d, scale, o.data(), &mx, &sum);
          std::copy(o.begin(), o.end(), o_part + (base + s) * d);
          ml_part[(base + s) * 2] = mx;
          ml_part[(base + s) * 2 + 1] = sum;
        }
        // The combine, in split order, from the partials in memory.
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s < splits; ++s) top = std::max(top, ml_part[(base + s) * 2]);
        float den = 0;
        std::fill(num.begin(), num.end(), 0.0f);
        for (int64_t s = 0; s < splits; ++s) {
          const float f = std::exp(ml_part[(base + s) * 2] - top);
          den += ml_part[(base + s) * 2 + 1] * f;
          for (int64_t i = 0; i < d; ++i)
            num[static_cast<size_t>(i)] += o_part[(base + s) * d + i] * f;
        }
        for (int64_t i = 0; i < d; ++i)
          out[(r * nh + head) * d + i] = FloatToBf16(num[static_cast<size_t>(i)] / den);
      }
    }
  }
}

void AttnPrefill(const EmulatedLaunch& l) {
  Args a(l);
  if (!a.ok()) return Error(absl::StrCat(l.entry, ": unknown parameter layout"));
  const int64_t m = a.I32("M"), nh = a.I32("NH"), nkv = a.I32("NKV"), cap = a.I32("CAP"),
                d = R().head_dim;
  const float scale = a.F32("sm_scale");
  if (l.grid[1] < nh) Error(absl::StrCat("llama_attn_prefill: grid.y ", l.grid[1], " < NH ", nh));
  const int32_t* pos = DeviceArray<int32_t>(a.Ptr("pos"), static_cast<size_t>(m), "prefill pos");
  const int32_t* seq = DeviceArray<int32_t>(a.Ptr("seq"), static_cast<size_t>(m), "prefill seq");
  const uint16_t* q =
      DeviceArray<uint16_t>(a.Ptr("q"), static_cast<size_t>(m * nh * d), "prefill q");
  uint16_t* out =
      DeviceArray<uint16_t>(a.Ptr("out"), static_cast<size_t>(m * nh * d), "prefill out");
  if (!pos || !seq || !q || !out) return;
  const int64_t group = nh / nkv;
  std::vector<float> o(static_cast<size_t>(d));
  for (int64_t r = 0; r < m; ++r) {
    const int64_t len = pos[r] + 1;
    if (pos[r] < 0 || pos[r] >= cap) {
      return Error(
          absl::StrCat("llama_attn_prefill: row ", r, " position ", pos[r], " outside CAP"));
    }
    if (seq[r] != seq[0]) Error("llama_attn_prefill: rows of one call in different sequences");
    for (int64_t head = 0; head < nh; ++head) {
      const int64_t g = head / group;
      const size_t cache_row = static_cast<size_t>((seq[r] * nkv + g) * cap * d) * 2;
      const uint16_t* keys = DeviceArray<uint16_t>(a.Ptr("k_cache") + cache_row,
                                                   static_cast<size_t>(len * d), "prefill k_cache");
      const uint16_t* values = DeviceArray<uint16_t>(
          a.Ptr("v_cache") + cache_row, static_cast<size_t>(len * d), "prefill v_cache");
      if (!keys || !values) return;
      float mx, sum;
      AttendRange(q + (r * nh + head) * d, keys, values, 0, len, d, scale, o.data(), &mx, &sum);
      for (int64_t i = 0; i < d; ++i)
        out[(r * nh + head) * d + i] = FloatToBf16(o[static_cast<size_t>(i)] / sum);
    }
  }
}

void ProjResidual(const EmulatedLaunch& l) {
  Args a(l);
  if (!a.ok()) return Error(absl::StrCat(l.entry, ": unknown parameter layout"));
  const int64_t m = a.I32("M"), n = a.I32("N"), k = a.I32("K");
  const uint16_t* x = DeviceArray<uint16_t>(a.Ptr("x"), static_cast<size_t>(m * k), "proj x");
  const uint16_t* w = DeviceArray<uint16_t>(a.Ptr("w"), static_cast<size_t>(n * k), "proj w");
  float* h = DeviceArray<float>(a.Ptr("h"), static_cast<size_t>(m * n), "proj h");
  if (!x || !w || !h) return;
  std::vector<float> xf(static_cast<size_t>(k));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i)
      xf[static_cast<size_t>(i)] = Bf(x, static_cast<size_t>(r * k + i));
    for (int64_t c = 0; c < n; ++c) h[r * n + c] += Dot(xf.data(), w + c * k, k);
  }
}

void GateUp(const EmulatedLaunch& l) {
  Args a(l);
  if (!a.ok()) return Error(absl::StrCat(l.entry, ": unknown parameter layout"));
  const int64_t m = a.I32("M"), h = a.I32("H"), inter = a.I32("I");
  std::vector<float> xn_rows;
  if (!NormedRows(a, m, h, "gate_up", &xn_rows)) return;
  const uint16_t* w =
      DeviceArray<uint16_t>(a.Ptr("w"), static_cast<size_t>(2 * inter * h), "gate_up w");
  uint16_t* out =
      DeviceArray<uint16_t>(a.Ptr("out"), static_cast<size_t>(m * inter), "gate_up out");
  if (!w || !out) return;
  for (int64_t r = 0; r < m; ++r) {
    const float* xn = xn_rows.data() + r * h;
    for (int64_t c = 0; c < inter; ++c) {
      const float g = Dot(xn, w + c * h, h), u = Dot(xn, w + (inter + c) * h, h);
      out[r * inter + c] = FloatToBf16(g / (1.0f + std::exp(-g)) * u);
    }
  }
}

void LmHead(const EmulatedLaunch& l) {
  Args a(l);
  if (!a.ok()) return Error(absl::StrCat(l.entry, ": unknown parameter layout"));
  const int64_t m = a.I32("M"), v = a.I32("V"), h = a.I32("H");
  const int32_t advance = a.I32("advance");
  const bool keep_logits = a.I32("keep_logits") != 0;  // else the logits stay untouched
  const std::optional<int64_t> block_n = a.Constexpr("BLOCK_N");
  std::vector<float> xn_rows;
  if (!NormedRows(a, m, h, "lm_head", &xn_rows)) return;
  const uint16_t* w = DeviceArray<uint16_t>(a.Ptr("w"), static_cast<size_t>(v * h), "lm_head w");
  float* logits = DeviceArray<float>(a.Ptr("logits"), static_cast<size_t>(m * v), "lm_head logits");
  int32_t* counters =
      DeviceArray<int32_t>(a.Ptr("counters"), static_cast<size_t>(m), "lm_head counters");
  int32_t* tokens = DeviceArray<int32_t>(a.Ptr("tokens"), static_cast<size_t>(m), "lm_head tokens");
  int32_t* pos = DeviceArray<int32_t>(a.Ptr("pos"), static_cast<size_t>(m), "lm_head pos");
  if (!w || !logits || !counters || !tokens || !pos) return;
  const int64_t programs = block_n.has_value() ? Cdiv(v, *block_n) : 0;
  float* part_max = nullptr;
  int32_t* part_idx = nullptr;
  if (programs > 0) {
    part_max = DeviceArray<float>(a.Ptr("part_max"), static_cast<size_t>((m - 1) * v + programs),
                                  "lm_head part_max");
    part_idx = DeviceArray<int32_t>(a.Ptr("part_idx"), static_cast<size_t>((m - 1) * v + programs),
                                    "lm_head part_idx");
    if (!part_max || !part_idx) return;
  }
  std::vector<float> y(static_cast<size_t>(v));
  for (int64_t r = 0; r < m; ++r) {
    if (counters[r] != 0)
      Error(absl::StrCat("llama_lm_head: counter of row ", r, " is ", counters[r]));
    const float* xn = xn_rows.data() + r * h;
    int32_t best = 0;
    for (int64_t c = 0; c < v; ++c) {
      y[c] = Dot(xn, w + c * h, h);
      if (y[c] > y[best]) best = static_cast<int32_t>(c);
    }
    for (int64_t p = 0; p < programs; ++p) {
      int64_t at = p * *block_n;
      for (int64_t c = at; c < std::min(v, (p + 1) * *block_n); ++c) {
        if (y[c] > y[at]) at = c;
      }
      part_max[r * v + p] = y[at];
      part_idx[r * v + p] = static_cast<int32_t>(at);
    }
    if (keep_logits) std::copy(y.begin(), y.end(), logits + r * v);
    tokens[r] = best;
    pos[r] += advance;
  }
}

using Emulator = void (*)(const EmulatedLaunch&);

Emulator EmulatorFor(const std::string& kernel) {
  if (kernel == "llama_embed") return Embed;
  if (kernel == "llama_rmsnorm") return RmsNormRows;
  if (kernel == "llama_qkv_rope") return QkvRope;
  if (kernel == "llama_attn_decode") return AttnDecode;
  if (kernel == "llama_attn_prefill") return AttnPrefill;
  if (kernel == "llama_o_proj" || kernel == "llama_down_proj") return ProjResidual;
  if (kernel == "llama_gate_up") return GateUp;
  if (kernel == "llama_lm_head") return LmHead;
  return nullptr;
}

// Counts the launch, then runs the kernel's emulator (registered per entry below).
template <Emulator kEmulator>
void Counted(const EmulatedLaunch& l) {
  R().launches.fetch_add(1);
  kEmulator(l);
}

fake::KernelEmulator CountedFor(Emulator e) {
  if (e == Embed) return Counted<Embed>;
  if (e == RmsNormRows) return Counted<RmsNormRows>;
  if (e == QkvRope) return Counted<QkvRope>;
  if (e == AttnDecode) return Counted<AttnDecode>;
  if (e == AttnPrefill) return Counted<AttnPrefill>;
  if (e == ProjResidual) return Counted<ProjResidual>;
  if (e == GateUp) return Counted<GateUp>;
  return Counted<LmHead>;
}

}  // namespace

float Bf16ToFloat(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToBf16(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

absl::Status InstallLlamaEmulators(const Pack& pack, int64_t head_dim) {
  Registry& r = R();
  std::map<std::string, std::vector<Layout>> layouts;
  std::map<std::string, Emulator> emulators;
  for (const KernelInfo& k : pack.kernels()) {
    const Emulator emulator = EmulatorFor(k.name);
    if (emulator == nullptr) continue;
    for (const VariantInfo& v : k.variants) {
      Layout layout;
      for (const LayoutSlotInfo& slot : v.layout) {
        layout.slots.emplace_back(static_cast<uint16_t>(slot.offset),
                                  static_cast<uint16_t>(slot.size));
        layout.names.push_back(slot.name);
      }
      const nlohmann::json constexprs = nlohmann::json::parse(v.constexprs_json);
      for (auto it = constexprs.begin(); it != constexprs.end(); ++it) {
        if (it->is_number_integer()) layout.constexprs[it.key()] = it->get<int64_t>();
      }
      auto& known = layouts[v.entry];
      auto same = std::find_if(known.begin(), known.end(),
                               [&](const Layout& k2) { return k2.slots == layout.slots; });
      if (same == known.end()) {
        known.push_back(std::move(layout));
      } else if (same->names != layout.names) {
        return absl::InvalidArgumentError(absl::StrCat(
            "entry '", v.entry, "': variants with one parameter layout and different names"));
      } else {
        // Keep only the constexprs every variant of this layout agrees on.
        for (auto it = same->constexprs.begin(); it != same->constexprs.end();) {
          auto other = layout.constexprs.find(it->first);
          it = other == layout.constexprs.end() || other->second != it->second
                   ? same->constexprs.erase(it)
                   : std::next(it);
        }
      }
      if (auto e = emulators.find(v.entry); e != emulators.end() && e->second != emulator) {
        return absl::InvalidArgumentError(
            absl::StrCat("entry '", v.entry, "' serves kernels of different math"));
      }
      emulators[v.entry] = emulator;
    }
  }
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.layouts = std::move(layouts);
    r.head_dim = head_dim;
    r.errors.clear();
    r.launches.store(0);
  }
  for (const auto& [entry, emulator] : emulators)
    fake::SetKernelEmulator(entry, CountedFor(emulator));
  return absl::OkStatus();
}

std::vector<std::string> TakeEmulatorErrors() {
  Registry& r = R();
  std::lock_guard<std::mutex> lock(r.mu);
  return std::exchange(r.errors, {});
}

int64_t EmulatedLaunches() { return R().launches.load(); }

}  // namespace kpack::llama::testing
