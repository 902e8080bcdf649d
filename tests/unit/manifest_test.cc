#include "manifest/manifest.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_manifest_json.h"

namespace kpack::internal {
namespace {

using ::kpack::testing::AddManifest;
using ::testing::AllOf;
using ::testing::HasSubstr;
using json = nlohmann::json;

absl::StatusOr<ManifestSpec> Parse(const json& j) { return ParseManifest(j.dump(), "m.json"); }

json& Variant(json& m) { return m["kernels"][0]["variants"][0]; }

TEST(ManifestTest, ParsesTritonAddKernel) {
  absl::StatusOr<ManifestSpec> m = Parse(AddManifest());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->kernels.size(), 1u);
  const KernelSpec& k = m->kernels[0];
  EXPECT_EQ(k.name, "add");
  ASSERT_EQ(k.params.size(), 5u);
  EXPECT_EQ(k.params[4].type, ParamType::kConstexpr);
  EXPECT_THAT(k.args, ::testing::ElementsAre(0, 1, 2, 3));  // BLOCK is not passed
  const VariantSpec& v = k.variants[0];
  EXPECT_EQ(v.entry, "add_kernel");
  EXPECT_EQ(v.arch, 90);
  EXPECT_EQ(v.num_warps, 4);
  EXPECT_EQ(v.param_bytes, 48u);
  ASSERT_EQ(v.layout.size(), 6u);
  EXPECT_EQ(v.layout[3].kind, SlotKind::kArg);
  EXPECT_EQ(v.layout[3].arg, 3);
  EXPECT_EQ(v.layout[3].offset, 24u);
  EXPECT_EQ(v.layout[4].kind, SlotKind::kGlobalScratch);
  EXPECT_EQ(v.layout[5].kind, SlotKind::kProfileScratch);
  EXPECT_EQ(v.constexprs.dump(), R"({"BLOCK":1024})");
}

TEST(ManifestTest, SlotSizesFollowTriton) {
  EXPECT_EQ(SlotSize(ParamType::kPointer), 8u);
  EXPECT_EQ(SlotSize(ParamType::kI1), 1u);
  EXPECT_EQ(SlotSize(ParamType::kU8), 1u);
  EXPECT_EQ(SlotSize(ParamType::kFp16), 2u);
  EXPECT_EQ(SlotSize(ParamType::kBf16), 2u);
  EXPECT_EQ(SlotSize(ParamType::kFp32), 4u);  // a float, not a double
  EXPECT_EQ(SlotSize(ParamType::kI64), 8u);
  EXPECT_EQ(SlotSize(ParamType::kFp64), 8u);
}

// Each case breaks one thing; the error must be INVALID_ARGUMENT (or UNIMPLEMENTED) and
// name the file, kernel, variant where there is one, and the field.
using ::kpack::testing::BadCase;

class ManifestErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ManifestErrorTest, NamesTheProblem) {
  json m = AddManifest();
  GetParam().mutate(m);
  absl::StatusOr<ManifestSpec> parsed = Parse(m);
  ASSERT_FALSE(parsed.ok()) << "accepted: " << m.dump();
  EXPECT_EQ(parsed.status().code(), GetParam().code) << parsed.status();
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("m.json"));
  for (const std::string& s : GetParam().mentions) {
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(s));
  }
}

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kUnimplemented = absl::StatusCode::kUnimplemented;

TEST(ManifestTest, ParsesDispatchFields) {
  json m = AddManifest();
  json& k = m["kernels"][0];
  k["buckets"] = {{{"param", "n"}, {"edges", {16, 64, 256}}}};
  k["grid"] = {"cdiv(n, BLOCK)"};
  json unit = Variant(m);
  Variant(m)["bucket"] = {1};
  Variant(m)["assumptions"] = {{"x_ptr", {"div16"}}, {"n", {"div16"}}};
  unit["name"] = "unit";
  unit["assumptions"] = {{"n", {"eq1"}}};
  unit["layout"].erase(3);  // n compiled away
  unit["layout"][3]["offset"] = 24;
  unit["layout"][4]["offset"] = 32;
  json wide = Variant(m);
  wide["name"] = "wide";
  wide.erase("assumptions");
  wide["types"] = {{"n", "i64"}};
  wide["layout"][3]["size"] = 8;
  wide["layout"][4]["offset"] = 32;
  wide["layout"][5]["offset"] = 40;
  k["variants"].push_back(unit);
  k["variants"].push_back(wide);
  absl::StatusOr<ManifestSpec> parsed = Parse(m);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const KernelSpec& ks = parsed->kernels[0];
  ASSERT_EQ(ks.buckets.size(), 1u);
  EXPECT_EQ(ks.buckets[0].arg, 3);
  EXPECT_THAT(ks.buckets[0].edges, ::testing::ElementsAre(16, 64, 256));
  EXPECT_THAT(ks.grid, ::testing::ElementsAre("cdiv(n, BLOCK)"));
  ASSERT_EQ(ks.variants.size(), 3u);
  EXPECT_THAT(ks.variants[0].bucket, ::testing::ElementsAre(1));
  ASSERT_EQ(ks.variants[0].assumptions.size(), 2u);
  for (const Assumption& a : ks.variants[0].assumptions) {
    EXPECT_TRUE(a.arg == 0 || a.arg == 3) << a.arg;
    EXPECT_EQ(a.kind, Assumption::kDiv16);
  }
  EXPECT_TRUE(ks.variants[1].bucket.empty());
  EXPECT_EQ(ks.variants[1].assumptions[0].kind, Assumption::kEq1);
  EXPECT_EQ(ks.variants[1].layout.size(), 5u);
  EXPECT_EQ(ks.variants[2].arg_types[3], ParamType::kI64);
  EXPECT_EQ(ks.variants[0].arg_types[3], ParamType::kI32);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ManifestErrorTest,
    ::testing::Values(
        BadCase{"unknown_format", [](json& m) { m["format"] = "kpack/3"; }, kInvalid,
                {"'format'", "kpack/3", "kpack/1' to 'kpack/2"}},
        BadCase{"format_not_string", [](json& m) { m["format"] = 1; }, kInvalid,
                {"'format'", "expected a string"}},
        BadCase{"no_kernels", [](json& m) { m["kernels"] = json::array(); }, kInvalid,
                {"'kernels'"}},
        BadCase{"unknown_top_field", [](json& m) { m["kernls"] = 1; }, kInvalid, {"'kernls'"}},
        BadCase{"duplicate_kernel",
                [](json& m) { m["kernels"].push_back(m["kernels"][0]); }, kInvalid,
                {"duplicate kernel 'add'"}},
        BadCase{"kernel_name_not_identifier",
                [](json& m) { m["kernels"][0]["name"] = "../x"; }, kInvalid, {"kernels[0].name"}},
        BadCase{"param_type_unknown",
                [](json& m) { m["kernels"][0]["params"][3]["type"] = "int"; }, kInvalid,
                {"kernel 'add'", "params[3].type", "'int'"}},
        BadCase{"param_tma_unsupported",
                [](json& m) { m["kernels"][0]["params"][3]["type"] = "nvTmaDesc"; },
                kUnimplemented, {"kernel 'add'", "nvTmaDesc"}},
        BadCase{"duplicate_param",
                [](json& m) { m["kernels"][0]["params"][1]["name"] = "x_ptr"; }, kInvalid,
                {"duplicate parameter 'x_ptr'"}},
        BadCase{"bucket_param_not_integer",
                [](json& m) {
                  m["kernels"][0]["buckets"] = {{{"param", "x_ptr"}, {"edges", {16}}}};
                },
                kInvalid, {"kernel 'add'", "buckets[0].param", "'x_ptr'"}},
        BadCase{"bucket_param_unknown",
                [](json& m) { m["kernels"][0]["buckets"] = {{{"param", "M"}, {"edges", {16}}}}; },
                kInvalid, {"buckets[0].param", "'M'"}},
        BadCase{"bucket_param_twice",
                [](json& m) {
                  m["kernels"][0]["buckets"] = {{{"param", "n"}, {"edges", {16}}},
                                                {{"param", "n"}, {"edges", {32}}}};
                },
                kInvalid, {"buckets[1].param", "bucketed twice"}},
        BadCase{"bucket_edges_not_increasing",
                [](json& m) {
                  m["kernels"][0]["buckets"] = {{{"param", "n"}, {"edges", {16, 64, 64}}}};
                },
                kInvalid, {"buckets[0].edges[2]", "does not increase"}},
        BadCase{"bucket_edges_empty",
                [](json& m) {
                  m["kernels"][0]["buckets"] = {{{"param", "n"}, {"edges", json::array()}}};
                },
                kInvalid, {"buckets[0].edges"}},
        BadCase{"bucket_edge_not_integer",
                [](json& m) {
                  m["kernels"][0]["buckets"] = {{{"param", "n"}, {"edges", {1.5}}}};
                },
                kInvalid, {"buckets[0].edges[0]"}},
        BadCase{"variant_bucket_wrong_length",
                [](json& m) {
                  m["kernels"][0]["buckets"] = {{{"param", "n"}, {"edges", {16}}}};
                  Variant(m)["bucket"] = {0, 0};
                },
                kInvalid, {"variant 'default'", "'bucket'", "one per bucket dim"}},
        BadCase{"variant_bucket_out_of_range",
                [](json& m) {
                  m["kernels"][0]["buckets"] = {{{"param", "n"}, {"edges", {16}}}};
                  Variant(m)["bucket"] = {2};
                },
                kInvalid, {"variant 'default'", "'bucket[0]'", "[0, 1]"}},
        BadCase{"assumption_unknown_kind",
                [](json& m) { Variant(m)["assumptions"] = {{"n", {"div8"}}}; }, kInvalid,
                {"variant 'default'", "'assumptions.n'", "div8"}},
        BadCase{"assumption_unknown_param",
                [](json& m) { Variant(m)["assumptions"] = {{"m", {"div16"}}}; }, kInvalid,
                {"'assumptions.m'", "not a call parameter"}},
        BadCase{"assumption_eq1_on_pointer",
                [](json& m) { Variant(m)["assumptions"] = {{"x_ptr", {"eq1"}}}; }, kInvalid,
                {"'assumptions.x_ptr'", "integers only"}},
        BadCase{"assumption_twice",
                [](json& m) { Variant(m)["assumptions"] = {{"n", {"div16", "div16"}}}; },
                kInvalid, {"'assumptions.n'", "twice"}},
        BadCase{"eq1_param_with_slot",
                [](json& m) { Variant(m)["assumptions"] = {{"n", {"eq1"}}}; }, kInvalid,
                {"'layout[3].param'", "eq1", "compiled it away"}},
        BadCase{"type_override_not_integer",
                [](json& m) { Variant(m)["types"] = {{"n", "fp32"}}; }, kInvalid,
                {"'types.n'", "integer type"}},
        BadCase{"type_override_of_pointer",
                [](json& m) { Variant(m)["types"] = {{"x_ptr", "i64"}}; }, kInvalid,
                {"'types.x_ptr'", "only integer and tensordesc parameters"}},
        BadCase{"type_override_slot_size",
                [](json& m) { Variant(m)["types"] = {{"n", "i64"}}; }, kInvalid,
                {"'layout[3].size'", "expected 8", "type i64"}},
        BadCase{"grid_too_many_axes",
                [](json& m) { m["kernels"][0]["grid"] = {"1", "1", "1", "1"}; }, kInvalid,
                {"kernel 'add'", "'grid'"}},
        BadCase{"grid_not_string",
                [](json& m) { m["kernels"][0]["grid"] = {1}; }, kInvalid, {"'grid[0]'"}},
        BadCase{"duplicate_variant",
                [](json& m) { m["kernels"][0]["variants"].push_back(Variant(m)); }, kInvalid,
                {"duplicate variant 'default'"}},
        BadCase{"no_variants",
                [](json& m) { m["kernels"][0]["variants"] = json::array(); }, kInvalid,
                {"'variants'"}},
        BadCase{"missing_entry", [](json& m) { Variant(m).erase("entry"); }, kInvalid,
                {"kernel 'add'", "variant 'default'", "'entry'", "missing"}},
        BadCase{"unknown_variant_field", [](json& m) { Variant(m)["num_warp"] = 4; }, kInvalid,
                {"variant 'default'", "'num_warp'"}},
        BadCase{"num_warps_string", [](json& m) { Variant(m)["num_warps"] = "4"; }, kInvalid,
                {"'num_warps'", "expected an integer in [1, 32], got string"}},
        BadCase{"num_warps_float", [](json& m) { Variant(m)["num_warps"] = 4.5; }, kInvalid,
                {"'num_warps'", "expected an integer in [1, 32], got 4.5"}},
        // Every integer field states its range when the value is no integer at all.
        BadCase{"num_warps_1e30", [](json& m) { Variant(m)["num_warps"] = 1e30; }, kInvalid,
                {"'num_warps'", "expected an integer in [1, 32], got 1e+30"}},
        BadCase{"arch_float", [](json& m) { Variant(m)["arch"] = 90.0; }, kInvalid,
                {"'arch'", "expected an integer in [10, 1000], got 90.0"}},
        BadCase{"shared_1e30", [](json& m) { Variant(m)["shared"] = 1e30; }, kInvalid,
                {"'shared'", "expected an integer in [0, 1048576], got 1e+30"}},
        BadCase{"layout_offset_float",
                [](json& m) { Variant(m)["layout"][3]["offset"] = 24.5; }, kInvalid,
                {"'offset'", "expected an integer in [0, 4096], got 24.5"}},
        BadCase{"num_stages_bool", [](json& m) { Variant(m)["num_stages"] = true; }, kInvalid,
                {"'num_stages'", "expected an integer in [0, 64], got boolean"}},
        BadCase{"num_warps_zero", [](json& m) { Variant(m)["num_warps"] = 0; }, kInvalid,
                {"'num_warps'", "out of range"}},
        BadCase{"num_ctas_huge", [](json& m) { Variant(m)["num_ctas"] = 17; }, kInvalid,
                {"'num_ctas'"}},
        BadCase{"shared_huge", [](json& m) { Variant(m)["shared"] = 1LL << 40; }, kInvalid,
                {"'shared'", "out of range"}},
        BadCase{"shared_u64_max",
                [](json& m) { Variant(m)["shared"] = 18446744073709551615ULL; }, kInvalid,
                {"'shared'", "out of range"}},
        BadCase{"shared_negative", [](json& m) { Variant(m)["shared"] = -1; }, kInvalid,
                {"'shared'"}},
        BadCase{"pdl_not_bool", [](json& m) { Variant(m)["launch_pdl"] = 1; }, kInvalid,
                {"'launch_pdl'", "true or false"}},
        BadCase{"scratch_align_not_pow2",
                [](json& m) { Variant(m)["global_scratch_align"] = 24; }, kInvalid,
                {"'global_scratch_align'", "power of two"}},
        BadCase{"scratch_without_slot",
                [](json& m) {
                  Variant(m)["global_scratch_size"] = 128;
                  Variant(m)["layout"].erase(4);
                },
                kInvalid, {"$global_scratch"}},
        BadCase{"sha_not_hex", [](json& m) { Variant(m)["sha256"] = std::string(64, 'G'); },
                kInvalid, {"'sha256'"}},
        BadCase{"sha_short", [](json& m) { Variant(m)["sha256"] = "abc"; }, kInvalid,
                {"'sha256'"}},
        BadCase{"constexpr_missing",
                [](json& m) { Variant(m)["constexprs"] = json::object(); }, kInvalid,
                {"'constexprs'", "BLOCK"}},
        BadCase{"constexpr_not_a_constexpr",
                [](json& m) { Variant(m)["constexprs"]["n"] = 3; }, kInvalid,
                {"'constexprs.n'"}},
        BadCase{"layout_lies_about_size",
                [](json& m) { Variant(m)["layout"][3]["size"] = 8; }, kInvalid,
                {"variant 'default'", "'layout[3].size'", "parameter 'n'", "i32"}},
        BadCase{"layout_overlap",
                [](json& m) { Variant(m)["layout"][1]["offset"] = 0; }, kInvalid,
                {"'layout[1].offset'", "overlaps"}},
        BadCase{"layout_misaligned",
                [](json& m) { Variant(m)["layout"][3]["offset"] = 26; }, kInvalid,
                {"'layout[3].offset'", "aligned"}},
        BadCase{"layout_past_4k",
                [](json& m) {
                  Variant(m)["layout"][4]["offset"] = 4096;
                },
                kInvalid, {"'layout[4].offset'"}},
        BadCase{"layout_ends_past_4k",
                [](json& m) {
                  Variant(m)["layout"][4]["offset"] = 4088;
                  Variant(m)["layout"][5]["offset"] = 4096;
                },
                kInvalid, {"'layout[5].offset'"}},
        BadCase{"layout_negative_size",
                [](json& m) { Variant(m)["layout"][0]["size"] = -8; }, kInvalid,
                {"'size'"}},
        BadCase{"layout_missing_param",
                [](json& m) { Variant(m)["layout"].erase(3); }, kInvalid,
                {"call parameter 'n' has no slot"}},
        BadCase{"layout_unknown_param",
                [](json& m) { Variant(m)["layout"][3]["param"] = "BLOCK"; }, kInvalid,
                {"'layout[3].param'", "BLOCK"}},
        BadCase{"layout_param_twice",
                [](json& m) { Variant(m)["layout"][1]["param"] = "x_ptr"; }, kInvalid,
                {"'x_ptr' appears twice"}},
        // Layout order: call parameters in declaration order, then the hidden pointers,
        // global scratch first. Each of these swaps keeps every offset and size valid.
        BadCase{"layout_swaps_same_size_params",
                [](json& m) {
                  Variant(m)["layout"][0]["param"] = "y_ptr";
                  Variant(m)["layout"][1]["param"] = "x_ptr";
                },
                kInvalid,
                {"kernel 'add'", "variant 'default'", "'layout[1].param'",
                 "parameter 'x_ptr' comes after 'y_ptr' (layout[0])", "declares 'x_ptr' first"}},
        BadCase{"layout_profile_before_global",
                [](json& m) {
                  Variant(m)["layout"][4]["param"] = "$profile_scratch";
                  Variant(m)["layout"][5]["param"] = "$global_scratch";
                },
                kInvalid,
                {"kernel 'add'", "variant 'default'", "'layout[5].param'",
                 "$global_scratch comes after $profile_scratch (layout[4])"}},
        BadCase{"layout_param_after_hidden",
                [](json& m) {
                  Variant(m)["layout"][3] = {{"param", "$global_scratch"}, {"offset", 24}, {"size", 8}};
                  Variant(m)["layout"][4] = {{"param", "n"}, {"offset", 32}, {"size", 4}};
                },
                kInvalid,
                {"'layout[4].param'",
                 "parameter 'n' comes after the hidden pointer $global_scratch (layout[3])"}},
        BadCase{"layout_hidden_twice",
                [](json& m) { Variant(m)["layout"][5]["param"] = "$global_scratch"; },
                kInvalid, {"$global_scratch appears twice"}},
        BadCase{"layout_not_array", [](json& m) { Variant(m)["layout"] = 3; }, kInvalid,
                {"'layout'", "expected an array"}}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

// ParseManifest parses a manifest's kernels apart (on several threads when it is large,
// while its SAX pass is still finding the later ones); it must always give what parsing the
// whole text gives, error messages included.
void ExpectSameAsWhole(const std::string& text) {
  SCOPED_TRACE(text.size() > 200 ? text.substr(0, 100) + " ... " + text.substr(text.size() - 100)
                                 : text);
  absl::StatusOr<ManifestSpec> split = ParseManifest(text, "m.json");
  absl::StatusOr<ManifestSpec> whole = ParseManifestWhole(text, "m.json");
  ASSERT_EQ(split.status(), whole.status());
  if (!whole.ok()) return;
  ASSERT_EQ(split->kernels.size(), whole->kernels.size());
  for (size_t k = 0; k < whole->kernels.size(); ++k) {
    EXPECT_EQ(split->kernels[k].name, whole->kernels[k].name);
    EXPECT_EQ(split->kernels[k].variants.size(), whole->kernels[k].variants.size());
  }
  EXPECT_EQ(split->generator, whole->generator);
  EXPECT_EQ(split->format_version, whole->format_version);
}

TEST(ManifestTest, KernelsParsedApartAgreeWithTheWholeText) {
  const std::string add = AddManifest()["kernels"][0].dump();
  json many = AddManifest();
  many["kernels"] = json::array();
  for (int i = 0; i < 400; ++i) {  // about 600 KB: parsed on more than one thread
    json k = AddManifest()["kernels"][0];
    k["name"] = "add_" + std::to_string(i);
    many["kernels"].push_back(k);
  }
  json bad_middle = many;
  bad_middle["kernels"][250]["variants"][0]["num_warps"] = 99;
  json dup = many;
  dup["kernels"][300]["name"] = "add_7";
  // A syntax error in a late kernel is what the whole text's parse reports, even with an
  // invalid kernel before it.
  std::string syntax_late = bad_middle.dump(2);
  syntax_late.insert(syntax_late.rfind("\"num_warps\""), "{");
  // The same before a top-level problem (the fuzzer's first find).
  json no_format = many;
  no_format.erase("format");
  std::string syntax_after_top_problem = no_format.dump(2);
  syntax_after_top_problem.insert(syntax_after_top_problem.rfind("\"num_warps\""), "~");
  // A kpack/2 field in a kpack/1 manifest is refused, so kernels parsed before the format
  // is known (or for a format given again later) are parsed again for the right one.
  json v2_field = AddManifest();
  v2_field["kernels"][0]["source"] = {{"qualname", "m.add"}, {"sha256", std::string(64, 'a')}};
  const std::string v2_kernel = v2_field["kernels"][0].dump();
  const std::string prefix = R"({"format": "kpack/1", "kernels": [)";
  for (const std::string& text :
       {AddManifest().dump(), AddManifest().dump(2), many.dump(2), bad_middle.dump(), dup.dump(),
        std::string("\xEF\xBB\xBF") + AddManifest().dump(), AddManifest().dump() + "  \n",
        std::string(R"({"format": "kpack/1", "kernels": []})"), prefix + "1, \"x\", null, true]}",
        prefix + "[], {}, [1, [2]], 2.5, -3, 18446744073709551615]}",
        prefix + add + "," + add + "]}", prefix + add + R"(], "generator": "x\"}"})",
        prefix + add + R"(], "generator": "a\\"})", std::string(R"({"kernels": [)") + add + "]}",
        std::string(R"({"format": "kpack/9", "kernels": [)") + add + "]}",
        // Syntax errors (the whole parse's message), escaped or repeated keys, other shapes.
        syntax_late, syntax_after_top_problem, AddManifest().dump() + " x",
        prefix + add + " " + add + "]}", prefix + add + ",]}", prefix + add + "]]}",
        prefix + R"({"a": 1]}]})",
        std::string(R"({"format": "kpack/1", "kernels": [], "kernels": [)") + add + "]}",
        std::string(R"({"format": "kpack/1", "kernels": [)") + add + R"(], "kernels": 7})",
        std::string(R"({"format": "kpack/1", "kernels": [)") + add + R"(], "kernels": {}})",
        prefix + add + R"(], "kern\u0065ls": []})",
        std::string(R"({"format": "kpack/1", "kern\u0065ls": [], "kernels": [)") + add + "]}",
        std::string(R"({"format": "kpack/1", "kernels": {}})"), prefix + add.substr(0, 100),
        std::string(R"({"format": "kpack/1"})"), std::string("[]"), std::string("{}"),
        std::string("{"), std::string(""), std::string("[{\"kernels\": [1]}]"),
        // The format after the kernels, given twice, or not a string.
        std::string(R"({"kernels": [)") + v2_kernel + R"(], "format": "kpack/1"})",
        std::string(R"({"kernels": [)") + v2_kernel + R"(], "format": "kpack/2"})",
        std::string(R"({"format": "kpack/2", "kernels": [)") + v2_kernel +
            R"(], "format": "kpack/1"})",
        std::string(R"({"format": "kpack/1", "kernels": [)") + v2_kernel +
            R"(], "format": "kpack/2"})",
        std::string(R"({"format": "kpack/2", "format": 2, "kernels": [)") + v2_kernel + "]}",
        std::string(R"({"format": "kpack/1", "fo\u0072mat": "kpack/2", "kernels": [)") +
            v2_kernel + "]}"}) {
    ExpectSameAsWhole(text);
  }
}

TEST(ManifestTest, RejectsMalformedJson) {
  absl::StatusOr<ManifestSpec> m = ParseManifest("{\"format\": ", "m.json");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), AllOf(HasSubstr("m.json"), HasSubstr("JSON")));
}

TEST(ManifestTest, RejectsNonObjectTopLevel) {
  absl::StatusOr<ManifestSpec> m = ParseManifest("[1, 2]", "m.json");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("top level"));
}

}  // namespace
}  // namespace kpack::internal
