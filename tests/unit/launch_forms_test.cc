// The launch path's grouped forms against the references they replaced, on random
// arguments of every kind for every kernel and variant of the test packs:
//  - DispatchTable::Select (its property tests grouped by kind, no branch per property)
//    against SelectReference (every property through Holds): the same variant, the same
//    fallback flag, the same refusal;
//  - GridExpr::Evaluate (a constant and cdiv(argument, C) computed inline) against
//    EvaluateProgram (the interpreter): the same success and the same value.
// The packing plan has its own differential test (pack_plan_test.cc).

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dispatch/dispatch.h"
#include "dispatch/grid_expr.h"
#include "fake_runtime.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "runtime/runtime_impl.h"

namespace kpack::testing {
namespace {

using internal::DispatchTable;
using internal::KernelData;
using internal::RuntimeImpl;
using internal::VariantData;

// Values around every edge a property, a bucket or a grid tests: multiples of 16 and
// not, 1, the i8..i64 and u8..u64 limits and one past them, bucket edges of the test
// packs, negatives.
const uint64_t kValues[] = {0,
                            1,
                            2,
                            15,
                            16,
                            17,
                            32,
                            48,
                            64,
                            127,
                            128,
                            255,
                            256,
                            4096,
                            4097,
                            262144,
                            262160,
                            uint64_t{INT32_MAX},
                            uint64_t{INT32_MAX} + 1,
                            uint64_t{UINT32_MAX},
                            uint64_t{UINT32_MAX} + 1,
                            uint64_t{INT64_MAX},
                            uint64_t{INT64_MAX} + 1,
                            UINT64_MAX,
                            static_cast<uint64_t>(int64_t{-1}),
                            static_cast<uint64_t>(int64_t{-16}),
                            static_cast<uint64_t>(int64_t{INT32_MIN}),
                            static_cast<uint64_t>(int64_t{INT32_MIN} - 1),
                            static_cast<uint64_t>(int64_t{-129}),
                            static_cast<uint64_t>(int64_t{-32768}),
                            0x10000,
                            0x10004,
                            0x10010};

// An Arg of a random kind holding one of kValues, a random value or a small random one,
// as that kind's C++ type would.
Arg RandomArg(std::mt19937_64& random) {
  uint64_t v = kValues[random() % std::size(kValues)];
  if (random() % 4 == 0) v = random();                                          // anything
  if (random() % 4 == 0) v = static_cast<uint64_t>(int64_t(random() % 70000) - 35000);  // small
  switch (random() % 12) {
    case 0:
    case 1:
      return Arg(static_cast<int64_t>(v));
    case 2:
      return Arg(static_cast<int32_t>(v));
    case 3:
      return Arg(static_cast<uint64_t>(v));  // kUnsigned (uint64_t is unsigned long)
    case 4:
      return Arg(static_cast<uint32_t>(v));
    case 5:
    case 6:
      return Arg(CUdeviceptr{v});
    case 7:
      return Arg(reinterpret_cast<void*>(v));
    case 8:
      return Arg(v % 2 == 0);
    case 9:
      return Arg(static_cast<float>(static_cast<int64_t>(v)));
    case 10:
      return Arg(static_cast<double>(v));
    default:
      return Arg(Half{static_cast<uint16_t>(v)});
  }
}

// The test packs: buckets, div16 and eq1 assumptions, integer-width variants (kFits).
const char* const kPacks[] = {KPACK_TEST_PACK_DIR, KPACK_DISPATCH_PACK_DIR, KPACK_SCALAR_PACK_DIR,
                              KPACK_DESC_PACK_DIR, KPACK_EXAMPLES_PACK_DIR, KPACK_GRAPH_PACK_DIR,
                              KPACK_ARCH_PACK_DIR};

class LaunchFormsTest : public FakeRuntimeTest {};

TEST_F(LaunchFormsTest, SelectMatchesItsReferenceOnRandomArguments) {
  std::mt19937_64 random(25);
  int kernels = 0, calls = 0, chosen = 0, refused = 0, fallbacks = 0;
  for (const char* dir : kPacks) {
    auto rt = RuntimeImpl::Create(dir, FakeOptions());
    ASSERT_TRUE(rt.ok()) << dir << ": " << rt.status();
    for (const auto& k : (*rt)->kernels()) {
      ++kernels;
      const DispatchTable& table = k->dispatch;
      for (int round = 0; round < 3000; ++round) {
        std::vector<Arg> args;
        for (size_t i = 0; i < k->num_args; ++i) args.push_back(RandomArg(random));
        const DispatchTable::Choice got = table.Select(args);
        const DispatchTable::Choice want = table.SelectReference(args);
        ++calls;
        ASSERT_EQ(got.variant, want.variant) << dir << " kernel '" << k->spec->name << "' round "
                                             << round;
        ASSERT_EQ(got.fallback, want.fallback) << dir << " kernel '" << k->spec->name
                                               << "' round " << round;
        (want.variant >= 0 ? chosen : refused)++;
        fallbacks += want.fallback;
      }
    }
  }
  // The sweep reaches every outcome.
  EXPECT_GT(kernels, 20);
  EXPECT_GT(chosen, 1000);
  EXPECT_GT(refused, 1000);
  EXPECT_GT(fallbacks, 1000);
}

TEST_F(LaunchFormsTest, GridFormsMatchTheInterpreterOnRandomArguments) {
  std::mt19937_64 random(26);
  int read_args = 0, evaluated = 0, failed = 0;
  for (const char* dir : kPacks) {
    auto rt = RuntimeImpl::Create(dir, FakeOptions());
    ASSERT_TRUE(rt.ok()) << dir << ": " << rt.status();
    for (const auto& k : (*rt)->kernels()) {
      for (const VariantData* v : k->variants) {
        for (int axis = 0; axis < 3; ++axis) {
          const internal::GridExpr& g = v->grid[axis];
          read_args += !g.constant().has_value();
          for (int round = 0; round < 200; ++round) {
            std::vector<Arg> args;
            for (size_t i = 0; i < k->num_args; ++i) args.push_back(RandomArg(random));
            int64_t got = -7, want = -7;
            const bool got_ok = g.Evaluate(args, &got);
            const bool want_ok = g.EvaluateProgram(args, &want);
            ASSERT_EQ(got_ok, want_ok) << dir << " kernel '" << k->spec->name << "' axis " << axis;
            if (want_ok) {
              ASSERT_EQ(got, want) << dir << " kernel '" << k->spec->name << "' axis " << axis;
              ++evaluated;
            } else {
              ++failed;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(read_args, 10);  // expressions that read arguments, not only constants
  EXPECT_GT(evaluated, 10000);
  EXPECT_GT(failed, 1000);  // non-integer and out-of-range arguments, overflows
}

}  // namespace
}  // namespace kpack::testing
