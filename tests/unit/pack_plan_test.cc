// PackArgs's packing plan (runtime/launch.h; built at Open, runtime/open.cc) against its
// reference path, PackEach: every argument in call order through PackArg / PackDesc into
// a zeroed buffer, which is what PackArgs did before it had a plan. For every variant of
// the test packs, with arguments of every kind at every position, the plan must give the
// same status (code and message: the first bad argument in call order) and, when it packs,
// the same bytes -- into a buffer that held garbage before, so a byte the plan forgets to
// write shows. Then the same through the public API, with the bytes a launch sends.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fake_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "launch/args.h"
#include "runtime/launch.h"
#include "runtime/runtime_impl.h"

namespace kpack::testing {
namespace {

using internal::ArgSlot;
using internal::ParamStorage;
using internal::ParamType;
using internal::RuntimeImpl;
using internal::VariantData;

struct Packed {
  absl::Status status;
  std::vector<std::byte> bytes;  // the variant's param_bytes, when it packed
};

std::unique_ptr<RuntimeImpl> OpenImpl(const std::string& dir) {
  auto rt = RuntimeImpl::Create(dir, FakeOptions());
  EXPECT_TRUE(rt.ok()) << dir << ": " << rt.status();
  return rt.ok() ? std::move(*rt) : nullptr;
}

// PackArgs into a buffer first filled with `garbage`.
Packed Plan(const RuntimeImpl& rt, const VariantData& v, std::span<const Arg> args,
            unsigned char garbage) {
  auto storage = std::make_unique<ParamStorage>();
  std::memset(storage->bytes, garbage, sizeof(storage->bytes));
  std::byte* const buf = storage->bytes + v.buffer_shift;
  Packed p{rt.PackArgs(v, args, buf), {}};
  if (p.status.ok()) p.bytes.assign(buf, buf + v.param_bytes);
  return p;
}

// The reference: a zeroed buffer, then PackEach.
Packed Reference(const RuntimeImpl& rt, const VariantData& v, std::span<const Arg> args) {
  auto storage = std::make_unique<ParamStorage>();
  std::memset(storage->bytes, 0, sizeof(storage->bytes));
  std::byte* const buf = storage->bytes + v.buffer_shift;
  Packed p{rt.PackEach(v, args, buf), {}};
  if (p.status.ok()) p.bytes.assign(buf, buf + v.param_bytes);
  return p;
}

// Compares the plan with the reference for `args`, from three different garbage fills;
// returns a description of the first difference, or "" when there is none.
std::string Difference(const RuntimeImpl& rt, const VariantData& v, std::span<const Arg> args) {
  const Packed want = Reference(rt, v, args);
  for (unsigned char garbage : {0x00, 0xa5, 0xff}) {
    const Packed got = Plan(rt, v, args, garbage);
    if (got.status != want.status) {
      return absl::StrCat("status: plan ", got.status.ToString(), "; reference ",
                          want.status.ToString());
    }
    for (size_t b = 0; b < want.bytes.size(); ++b) {
      if (got.bytes[b] != want.bytes[b]) {
        return absl::StrCat("byte ", b, " of ", want.bytes.size(), " (buffer filled with ", garbage,
                            " before): plan ", static_cast<int>(got.bytes[b]), ", reference ",
                            static_cast<int>(want.bytes[b]));
      }
    }
  }
  return "";
}

// One Arg of every kind, with values that fit their usual parameters and values that do
// not, and ones PackArg converts.
std::vector<Arg> KindPool(const TensorDesc& desc) {
  return {
      Arg(CUdeviceptr{0x10000}),
      Arg(reinterpret_cast<float*>(0x20000)),
      Arg(int32_t{-7}),
      Arg(int64_t{1} << 31),         // one past i32
      Arg(-(int64_t{1} << 31) - 1),  // one below i32
      Arg(std::numeric_limits<int64_t>::min()),
      Arg(uint32_t{7}),
      Arg(std::numeric_limits<uint64_t>::max()),  // kUnsigned (uint64_t is unsigned long)
      Arg(uint8_t{200}),
      Arg(true),
      Arg(1.5f),
      Arg(0.1),
      Arg(1e300),
      Arg(65520.0),  // rounds past fp16's range
      Arg(-std::numeric_limits<double>::quiet_NaN()),
      Arg(Half{0x3c00}),
      Arg(BFloat16{0x3f80}),
      Arg(desc),
  };
}

// A value of the kind a caller would pass for a parameter of `type` (argument `i`).
Arg Natural(ParamType type, size_t i, const TensorDesc* desc) {
  switch (type) {
    case ParamType::kPointer:
      return Arg(CUdeviceptr{0x100000 + 0x1000 * i});
    case ParamType::kI1:
    case ParamType::kU1:
      return Arg(true);
    case ParamType::kI8:
      return Arg(int8_t{-3});
    case ParamType::kI16:
      return Arg(int16_t{-300});
    case ParamType::kI32:
      return Arg(static_cast<int32_t>(64 * (i + 1)));
    case ParamType::kI64:
      return Arg((int64_t{1} << 40) + static_cast<int64_t>(i));
    case ParamType::kU8:
      return Arg(uint8_t{200});
    case ParamType::kU16:
      return Arg(uint16_t{60000});
    case ParamType::kU32:
      return Arg(uint32_t{4000000000u});
    case ParamType::kU64:
      return Arg((uint64_t{1} << 63) | i);
    case ParamType::kFp32:
      return Arg(1.25f + static_cast<float>(i));
    case ParamType::kFp64:
      return Arg(0.1 + static_cast<double>(i));
    case ParamType::kFp16:
      return Arg(1.0 + 0x1p-11 + 0x1p-40);  // one rounding: 0x3c01
    case ParamType::kBf16:
      return Arg(0.1);  // truncated: 0x3dcc
    case ParamType::kTensorDesc:
      return Arg(*desc);
    case ParamType::kConstexpr:
      break;
  }
  return Arg(int32_t{1});
}

// The test packs with every slot type kpack's packs use, eq1 variants (dispatchpack,
// examplepack, graphpack) and tensor descriptors with and without TMA.
const char* const kPacks[] = {KPACK_TEST_PACK_DIR, KPACK_DISPATCH_PACK_DIR, KPACK_SCALAR_PACK_DIR,
                              KPACK_DESC_PACK_DIR, KPACK_EXAMPLES_PACK_DIR, KPACK_GRAPH_PACK_DIR,
                              KPACK_ARCH_PACK_DIR};

class PackPlanTest : public FakeRuntimeTest {
 protected:
  // Every variant of `rt`'s kernels: natural arguments, each pool Arg at each position,
  // and random mixes; the plan must match the reference for all of them.
  void SweepRuntime(const RuntimeImpl& rt, const std::string& what) {
    std::mt19937 random(25);
    for (const auto& k : rt.kernels()) {
      for (const VariantData* v : k->variants) {
        const std::string where =
            absl::StrCat(what, " kernel '", k->spec->name, "' variant '", v->spec->name, "'");
        ++variants_;
        // The descriptors: contiguous, 64 elements per dimension, at an aligned address.
        std::vector<TensorDesc> descs(v->desc_slots.size());
        for (size_t d = 0; d < descs.size(); ++d) {
          descs[d].base = 0x400000;
          descs[d].rank = v->desc_slots[d].rank;
          int64_t stride = 1;
          for (int r = descs[d].rank; r-- > 0;) {
            descs[d].shape[r] = 64;
            descs[d].strides[r] = stride;
            stride *= 64;
          }
        }
        std::vector<Arg> natural;
        for (size_t i = 0; i < v->arg_slots.size(); ++i) {
          const ArgSlot& slot = v->arg_slots[i];
          const bool desc = slot.type == ParamType::kTensorDesc;
          natural.push_back(slot.offset == ArgSlot::kDropped
                                ? Arg(int32_t{1})
                                : Natural(slot.type, i, desc ? &descs[slot.desc] : nullptr));
        }
        Check(rt, *v, natural, where + " natural arguments");
        const Packed packed = Plan(rt, *v, natural, 0xa5);
        EXPECT_TRUE(packed.status.ok()) << where << ": " << packed.status;
        const TensorDesc pool_desc =
            descs.empty() ? TensorDesc::RowMajor(0x400000, {64}) : descs[0];
        const std::vector<Arg> pool = KindPool(pool_desc);
        for (size_t i = 0; i < natural.size(); ++i) {
          for (size_t p = 0; p < pool.size(); ++p) {
            std::vector<Arg> args = natural;
            args[i] = pool[p];
            Check(rt, *v, args, absl::StrCat(where, " pool[", p, "] at argument ", i));
          }
        }
        for (int round = 0; round < 40; ++round) {
          std::vector<Arg> args = natural;
          for (Arg& a : args) {
            if (random() % 3 == 0) a = pool[random() % pool.size()];
          }
          Check(rt, *v, args, absl::StrCat(where, " random mix ", round));
        }
      }
    }
  }

  void Check(const RuntimeImpl& rt, const VariantData& v, std::span<const Arg> args,
             const std::string& where) {
    ++cases_;
    const Packed want = Reference(rt, v, args);
    (want.status.ok() ? ok_ : errors_)++;
    const std::string diff = Difference(rt, v, args);
    if (!diff.empty() && first_difference_.empty()) first_difference_ = where + ": " + diff;
    if (!diff.empty()) ++differences_;
  }

  int variants_ = 0, cases_ = 0, ok_ = 0, errors_ = 0, differences_ = 0;
  std::string first_difference_;
};

TEST_F(PackPlanTest, MatchesThePackEachReferenceForEveryVariantAndArgumentKind) {
  for (const char* dir : kPacks) {
    std::unique_ptr<RuntimeImpl> rt = OpenImpl(dir);
    ASSERT_NE(rt, nullptr);
    SweepRuntime(*rt, dir);
  }
  EXPECT_EQ(differences_, 0) << differences_ << " of " << cases_
                             << " calls differ; the first: " << first_difference_;
  // The sweep really packs and really refuses.
  EXPECT_GT(variants_, 90);
  EXPECT_GT(ok_, 1000);
  EXPECT_GT(errors_, 1000);
}

// The test pack's `scalars` with its i64 parameter `big` made `type` (same slot size, so
// the cubin's layout still matches): u64 and fp64 slots, which no test pack has.
class RetypedScalars {
 public:
  explicit RetypedScalars(const std::string& type) {
    for (auto& p : pack_.kernel("scalars")["params"]) {
      if (p["name"] == "big") p["type"] = type;
    }
    pack_.Save();
    rt_ = OpenImpl(pack_.dir());
  }
  const RuntimeImpl* rt() const { return rt_.get(); }
  const VariantData& variant() const { return *rt_->FindKernel("scalars")->variants[0]; }

 private:
  TempPack pack_;
  std::unique_ptr<RuntimeImpl> rt_;
};

// x_ptr, out_ptr, n (i32), alpha (fp32), beta (bf16), gamma (fp16), flag (i1), big.
std::vector<Arg> ScalarsArgs(Arg big) {
  return {Arg(CUdeviceptr{0x1000}),
          Arg(reinterpret_cast<float*>(0x2000)),
          Arg(int32_t{-9}),
          Arg(0.1),
          Arg(0.1),
          Arg(1.0 + 0x1p-11 + 0x1p-40),
          Arg(true),
          big};
}

TEST_F(PackPlanTest, U64AndFp64SlotsMatchTheReference) {
  for (const char* type : {"u64", "fp64", "i64"}) {
    RetypedScalars scalars(type);
    ASSERT_NE(scalars.rt(), nullptr) << type;
    const VariantData& v = scalars.variant();
    for (Arg big : {Arg(CUdeviceptr{0xfedcba9876543210}), Arg(std::numeric_limits<uint64_t>::max()),
                    Arg(uint32_t{5}), Arg(int64_t{42}), Arg(int64_t{-42}), Arg(2.75), Arg(2.75f),
                    Arg(reinterpret_cast<void*>(0x3000)), Arg(true), Arg(Half{1})}) {
      const std::vector<Arg> args = ScalarsArgs(big);
      EXPECT_EQ(Difference(*scalars.rt(), v, args), "")
          << type << ", big of kind " << ArgKindName(big.kind());
    }
    SweepRuntime(*scalars.rt(), type);
  }
  EXPECT_EQ(differences_, 0) << first_difference_;
}

// The bytes themselves, from a buffer full of garbage: each value where the layout puts
// it, converted as Triton converts it, and zeros in the gap (29..31) and the scratch
// pointers (40..55).
TEST_F(PackPlanTest, WritesEveryByteOfTheBuffer) {
  RetypedScalars scalars("u64");
  ASSERT_NE(scalars.rt(), nullptr);
  const VariantData& v = scalars.variant();
  ASSERT_EQ(v.param_bytes, 56u);
  const Packed p = Plan(*scalars.rt(), v, ScalarsArgs(Arg(CUdeviceptr{0x8877665544332211})), 0xa5);
  ASSERT_TRUE(p.status.ok()) << p.status;
  auto at = [&](size_t offset, auto zero) {
    decltype(zero) value;
    std::memcpy(&value, p.bytes.data() + offset, sizeof(value));
    return value;
  };
  EXPECT_EQ(at(0, uint64_t{}), 0x1000u);
  EXPECT_EQ(at(8, uint64_t{}), 0x2000u);
  EXPECT_EQ(at(16, int32_t{}), -9);
  EXPECT_EQ(at(20, float{}), 0.1f);       // a double rounded to float
  EXPECT_EQ(at(24, uint16_t{}), 0x3dcc);  // bf16: truncated
  EXPECT_EQ(at(26, uint16_t{}), 0x3c01);  // fp16: one rounding
  EXPECT_EQ(at(28, uint8_t{}), 1);
  for (size_t b : {29, 30, 31}) EXPECT_EQ(at(b, uint8_t{}), 0) << "gap byte " << b;
  EXPECT_EQ(at(32, uint64_t{}), 0x8877665544332211u);
  EXPECT_EQ(at(40, uint64_t{}), 0u) << "$global_scratch";
  EXPECT_EQ(at(48, uint64_t{}), 0u) << "$profile_scratch";
}

// The first bad argument in call order is the one named, whichever of the plan's groups
// (8-byte, i32, fp32, generic) the bad ones fall in, with the reference's exact message.
TEST_F(PackPlanTest, NamesTheFirstBadArgumentInCallOrder) {
  RetypedScalars scalars("u64");
  ASSERT_NE(scalars.rt(), nullptr);
  const RuntimeImpl& rt = *scalars.rt();
  const VariantData& v = scalars.variant();
  std::vector<Arg> args = ScalarsArgs(Arg(int64_t{-1}));  // big (u64, 8-byte group): bad
  args[5] = Arg(1e6);               // gamma (fp16, generic): past fp16's range
  args[2] = Arg(int64_t{1} << 31);  // n (i32 group): does not fit
  absl::Status s = Plan(rt, v, args, 0xa5).status;
  EXPECT_EQ(s, internal::ArgError("scalars", 2, "n", "i32", args[2]));
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("argument 2 ('n') expects i32, got a signed integer 2147483648 "
                                   "that does not fit"));
  args[2] = Arg(int32_t{3});
  EXPECT_EQ(Plan(rt, v, args, 0xa5).status,
            internal::ArgError("scalars", 5, "gamma", "fp16", args[5]));
  args[5] = Arg(Half{0x3c00});
  EXPECT_EQ(Plan(rt, v, args, 0xa5).status,
            internal::ArgError("scalars", 7, "big", "u64", args[7]));
  args[0] = Arg(1.5f);  // x_ptr (8-byte group), before everything else
  EXPECT_EQ(Plan(rt, v, args, 0xa5).status,
            internal::ArgError("scalars", 0, "x_ptr", "*fp32", args[0]));
  args[0] = Arg(CUdeviceptr{0x1000});
  args[7] = Arg(int64_t{1});  // converted by PackArg: the plan's check fails, the call packs
  const Packed p = Plan(rt, v, args, 0xa5);
  ASSERT_TRUE(p.status.ok()) << p.status;
  uint64_t big = 0;
  std::memcpy(&big, p.bytes.data() + 32, 8);
  EXPECT_EQ(big, 1u);
  EXPECT_EQ(Difference(rt, v, args), "");
}

// An eq1 argument has no slot: nothing is packed for it and its kind is not checked
// (dispatch chose the variant because it is 1).
TEST_F(PackPlanTest, SkipsEq1Arguments) {
  std::unique_ptr<RuntimeImpl> rt = OpenImpl(KPACK_DISPATCH_PACK_DIR);
  ASSERT_NE(rt, nullptr);
  const VariantData* unit = nullptr;
  for (const VariantData* v : rt->FindKernel("axpy")->variants) {
    if (v->spec->name == "b0_div16_unit") unit = v;
  }
  ASSERT_NE(unit, nullptr);
  ASSERT_EQ(unit->arg_slots[4].offset, ArgSlot::kDropped);  // stride_x
  std::vector<Arg> args = {Arg(CUdeviceptr{0x1000}), Arg(CUdeviceptr{0x2000}),
                           Arg(CUdeviceptr{0x3000}), Arg(int32_t{64}),
                           Arg(int32_t{1}),          Arg(2.5f)};
  for (Arg stride : {Arg(int32_t{1}), Arg(1.5), Arg(reinterpret_cast<void*>(0x10))}) {
    args[4] = stride;
    const Packed p = Plan(*rt, *unit, args, 0xa5);
    ASSERT_TRUE(p.status.ok()) << p.status;
    float alpha = 0;
    std::memcpy(&alpha, p.bytes.data() + 28, 4);  // alpha moved up into stride_x's place
    EXPECT_EQ(alpha, 2.5f);
    EXPECT_EQ(Difference(*rt, *unit, args), "");
  }
}

// Through the public API: the bytes a launch sends (from a buffer on the stack), and a
// BoundLaunch whose Set moves it to another variant, which repacks the whole buffer.
TEST_F(PackPlanTest, LaunchAndBoundLaunchSendThePlansBytes) {
  Runtime rt = Open();
  const Kernel scalars = *rt.Find("scalars");
  KP_ASSERT_OK(scalars.Launch(Grid{1, 1, 1}, nullptr, CUdeviceptr{0x1000},
                              reinterpret_cast<float*>(0x2000), int32_t{-9}, 0.1, 0.1,
                              1.0 + 0x1p-11 + 0x1p-40, true, int64_t{-5}));
  const fake::LaunchRecord r = LastLaunch();
  ASSERT_EQ(r.param_size, 56u);
  EXPECT_EQ(At<float>(r, 20), 0.1f);
  EXPECT_EQ(At<uint16_t>(r, 24), 0x3dcc);
  EXPECT_EQ(At<uint16_t>(r, 26), 0x3c01);
  EXPECT_EQ(At<uint8_t>(r, 28), 1);
  EXPECT_EQ(At<uint8_t>(r, 29) | At<uint8_t>(r, 30) | At<uint8_t>(r, 31), 0);
  EXPECT_EQ(At<int64_t>(r, 32), -5);

  // axpy's stride_x chooses between variants that pass it and ones that drop it (eq1), so
  // Set repacks into another layout.
  Runtime dispatch = Open(KPACK_DISPATCH_PACK_DIR);
  const Kernel axpy = *dispatch.Find("axpy");
  auto bound = axpy.BindArgs(Grid{1, 1, 1}, nullptr, CUdeviceptr{0x1000}, CUdeviceptr{0x2000},
                             CUdeviceptr{0x3000}, int32_t{64}, int32_t{3}, 2.5);
  ASSERT_TRUE(bound.ok()) << bound.status();
  KP_ASSERT_OK(bound->Launch());
  EXPECT_EQ(At<int32_t>(LastLaunch(), 28), 3);
  EXPECT_EQ(At<float>(LastLaunch(), 32), 2.5f);
  KP_ASSERT_OK(bound->Set(4, int32_t{1}));
  KP_ASSERT_OK(bound->Launch());
  const fake::LaunchRecord unit = LastLaunch();
  ASSERT_EQ(unit.param_size, 48u);
  EXPECT_EQ(At<float>(unit, 28), 2.5f);
  for (size_t b = 32; b < 48; ++b) EXPECT_EQ(At<uint8_t>(unit, b), 0) << "byte " << b;
  // And back: the generic variant's layout again, whole.
  KP_ASSERT_OK(bound->Set(4, int32_t{3}));
  KP_ASSERT_OK(bound->Launch());
  EXPECT_EQ(At<int32_t>(LastLaunch(), 28), 3);
  EXPECT_EQ(At<float>(LastLaunch(), 32), 2.5f);
}

}  // namespace
}  // namespace kpack::testing
