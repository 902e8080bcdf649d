// Variant selection: buckets, assumptions, ranking, fallbacks and errors, on manifests
// built here (no driver involved).

#include "dispatch/dispatch.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manifest/manifest.h"
#include "nlohmann/json.hpp"

namespace kpack::internal {
namespace {

using json = nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Kernel k(x_ptr: *fp32, n: i32, stride: i32, BLOCK: constexpr). A variant's layout
// follows from its types and eq1 assumptions, as ptxas would lay it out.
json MakeVariant(const std::string& name, json bucket, json assumptions, json types = nullptr) {
  json v = {{"name", name},
            {"cubin", "c.cubin"},
            {"sha256", std::string(64, '0')},
            {"entry", "k"},
            {"arch", 90},
            {"constexprs", {{"BLOCK", 128}}},
            {"num_warps", 4},
            {"num_ctas", 1},
            {"shared", 0},
            {"global_scratch_size", 0},
            {"global_scratch_align", 1},
            {"profile_scratch_size", 0},
            {"profile_scratch_align", 1},
            {"launch_pdl", false},
            {"launch_cooperative_grid", false}};
  if (!bucket.is_null()) v["bucket"] = bucket;
  if (!assumptions.is_null()) v["assumptions"] = assumptions;
  if (!types.is_null()) v["types"] = types;
  bool wide = !types.is_null() && types.contains("n");
  bool unit = false;
  if (!assumptions.is_null() && assumptions.contains("stride")) {
    for (const json& a : assumptions["stride"]) unit |= a == "eq1";
  }
  json layout = json::array();
  int off = 0;
  layout.push_back({{"param", "x_ptr"}, {"offset", 0}, {"size", 8}});
  off = 8;
  layout.push_back({{"param", "n"}, {"offset", off}, {"size", wide ? 8 : 4}});
  off += wide ? 8 : 4;
  if (!unit) {
    layout.push_back({{"param", "stride"}, {"offset", off}, {"size", 4}});
    off += 4;
  }
  off = (off + 7) / 8 * 8;
  layout.push_back({{"param", "$global_scratch"}, {"offset", off}, {"size", 8}});
  layout.push_back({{"param", "$profile_scratch"}, {"offset", off + 8}, {"size", 8}});
  v["layout"] = layout;
  return v;
}

// Variants as a vector: a braced list of one json value would otherwise initialize a
// json object, not an array, on some compilers.
KernelSpec Kernel(const std::vector<json>& variants, json buckets = nullptr) {
  json k = {{"name", "k"},
            {"params",
             {{{"name", "x_ptr"}, {"type", "*fp32"}},
              {{"name", "n"}, {"type", "i32"}},
              {{"name", "stride"}, {"type", "i32"}},
              {{"name", "BLOCK"}, {"type", "constexpr"}}}},
            {"variants", json(variants)}};
  if (!buckets.is_null()) k["buckets"] = buckets;
  json m = {{"format", "kpack/1"}, {"kernels", {k}}};
  absl::StatusOr<ManifestSpec> parsed = ParseManifest(m.dump(), "m.json");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed->kernels[0];
}

struct Fixture {
  KernelSpec spec;
  DispatchTable table;
  std::string Pick(CUdeviceptr x, int64_t n, int64_t stride, bool* fallback = nullptr) const {
    const Arg args[] = {Arg(x), Arg(n), Arg(stride)};
    DispatchTable::Choice c = table.Select(args);
    if (fallback != nullptr) *fallback = c.fallback;
    if (c.variant < 0) return "<none>";
    return spec.variants[c.variant].name;
  }
  absl::Status Error(CUdeviceptr x, int64_t n, int64_t stride) const {
    const Arg args[] = {Arg(x), Arg(n), Arg(stride)};
    return table.NoVariantError(spec, args);
  }
};

Fixture Make(const std::vector<json>& variants, json buckets = nullptr) {
  Fixture f{Kernel(variants, buckets), {}};
  auto t = DispatchTable::Build(f.spec);
  EXPECT_TRUE(t.ok()) << t.status();
  f.table = *std::move(t);
  return f;
}

const json kBuckets = {{{"param", "n"}, {"edges", {16, 64, 256}}}};
const CUdeviceptr kAligned = 0x10000, kMisaligned = 0x10004;

TEST(DispatchTest, BucketBoundaries) {
  Fixture f = Make({MakeVariant("b0", {0}, nullptr), MakeVariant("b1", {1}, nullptr),
                    MakeVariant("b2", {2}, nullptr), MakeVariant("b3", {3}, nullptr)},
                   kBuckets);
  EXPECT_EQ(f.table.num_buckets(), 4u);
  EXPECT_EQ(f.Pick(kAligned, -5, 2), "b0") << "below the first edge";
  EXPECT_EQ(f.Pick(kAligned, 0, 2), "b0");
  EXPECT_EQ(f.Pick(kAligned, 16, 2), "b0") << "edges are inclusive upper bounds";
  EXPECT_EQ(f.Pick(kAligned, 17, 2), "b1");
  EXPECT_EQ(f.Pick(kAligned, 64, 2), "b1");
  EXPECT_EQ(f.Pick(kAligned, 65, 2), "b2");
  EXPECT_EQ(f.Pick(kAligned, 256, 2), "b2");
  EXPECT_EQ(f.Pick(kAligned, 257, 2), "b3") << "above the last edge";
  EXPECT_EQ(f.Pick(kAligned, INT32_MAX, 2), "b3");
  const Arg huge[] = {Arg(kAligned), Arg(~uint64_t{0}), Arg(2)};
  EXPECT_EQ(f.table.Select(huge).variant, 3);
}

TEST(DispatchTest, MultiDimensionalBuckets) {
  json buckets = {{{"param", "n"}, {"edges", {100}}}, {{"param", "stride"}, {"edges", {1, 8}}}};
  std::vector<json> variants;
  for (int s = 0; s < 3; ++s) {
    for (int n = 0; n < 2; ++n) {
      variants.push_back(
          MakeVariant("n" + std::to_string(n) + "s" + std::to_string(s), {n, s}, nullptr));
    }
  }
  Fixture f = Make(variants, buckets);
  EXPECT_EQ(f.table.num_buckets(), 6u);
  EXPECT_EQ(f.Pick(kAligned, 5, 1), "n0s0");
  EXPECT_EQ(f.Pick(kAligned, 500, 1), "n1s0");
  EXPECT_EQ(f.Pick(kAligned, 5, 2), "n0s1");
  EXPECT_EQ(f.Pick(kAligned, 500, 8), "n1s1");
  EXPECT_EQ(f.Pick(kAligned, 100, 9), "n0s2");
  EXPECT_EQ(f.Pick(kAligned, 101, 1000), "n1s2");
}

TEST(DispatchTest, MostSpecializedValidVariantWinsAndFallbacksAreFlagged) {
  Fixture f = Make({MakeVariant("generic", nullptr, nullptr),
                    MakeVariant("div16", nullptr, {{"x_ptr", {"div16"}}, {"n", {"div16"}}}),
                    MakeVariant("unit", nullptr,
                                {{"x_ptr", {"div16"}}, {"n", {"div16"}}, {"stride", {"eq1"}}})});
  EXPECT_EQ(f.table.num_properties(), 3u);
  bool fallback = true;
  EXPECT_EQ(f.Pick(kAligned, 64, 1, &fallback), "unit");
  EXPECT_FALSE(fallback);
  EXPECT_EQ(f.Pick(kAligned, 64, 2, &fallback), "div16") << "eq1 fails";
  EXPECT_TRUE(fallback);
  EXPECT_EQ(f.Pick(kMisaligned, 64, 1, &fallback), "generic") << "div16 fails on the pointer";
  EXPECT_TRUE(fallback);
  EXPECT_EQ(f.Pick(kAligned, 65, 1, &fallback), "generic") << "div16 fails on the integer";
  EXPECT_TRUE(fallback);
  EXPECT_EQ(f.Pick(kAligned, -32, 1), "unit") << "negative multiples of 16 are divisible";
  EXPECT_EQ(f.Pick(kAligned, 0, 1), "unit");
}

TEST(DispatchTest, GenericIsNotAFallbackWhenNothingMoreSpecialExists) {
  Fixture f = Make({MakeVariant("generic", nullptr, nullptr)});
  bool fallback = true;
  EXPECT_EQ(f.Pick(kMisaligned, 3, 7, &fallback), "generic");
  EXPECT_FALSE(fallback);
  EXPECT_EQ(f.table.num_properties(), 0u);
}

TEST(DispatchTest, TiesGoToTheEarlierVariant) {
  Fixture f = Make({MakeVariant("generic", nullptr, nullptr),
                    MakeVariant("x_aligned", nullptr, {{"x_ptr", {"div16"}}}),
                    MakeVariant("n_aligned", nullptr, {{"n", {"div16"}}})});
  EXPECT_EQ(f.Pick(kAligned, 32, 1), "x_aligned") << "both valid, same rank: manifest order";
  EXPECT_EQ(f.Pick(kMisaligned, 32, 1), "n_aligned");
  EXPECT_EQ(f.Pick(kAligned, 33, 1), "x_aligned");
}

TEST(DispatchTest, IntegerWidthVariants) {
  Fixture f = Make(
      {MakeVariant("i32", nullptr, nullptr), MakeVariant("i64", nullptr, nullptr, {{"n", "i64"}})});
  EXPECT_EQ(f.Pick(kAligned, 1000, 1), "i32") << "narrowest type that fits";
  EXPECT_EQ(f.Pick(kAligned, INT32_MAX, 1), "i32");
  EXPECT_EQ(f.Pick(kAligned, int64_t{INT32_MAX} + 1, 1), "i64");
  EXPECT_EQ(f.Pick(kAligned, int64_t{1} << 40, 1), "i64");
  EXPECT_EQ(f.Pick(kAligned, int64_t{INT32_MIN} - 1, 1), "i64");
  EXPECT_EQ(f.Pick(kAligned, -5, 1), "i32");
}

TEST(DispatchTest, NoValidVariantNamesParameterValueAndAssumption) {
  Fixture f =
      Make({MakeVariant("b0_div16", {0}, {{"x_ptr", {"div16"}}}), MakeVariant("b1", {1}, nullptr)},
           {{{"param", "n"}, {"edges", {16}}}});
  EXPECT_EQ(f.Pick(kMisaligned, 8, 1), "<none>");
  absl::Status s = f.Error(kMisaligned, 8, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("kernel 'k'"), HasSubstr("n=8"), HasSubstr("'b0_div16'"),
                    HasSubstr("x_ptr divisible by 16"), HasSubstr("x_ptr=0x10004"),
                    HasSubstr("nothing was launched")));
}

TEST(DispatchTest, BucketWithoutVariantsIsABuildError) {
  // Every call with n <= 16 would fail: the pack is refused when the table is built (at
  // Open), naming the bucket's range, not at the first call that lands there.
  KernelSpec spec = Kernel({MakeVariant("b1", {1}, nullptr)}, {{{"param", "n"}, {"edges", {16}}}});
  auto t = DispatchTable::Build(spec);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()),
              AllOf(HasSubstr("no variant serves bucket 0 (n <= 16)"),
                    HasSubstr("every bucket needs a variant")));

  json buckets = {{{"param", "n"}, {"edges", {100}}}, {{"param", "stride"}, {"edges", {1, 8}}}};
  std::vector<json> variants;
  for (int s = 0; s < 3; ++s) {
    for (int n = 0; n < 2; ++n) {
      if (n == 1 && s == 1) continue;
      variants.push_back(
          MakeVariant("n" + std::to_string(n) + "s" + std::to_string(s), {n, s}, nullptr));
    }
  }
  t = DispatchTable::Build(Kernel(variants, buckets));
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("no variant serves bucket 3 (n >= 101, 2 <= stride <= 8)"));
}

TEST(DispatchTest, BucketArgumentMustBeAnInteger) {
  Fixture f = Make({MakeVariant("v", nullptr, nullptr)}, kBuckets);
  const Arg args[] = {Arg(kAligned), Arg(1.5f), Arg(1)};
  EXPECT_EQ(f.table.Select(args).variant, DispatchTable::kBadBucketArg);
  EXPECT_THAT(std::string(f.table.NoVariantError(f.spec, args).message()),
              AllOf(HasSubstr("'n'"), HasSubstr("must be an integer"), HasSubstr("a float")));
}

TEST(DispatchTest, DependsOnBucketAndPropertyArgumentsOnly) {
  Fixture f =
      Make({MakeVariant("v", nullptr, {{"stride", {"eq1"}}}), MakeVariant("g", nullptr, nullptr)},
           kBuckets);
  EXPECT_FALSE(f.table.DependsOn(0));
  EXPECT_TRUE(f.table.DependsOn(1));
  EXPECT_TRUE(f.table.DependsOn(2));
}

// Kernel w(p0..p{n-1}: *fp32, m: i32, BLOCK: constexpr); each variant assumes div16 on the
// pointers it names (and on m, when listed as "m").
json WideVariant(const std::string& name, const std::vector<std::string>& div16, int pointers) {
  json v = MakeVariant(name, nullptr, nullptr);
  json layout = json::array();
  for (int i = 0; i < pointers; ++i) {
    layout.push_back({{"param", "p" + std::to_string(i)}, {"offset", 8 * i}, {"size", 8}});
  }
  layout.push_back({{"param", "m"}, {"offset", 8 * pointers}, {"size", 4}});
  layout.push_back({{"param", "$global_scratch"}, {"offset", 8 * pointers + 8}, {"size", 8}});
  layout.push_back({{"param", "$profile_scratch"}, {"offset", 8 * pointers + 16}, {"size", 8}});
  v["layout"] = layout;
  v["entry"] = "w";
  if (!div16.empty()) {
    json assumptions = json::object();
    for (const std::string& p : div16) assumptions[p] = {"div16"};
    v["assumptions"] = assumptions;
  }
  return v;
}

KernelSpec WideKernel(const std::vector<json>& variants, int pointers) {
  json params = json::array();
  for (int i = 0; i < pointers; ++i) {
    params.push_back({{"name", "p" + std::to_string(i)}, {"type", "*fp32"}});
  }
  params.push_back({{"name", "m"}, {"type", "i32"}});
  params.push_back({{"name", "BLOCK"}, {"type", "constexpr"}});
  json m = {{"format", "kpack/1"},
            {"kernels", {{{"name", "w"}, {"params", params}, {"variants", json(variants)}}}}};
  absl::StatusOr<ManifestSpec> parsed = ParseManifest(m.dump(), "m.json");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed->kernels[0];
}

std::vector<std::string> Names(int from, int to, int step = 1) {
  std::vector<std::string> names;
  for (int i = from; i < to; i += step) names.push_back("p" + std::to_string(i));
  return names;
}

// Selection over `pointers` pointers, the ones in `misaligned` off by 4 bytes, m = 32.
std::string PickWide(const KernelSpec& spec, const DispatchTable& table, int pointers,
                     const std::vector<int>& misaligned, bool* fallback = nullptr) {
  std::vector<Arg> args;
  for (int i = 0; i < pointers; ++i) {
    bool off = std::find(misaligned.begin(), misaligned.end(), i) != misaligned.end();
    args.push_back(Arg(CUdeviceptr{0x10000u + 0x100u * i + (off ? 4u : 0u)}));
  }
  args.push_back(Arg(32));
  DispatchTable::Choice c = table.Select(args);
  if (fallback != nullptr) *fallback = c.fallback;
  return c.variant < 0 ? "<none>" : spec.variants[c.variant].name;
}

// Triton specializes every pointer and integer parameter; a kernel may depend on far more
// than the 12 properties of the old flat table. Selection follows the same rules whether
// the properties fit one 64-bit mask word or need several.
TEST(DispatchTest, SeventyPropertiesAcrossMaskWords) {
  constexpr int kPointers = 70;
  std::vector<std::string> all = Names(0, kPointers), all_m = all;
  all_m.push_back("m");
  KernelSpec spec = WideKernel({WideVariant("generic", {}, kPointers),
                                WideVariant("even", Names(0, kPointers, 2), kPointers),
                                WideVariant("high", Names(60, kPointers), kPointers),
                                WideVariant("all", all, kPointers),
                                WideVariant("all_m", all_m, kPointers)},
                               kPointers);
  auto t = DispatchTable::Build(spec);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_properties(), 71u);
  bool fallback = true;
  EXPECT_EQ(PickWide(spec, *t, kPointers, {}, &fallback), "all_m");
  EXPECT_FALSE(fallback);
  EXPECT_EQ(PickWide(spec, *t, kPointers, {69}, &fallback), "even")
      << "p69 is past the first mask word; 'all' needs it, 'even' (35 pointers) does not";
  EXPECT_TRUE(fallback);
  EXPECT_EQ(PickWide(spec, *t, kPointers, {1}, &fallback), "even");
  EXPECT_EQ(PickWide(spec, *t, kPointers, {1, 2}), "high") << "even fails on p2";
  EXPECT_EQ(PickWide(spec, *t, kPointers, {0, 65}), "generic");
  EXPECT_EQ(PickWide(spec, *t, kPointers, {63}), "even") << "p63 is the first word's last bit";
  EXPECT_EQ(PickWide(spec, *t, kPointers, {64}), "generic") << "p64 (second word) is even";
  EXPECT_EQ(PickWide(spec, *t, kPointers, {65}), "even") << "p65 is in the second word";
}

TEST(DispatchTest, ExactlySixtyFourPropertiesFitOneWord) {
  constexpr int kPointers = 64;
  KernelSpec spec = WideKernel({WideVariant("generic", {}, kPointers),
                                WideVariant("all", Names(0, kPointers), kPointers),
                                WideVariant("low", Names(0, 32), kPointers)},
                               kPointers);
  auto t = DispatchTable::Build(spec);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_properties(), 64u);
  EXPECT_EQ(PickWide(spec, *t, kPointers, {}), "all");
  EXPECT_EQ(PickWide(spec, *t, kPointers, {63}), "low");
  EXPECT_EQ(PickWide(spec, *t, kPointers, {31}), "generic");
}

// Select (properties tested by kind) against SelectReference (each through Holds) past
// the first mask word and on integer-width variants, with random alignments and values.
TEST(DispatchTest, SelectMatchesItsReferenceAcrossMaskWordsAndWidths) {
  constexpr int kPointers = 70;
  KernelSpec wide = WideKernel({WideVariant("generic", {}, kPointers),
                                WideVariant("even", Names(0, kPointers, 2), kPointers),
                                WideVariant("high", Names(60, kPointers), kPointers),
                                WideVariant("all", Names(0, kPointers), kPointers)},
                               kPointers);
  auto table = DispatchTable::Build(wide);
  ASSERT_TRUE(table.ok()) << table.status();
  std::mt19937 random(7);
  for (int round = 0; round < 2000; ++round) {
    std::vector<Arg> args;
    for (int i = 0; i < kPointers; ++i) {
      args.push_back(Arg(CUdeviceptr{0x10000u + (random() % 8 == 0 ? 4u : 0u)}));
    }
    args.push_back(Arg(static_cast<int32_t>(random() % 64)));
    const DispatchTable::Choice got = table->Select(args), want = table->SelectReference(args);
    ASSERT_EQ(got.variant, want.variant) << "round " << round;
    ASSERT_EQ(got.fallback, want.fallback) << "round " << round;
  }
  Fixture widths = Make({MakeVariant("narrow", nullptr, {{"n", {"div16"}}}),
                         MakeVariant("wide", nullptr, nullptr, {{"n", "i64"}}),
                         MakeVariant("unsigned", nullptr, nullptr, {{"n", "u64"}})});
  ASSERT_EQ(widths.table.num_properties(), 4u) << "div16, and n fitting i32, i64, u64";
  for (int64_t n : {int64_t{0}, int64_t{16}, int64_t{255}, int64_t{256}, int64_t{-1},
                    int64_t{INT32_MAX}, int64_t{INT32_MAX} + 1, int64_t{INT32_MIN},
                    int64_t{INT32_MIN} - 1, INT64_MAX, INT64_MIN}) {
    for (Arg a : {Arg(n), Arg(static_cast<uint64_t>(n)), Arg(CUdeviceptr(n)), Arg(1.0 * n)}) {
      const Arg args[] = {Arg(kAligned), a, Arg(int32_t{1})};
      const DispatchTable::Choice got = widths.table.Select(args);
      const DispatchTable::Choice want = widths.table.SelectReference(args);
      EXPECT_EQ(got.variant, want.variant) << n << " as " << ArgKindName(a.kind());
      EXPECT_EQ(got.fallback, want.fallback) << n << " as " << ArgKindName(a.kind());
    }
  }
}

TEST(DispatchTest, NoValidVariantPastTheFirstWordNamesTheParameter) {
  constexpr int kPointers = 80;
  KernelSpec spec = WideKernel({WideVariant("all", Names(0, kPointers), kPointers)}, kPointers);
  auto t = DispatchTable::Build(spec);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<Arg> args;
  for (int i = 0; i < kPointers; ++i) args.push_back(Arg(CUdeviceptr{0x1000u + (i == 77 ? 4u : 0u)}));
  args.push_back(Arg(32));
  EXPECT_EQ(t->Select(args).variant, DispatchTable::kNoVariant);
  EXPECT_THAT(std::string(t->NoVariantError(spec, args).message()),
              AllOf(HasSubstr("variant 'all' assumes p77 divisible by 16"), HasSubstr("p77=0x1004")));
}

TEST(DispatchTest, TooManyPropertiesOrBucketsIsALoadError) {
  // 300 pointers, each div16 in some variant: more than kMaxProperties (256).
  constexpr int kPointers = 300;
  KernelSpec spec = WideKernel({WideVariant("generic", {}, kPointers),
                                WideVariant("all", Names(0, kPointers), kPointers)},
                               kPointers);
  auto t = DispatchTable::Build(spec);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()),
              AllOf(HasSubstr("depend on 300 argument properties"), HasSubstr("p299 divisible by 16"),
                    HasSubstr("more than the 256 supported")));

  json edges = json::array();
  for (int i = 0; i < 4095; ++i) edges.push_back(i);
  spec = Kernel({MakeVariant("a", nullptr, nullptr)},
                {{{"param", "n"}, {"edges", {1, 2}}}, {{"param", "stride"}, {"edges", edges}}});
  t = DispatchTable::Build(spec);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("buckets in all"));

  // 4096 buckets x 300 variants that serve every bucket: too many (bucket, variant) pairs.
  std::vector<json> variants;
  for (int i = 0; i < 300; ++i) {
    variants.push_back(MakeVariant("v" + std::to_string(i), nullptr, nullptr,
                                   i % 2 ? json{{"n", "i64"}} : json(nullptr)));
  }
  spec = Kernel(variants, {{{"param", "n"}, {"edges", edges}}});
  t = DispatchTable::Build(spec);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("(bucket, variant) pairs"));
}

}  // namespace
}  // namespace kpack::internal
