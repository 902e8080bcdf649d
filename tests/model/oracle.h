// The model test's oracle (model_test.cc): which kernels it launches, how it makes their
// arguments, and what each launch computes, written from the kernels' definitions
// (tools/README.md) independently of kpack. The fake driver runs the same kernels through
// the conformance suite's emulators (tests/conformance/emulators.h); the model applies
// these effects to its own copy of every buffer, and the two must agree byte for byte.

#ifndef KPACK_TESTS_MODEL_ORACLE_H_
#define KPACK_TESTS_MODEL_ORACLE_H_

#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kpack/kpack.h"

namespace kpack::model {

// Deterministic randomness: splitmix64, and ranges by modulo (the same on every
// standard library, unlike std::uniform_int_distribution).
class Rng {
 public:
  // The seed mixed first: consecutive seeds must not give shifted copies of one sequence.
  explicit Rng(uint64_t seed) : state_(Mix(seed ^ 0x5851f42d4c957f2dull)) {}
  uint64_t Next() { return Mix(state_ += 0x9e3779b97f4a7c15ull); }
  // Uniform in [lo, hi].
  int64_t Range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool Percent(int p) { return Range(0, 99) < p; }
  size_t Index(size_t n) { return static_cast<size_t>(Range(0, static_cast<int64_t>(n) - 1)); }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[Index(v.size())];
  }
  // A float with few significant bits, so that sums and products are exact enough to be
  // readable in a trace (the comparison is bitwise either way).
  float SmallFloat() { return static_cast<float>(Range(-64, 64)) / 8.0f; }

 private:
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

// What a kernel computes (the oracle's side of an emulator).
enum class Sem { kAdd, kPdl, kCluster, kScratch, kScalars, kAxpy, kVectorAdd, kFill };

struct KernelDef {
  const char* pack;  // the directory under kernels/
  const char* name;
  Sem sem;
  bool expr_grid;  // the manifest has grid expressions (else a launch needs a grid)
  bool scratch;    // Triton global scratch (128 bytes per program)
  bool tolerant;   // kpack/2 grid_tolerance: a StepGraph pads its grid to the bucket's edge
};

inline const std::vector<KernelDef>& Kernels() {
  static const std::vector<KernelDef> kernels = {
      {"testpack", "add", Sem::kAdd, false, false, false},
      {"testpack", "pdl", Sem::kPdl, false, false, false},
      {"testpack", "cluster", Sem::kCluster, false, false, false},
      {"testpack", "scratch", Sem::kScratch, false, true, false},
      {"testpack", "scalars", Sem::kScalars, false, false, false},
      {"dispatchpack", "axpy", Sem::kAxpy, true, false, false},
      {"graphpack", "vector_add", Sem::kVectorAdd, true, false, true},
      {"scalarpack", "fill", Sem::kFill, false, false, false},
  };
  return kernels;
}

// One argument as the model holds it: a pointer is a buffer and a byte offset, so that
// the oracle can compute on the model's copy of the buffer.
struct MArg {
  enum Kind : uint8_t { kPtr, kI32, kI64, kF32, kF64, kHalf, kBf16, kBool };
  Kind kind = kI32;
  int buf = -1;
  uint64_t off = 0;  // bytes into `buf`
  int64_t i = 0;
  double f = 0;
  uint16_t bits = 0;

  static MArg Ptr(int buf, uint64_t off) { return {kPtr, buf, off}; }
  static MArg I32(int64_t v) { return {kI32, -1, 0, v}; }
  static MArg I64(int64_t v) { return {kI64, -1, 0, v}; }
  static MArg F32(double v) { return {kF32, -1, 0, 0, v}; }
  static MArg F64(double v) { return {kF64, -1, 0, 0, v}; }
  static MArg Half(uint16_t b) { return {kHalf, -1, 0, 0, 0, b}; }
  static MArg Bf16(uint16_t b) { return {kBf16, -1, 0, 0, 0, b}; }
  static MArg Bool(bool b) { return {kBool, -1, 0, b ? 1 : 0}; }

  std::string Text() const {
    switch (kind) {
      case kPtr:
        return absl::StrCat("b", buf, "+", off);
      case kI32:
        return absl::StrCat(i);
      case kI64:
        return absl::StrCat(i, "L");
      case kF32:
        return absl::StrCat(f, "f");
      case kF64:
        return absl::StrCat(f, "d");
      case kHalf:
        return absl::StrCat("h", bits);
      case kBf16:
        return absl::StrCat("bf", bits);
      case kBool:
        return i ? "true" : "false";
    }
    return "?";
  }
};

inline std::string ArgsText(const std::vector<MArg>& args) {
  std::string out = "(";
  for (size_t i = 0; i < args.size(); ++i) absl::StrAppend(&out, i ? ", " : "", args[i].Text());
  return out + ")";
}

inline std::string GridText(const Grid& g) { return absl::StrCat("[", g.x, ",", g.y, ",", g.z, "]"); }
inline uint64_t Programs(const Grid& g) { return uint64_t{g.x} * g.y * g.z; }
inline uint32_t Cdiv(int64_t a, int64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

// The model's copy of device memory: one byte vector per buffer.
struct Memory {
  std::vector<std::vector<uint8_t>> bytes;

  size_t size(int buf) const { return bytes[buf].size(); }
  template <typename T>
  T Load(const MArg& p, int64_t index) const {
    T v;
    std::memcpy(&v, bytes[p.buf].data() + p.off + index * sizeof(T), sizeof(T));
    return v;
  }
  template <typename T>
  void Store(const MArg& p, int64_t index, T v) {
    std::memcpy(bytes[p.buf].data() + p.off + index * sizeof(T), &v, sizeof(T));
  }
  // Whether `elements` elements of `elem_size` bytes fit at pointer `p`.
  bool Fits(const MArg& p, int64_t elements, size_t elem_size) const {
    if (p.kind != MArg::kPtr || p.buf < 0 || p.buf >= static_cast<int>(bytes.size())) return false;
    if (elements <= 0) return true;
    return p.off + static_cast<uint64_t>(elements) * elem_size <= bytes[p.buf].size();
  }
};

// One launch as it executes: the kernel's semantics, its arguments and the exact grid
// (a graph may launch a larger one; the programs beyond it mask themselves out).
struct Effect {
  Sem sem;
  std::vector<MArg> args;
  Grid grid;
};

// The size argument that decides an expression grid (and its bucket), and the block.
inline int64_t SizeArg(Sem sem, const std::vector<MArg>& args) {
  return sem == Sem::kAxpy || sem == Sem::kVectorAdd ? args[3].i : 0;
}

// Whether arguments that kpack accepts make the kernel touch only memory it was given:
// the oracle launches only such (an out-of-bounds launch is the caller's bug, not
// kpack's, and the emulators would record it as a fault).
inline bool InBounds(const Memory& m, Sem sem, const std::vector<MArg>& a, const Grid& grid) {
  const int64_t programs = static_cast<int64_t>(std::min<uint64_t>(Programs(grid), 1 << 30));
  switch (sem) {
    case Sem::kAdd: {
      const int64_t n = std::min<int64_t>(a[3].i, programs * 1024);
      return a[3].i >= 0 && m.Fits(a[0], n, 4) && m.Fits(a[1], n, 4) && m.Fits(a[2], n, 4);
    }
    case Sem::kPdl:
    case Sem::kCluster:
    case Sem::kScalars: {
      const int64_t n = std::min<int64_t>(a[2].i, programs * (sem == Sem::kScalars ? 256 : 1024));
      return a[2].i >= 0 && m.Fits(a[0], n, 4) && m.Fits(a[1], n, 4);
    }
    case Sem::kScratch: {
      const int64_t rows = std::min<int64_t>(a[2].i, int64_t{grid.x} * 32);
      const int64_t cols = std::min<int64_t>(a[3].i, int64_t{grid.y} * 32);
      if (rows <= 0 || cols <= 0) return true;
      const int64_t extent = (rows - 1) * a[4].i + cols;
      return a[4].i >= 0 && m.Fits(a[0], extent, 4) && m.Fits(a[1], extent, 4);
    }
    case Sem::kAxpy: {
      const int64_t n = a[3].i, stride = a[4].i;
      return n >= 0 && stride >= 1 && m.Fits(a[0], n > 0 ? (n - 1) * stride + 1 : 0, 4) &&
             m.Fits(a[1], n, 4) && m.Fits(a[2], n, 4);
    }
    case Sem::kVectorAdd: {
      const int64_t n = std::min<int64_t>(std::max<int64_t>(a[3].i, 0), programs * 1024);
      return m.Fits(a[0], n, 4) && m.Fits(a[1], n, 4) && m.Fits(a[2], n, 4);
    }
    case Sem::kFill: {
      const int64_t n = std::min<int64_t>(a[4].i, programs * 128);
      return a[4].i >= 0 && m.Fits(a[0], n, 2) && m.Fits(a[1], n, 2) && m.Fits(a[2], n, 4) &&
             m.Fits(a[3], n, 8);
    }
  }
  return false;
}

// What the launch computes, in the order the kernel computes it (so that overlapping
// arguments give the same bytes as the emulator).
inline void Apply(Memory& m, const Effect& e) {
  const std::vector<MArg>& a = e.args;
  const int64_t programs = static_cast<int64_t>(Programs(e.grid));
  switch (e.sem) {
    case Sem::kAdd: {
      const int64_t n = std::min<int64_t>(a[3].i, programs * 1024);
      for (int64_t i = 0; i < n; ++i) {
        m.Store<float>(a[2], i, m.Load<float>(a[0], i) + m.Load<float>(a[1], i));
      }
      return;
    }
    case Sem::kPdl:
    case Sem::kCluster: {
      const int64_t n = std::min<int64_t>(a[2].i, programs * 1024);
      for (int64_t i = 0; i < n; ++i) {
        const float x = m.Load<float>(a[0], i);
        m.Store<float>(a[1], i, e.sem == Sem::kPdl ? x * 2 : std::fma(x, 3.0f, 1.0f));
      }
      return;
    }
    case Sem::kScratch: {
      const int64_t rows = std::min<int64_t>(a[2].i, int64_t{e.grid.x} * 32);
      const int64_t cols = std::min<int64_t>(a[3].i, int64_t{e.grid.y} * 32);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t at = r * a[4].i + c;
          m.Store<float>(a[1], at, m.Load<float>(a[0], at) * 2);
        }
      }
      return;
    }
    case Sem::kScalars:  // launched for its argument checks only: no emulator runs it
      return;
    case Sem::kAxpy: {
      const float alpha = static_cast<float>(a[5].f);
      for (int64_t i = 0; i < a[3].i; ++i) {
        volatile float prod = alpha * m.Load<float>(a[0], i * a[4].i);  // rounded on its own
        m.Store<float>(a[2], i, prod + m.Load<float>(a[1], i));
      }
      return;
    }
    case Sem::kVectorAdd: {
      const int64_t n = std::min<int64_t>(std::max<int64_t>(a[3].i, 0), programs * 1024);
      for (int64_t i = 0; i < n; ++i) {
        m.Store<float>(a[2], i, m.Load<float>(a[0], i) + m.Load<float>(a[1], i));
      }
      return;
    }
    case Sem::kFill: {
      const int64_t n = std::min<int64_t>(a[4].i, programs * 128);
      const float f = static_cast<float>(a[7].f);
      const double d = a[8].f;
      // One array after another (overlapping outputs: the later one wins).
      for (int64_t i = 0; i < n; ++i) m.Store<uint16_t>(a[0], i, a[5].bits);
      for (int64_t i = 0; i < n; ++i) m.Store<uint16_t>(a[1], i, a[6].bits);
      for (int64_t i = 0; i < n; ++i) m.Store<float>(a[2], i, f);
      for (int64_t i = 0; i < n; ++i) m.Store<double>(a[3], i, d);
      return;
    }
  }
}

}  // namespace kpack::model

#endif  // KPACK_TESTS_MODEL_ORACLE_H_
