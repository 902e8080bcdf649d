// kpack/2 tensor descriptor parameters in the manifest: the `tensordesc<...>` type, the
// expanded layout slots and their parts, `tensordesc_meta`, `types` overrides of the block
// shape, and flattened tuple elements. The layouts are those of Triton 3.6 cubins of a
// two-descriptor copy kernel (ptxas's offsets, read with kpack_tools.cubin): for sm_90a
// with the descriptors lowered to TMA, and for sm_80 without.

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manifest/manifest.h"
#include "nlohmann/json.hpp"
#include "test_manifest_json.h"

namespace kpack::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

json Slot(const std::string& param, int offset, int size, const std::string& part = "") {
  json s = {{"param", param}, {"offset", offset}, {"size", size}};
  if (!part.empty()) s["part"] = part;
  return s;
}

json Meta() {
  return {{"data_type", 6}, {"elem_size", 2}, {"swizzle", 3}, {"block_size", {64, 64}},
          {"fp4_padded", false}};
}

// copy_kernel(in_desc, out_desc: tensordesc<fp16[64, 128]>, M, N: i32, BM, BN: constexpr),
// compiled for sm_90a: both descriptors lowered to TMA (the CUtensorMap at 48 and 240).
json TmaManifest() {
  json layout = json::array();
  int offset = 48;
  for (const char* d : {"in_desc", "out_desc"}) {
    layout.push_back(Slot(d, offset, 128, "tma"));
    layout.push_back(Slot(d, offset + 128, 4, "shape[0]"));
    layout.push_back(Slot(d, offset + 132, 4, "shape[1]"));
    layout.push_back(Slot(d, offset + 136, 8, "strides[0]"));
    layout.push_back(Slot(d, offset + 144, 8, "strides[1]"));
    offset = 240;
  }
  layout.push_back(Slot("M", 392, 4));
  layout.push_back(Slot("N", 396, 4));
  layout.push_back(Slot("$global_scratch", 400, 8));
  layout.push_back(Slot("$profile_scratch", 408, 8));
  json variant = testing::AddManifest(std::string(64, 'a'), "copy_kernel")["kernels"][0]
                                      ["variants"][0];
  variant["cubin"] = "cubins/copy/default.cubin";
  variant["constexprs"] = {{"BM", 64}, {"BN", 128}};
  variant["shared"] = 16384;
  variant["tensordesc_meta"] = {Meta(), Meta()};
  variant["layout"] = layout;
  json kernel = {{"name", "copy"},
                 {"params",
                  {{{"name", "in_desc"}, {"type", "tensordesc<fp16[64, 128]>"}},
                   {{"name", "out_desc"}, {"type", "tensordesc<fp16[64, 128]>"}},
                   {{"name", "M"}, {"type", "i32"}},
                   {{"name", "N"}, {"type", "i32"}},
                   {{"name", "BM"}, {"type", "constexpr"}},
                   {{"name", "BN"}, {"type", "constexpr"}}}},
                 {"variants", {variant}}};
  return {{"format", "kpack/2"}, {"kernels", {kernel}}};
}

// The same kernel for sm_80: no TMA, so no tensordesc_meta and the pointer expansion.
json PointerVariant() {
  json v = TmaManifest()["kernels"][0]["variants"][0];
  v["name"] = "sm80";
  v["arch"] = 80;
  v.erase("tensordesc_meta");
  json layout = json::array();
  int offset = 0;
  for (const char* d : {"in_desc", "out_desc"}) {
    layout.push_back(Slot(d, offset, 8, "base"));
    layout.push_back(Slot(d, offset + 8, 8, "base_shape[0]"));
    layout.push_back(Slot(d, offset + 16, 8, "base_shape[1]"));
    layout.push_back(Slot(d, offset + 24, 8, "base_strides[0]"));
    layout.push_back(Slot(d, offset + 32, 8, "base_strides[1]"));
    layout.push_back(Slot(d, offset + 40, 1, "padding"));
    layout.push_back(Slot(d, offset + 44, 4, "shape[0]"));
    layout.push_back(Slot(d, offset + 48, 4, "shape[1]"));
    layout.push_back(Slot(d, offset + 56, 8, "strides[0]"));
    layout.push_back(Slot(d, offset + 64, 8, "strides[1]"));
    offset = 72;
  }
  layout.push_back(Slot("M", 144, 4));
  layout.push_back(Slot("N", 148, 4));
  layout.push_back(Slot("$global_scratch", 152, 8));
  layout.push_back(Slot("$profile_scratch", 160, 8));
  v["layout"] = layout;
  return v;
}

absl::StatusOr<ManifestSpec> Parse(const json& j) { return ParseManifest(j.dump(), "m.json"); }
json& Variant(json& m) { return m["kernels"][0]["variants"][0]; }
json& Layout(json& m) { return Variant(m)["layout"]; }

TEST(TensorDescManifestTest, ParsesTmaDescriptors) {
  absl::StatusOr<ManifestSpec> m = Parse(TmaManifest());
  ASSERT_TRUE(m.ok()) << m.status();
  const KernelSpec& k = m->kernels[0];
  EXPECT_EQ(k.params[0].type, ParamType::kTensorDesc);
  EXPECT_EQ(k.params[0].desc.dtype, "fp16");
  EXPECT_THAT(k.params[0].desc.block, ElementsAre(64, 128));
  EXPECT_THAT(k.args, ElementsAre(0, 1, 2, 3));
  const VariantSpec& v = k.variants[0];
  ASSERT_EQ(v.descs.size(), 2u);
  EXPECT_EQ(v.descs[1].arg, 1);
  EXPECT_TRUE(v.descs[0].tma);
  EXPECT_EQ(v.descs[0].data_type, 6);
  EXPECT_EQ(v.descs[0].swizzle, 3);
  EXPECT_THAT(v.descs[0].box, ElementsAre(64, 64)) << "the box, not the block shape";
  EXPECT_THAT(v.descs[0].element_strides, ElementsAre(1, 1)) << "Triton's default";
  EXPECT_EQ(v.descs[0].interleave, 0);
  EXPECT_EQ(v.descs[0].l2_promotion, 2) << "CU_TENSOR_MAP_L2_PROMOTION_L2_128B, as Triton";
  ASSERT_EQ(v.layout.size(), 14u);
  EXPECT_EQ(v.layout[0].part, DescPart::kTma);
  EXPECT_EQ(v.layout[4].part, DescPart::kStrides);
  EXPECT_EQ(v.layout[4].part_index, 1);
  EXPECT_EQ(v.layout[5].arg, 1);
  EXPECT_EQ(SlotName(k, v.layout[2]), "in_desc.shape[1]");
  EXPECT_EQ(v.tma_offset_mod64, 48u) << "ptxas put the maps at 48 and 240";
  EXPECT_EQ(v.param_bytes, 416u);
}

TEST(TensorDescManifestTest, ParsesThePointerExpansionWithoutMetadata) {
  json m = TmaManifest();
  Variant(m) = PointerVariant();
  absl::StatusOr<ManifestSpec> parsed = Parse(m);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const VariantSpec& v = parsed->kernels[0].variants[0];
  EXPECT_FALSE(v.descs[0].tma);
  EXPECT_EQ(v.layout[5].part, DescPart::kPadding);
  EXPECT_EQ(v.layout[5].size, 1u);
  EXPECT_EQ(v.tma_offset_mod64, 0u);
}

TEST(TensorDescManifestTest, MetadataMayLowerOneDescriptorAndNotTheOther) {
  json m = TmaManifest();
  json& v = Variant(m);
  v["tensordesc_meta"][1] = nullptr;
  json layout = json::array();
  for (int i = 0; i < 5; ++i) layout.push_back(v["layout"][i]);
  json pointer = PointerVariant()["layout"];
  for (int i = 10; i < 20; ++i) {  // out_desc's pointer form, after in_desc's 176 bytes
    json s = pointer[i];
    s["offset"] = s["offset"].get<int>() - 72 + 200;
    layout.push_back(s);
  }
  layout.push_back(Slot("M", 272, 4));
  layout.push_back(Slot("N", 276, 4));
  layout.push_back(Slot("$global_scratch", 280, 8));
  layout.push_back(Slot("$profile_scratch", 288, 8));
  v["layout"] = layout;
  absl::StatusOr<ManifestSpec> parsed = Parse(m);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->kernels[0].variants[0].descs[0].tma);
  EXPECT_FALSE(parsed->kernels[0].variants[0].descs[1].tma);
}

TEST(TensorDescManifestTest, TypesOverrideTheBlockShapePerVariant) {
  json m = TmaManifest();
  Variant(m)["types"] = {{"out_desc", "tensordesc<fp16[128, 64]>"}};
  absl::StatusOr<ManifestSpec> parsed = Parse(m);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const VariantSpec& v = parsed->kernels[0].variants[0];
  EXPECT_THAT(v.descs[1].block, ElementsAre(128, 64));
  EXPECT_EQ(v.descs[1].type_name, "tensordesc<fp16[128, 64]>");
  EXPECT_THAT(v.descs[0].block, ElementsAre(64, 128));
  EXPECT_EQ(v.arg_types[1], ParamType::kTensorDesc);
}

TEST(TensorDescManifestTest, TupleElementsAreParametersOfKpack2) {
  json m = TmaManifest();
  json& params = m["kernels"][0]["params"];
  params[2]["name"] = "sizes.0";
  params[3]["name"] = "sizes.1";
  Layout(m)[10]["param"] = "sizes.0";
  Layout(m)[11]["param"] = "sizes.1";
  absl::StatusOr<ManifestSpec> parsed = Parse(m);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->kernels[0].arg(2).name, "sizes.0");
}

using ::kpack::testing::BadCase;

class TensorDescManifestErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(TensorDescManifestErrorTest, NamesTheProblem) {
  json m = TmaManifest();
  GetParam().mutate(m);
  absl::StatusOr<ManifestSpec> parsed = Parse(m);
  ASSERT_FALSE(parsed.ok()) << "accepted: " << m.dump();
  EXPECT_EQ(parsed.status().code(), GetParam().code) << parsed.status();
  for (const std::string& s : GetParam().mentions) {
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(s));
  }
}

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

INSTANTIATE_TEST_SUITE_P(
    Cases, TensorDescManifestErrorTest,
    ::testing::Values(
        BadCase{"kpack1", [](json& m) { m["format"] = "kpack/1"; }, kInvalid,
                {"'params[0].type'", "needs format 'kpack/2'"}},
        BadCase{"no_block",
                [](json& m) { m["kernels"][0]["params"][0]["type"] = "tensordesc<fp16>"; },
                kInvalid, {"'params[0].type'", "no [block shape]"}},
        BadCase{"unknown_dtype",
                [](json& m) { m["kernels"][0]["params"][0]["type"] = "tensordesc<fp17[64, 128]>"; },
                kInvalid, {"unknown element type 'fp17'"}},
        BadCase{"zero_block",
                [](json& m) { m["kernels"][0]["params"][0]["type"] = "tensordesc<fp16[0, 128]>"; },
                kInvalid, {"block dimension '0'"}},
        BadCase{"rank_6",
                [](json& m) {
                  m["kernels"][0]["params"][0]["type"] = "tensordesc<fp16[1, 1, 1, 1, 1, 1]>";
                },
                kInvalid, {"rank 6 exceeds 5"}},
        BadCase{"gluon_layout",
                [](json& m) {
                  m["kernels"][0]["params"][0]["type"] =
                      "tensordesc<fp16[64, 128],NVMMASharedLayout(swizzle_byte_width=128)>";
                },
                absl::StatusCode::kUnimplemented, {"a layout (Gluon's)"}},
        BadCase{"part_missing", [](json& m) { Layout(m)[1].erase("part"); }, kInvalid,
                {"'layout[1].part'", "missing: expected 'shape[0]'", "'in_desc'"}},
        BadCase{"parts_swapped",
                [](json& m) {
                  Layout(m)[1]["part"] = "shape[1]";
                  Layout(m)[2]["part"] = "shape[0]";
                },
                kInvalid, {"'layout[1].part'", "'shape[1]': expected 'shape[0]'"}},
        BadCase{"pointer_part_for_tma", [](json& m) { Layout(m)[0]["part"] = "base"; }, kInvalid,
                {"'layout[0].part'", "expected 'tma'", "lowered to TMA"}},
        BadCase{"part_on_plain_param", [](json& m) { Layout(m)[10]["part"] = "shape[0]"; },
                kInvalid, {"'layout[10].part'", "'M' is not one"}},
        BadCase{"descriptor_cut_short",
                [](json& m) { Layout(m).erase(4); },  // in_desc.strides[1] missing
                kInvalid, {"'layout[4].param'", "'in_desc' lacks its part 'strides[1]'"}},
        BadCase{"descriptor_last_cut_short",
                [](json& m) {
                  json& l = Layout(m);
                  json kept = json::array();
                  for (int i = 0; i < 9; ++i) kept.push_back(l[i]);
                  l = kept;
                  m["kernels"][0]["params"].erase(2);
                  m["kernels"][0]["params"].erase(2);
                },
                kInvalid, {"'layout'", "'out_desc' lacks its part 'strides[1]'"}},
        BadCase{"tma_size", [](json& m) { Layout(m)[0]["size"] = 64; }, kInvalid,
                {"'layout[0].size'", "expected 128 for part 'tma'"}},
        BadCase{"tma_misaligned", [](json& m) { Layout(m)[0]["offset"] = 40; }, kInvalid,
                {"'layout[0].offset'", "40 is not aligned to 16"}},
        BadCase{"tma_offsets_differ_mod_64",
                [](json& m) {
                  json& l = Layout(m);
                  for (int i = 5; i < 14; ++i) l[i]["offset"] = l[i]["offset"].get<int>() + 16;
                },
                kInvalid, {"'layout[5].offset'", "modulo 64", "'in_desc' (layout[0])"}},
        BadCase{"desc_slot_twice",
                [](json& m) {
                  json& l = Layout(m);
                  l[5]["param"] = "in_desc";  // a second tma part of in_desc
                },
                kInvalid, {"'layout[5].param'", "parameter 'in_desc' appears twice"}},
        BadCase{"meta_length", [](json& m) { Variant(m)["tensordesc_meta"].erase(1); }, kInvalid,
                {"'tensordesc_meta'", "expected an array of 2 entries"}},
        BadCase{"meta_swizzle", [](json& m) { Variant(m)["tensordesc_meta"][0]["swizzle"] = 4; },
                kInvalid, {"'tensordesc_meta[0].swizzle'", "4 is out of range [0, 3]"}},
        BadCase{"meta_missing_field",
                [](json& m) { Variant(m)["tensordesc_meta"][1].erase("fp4_padded"); }, kInvalid,
                {"'tensordesc_meta[1].fp4_padded'", "missing"}},
        BadCase{"meta_box_rank",
                [](json& m) { Variant(m)["tensordesc_meta"][0]["block_size"] = {64}; }, kInvalid,
                {"'tensordesc_meta[0].block_size'", "expected 2 integers in [1, 256]"}},
        BadCase{"meta_box_too_big",
                [](json& m) { Variant(m)["tensordesc_meta"][0]["block_size"] = {512, 64}; },
                kInvalid, {"'tensordesc_meta[0].block_size'"}},
        BadCase{"meta_elem_size",
                [](json& m) { Variant(m)["tensordesc_meta"][0]["elem_size"] = 4; }, kInvalid,
                {"'tensordesc_meta[0].elem_size'", "differs from the 2 bytes"}},
        // The encode's element type must cover the parameter's element size: FLOAT32 over
        // fp16 would have TMA reach twice as far as the tensor goes.
        BadCase{"meta_data_type_wider",
                [](json& m) { Variant(m)["tensordesc_meta"][0]["data_type"] = 7; }, kInvalid,
                {"'tensordesc_meta[0].data_type'", "7 (a CUtensorMapDataType of 4-byte "
                 "elements) does not match the 2-byte elements of tensordesc<fp16[64, 128]>"}},
        BadCase{"meta_data_type_sub_byte",
                [](json& m) { Variant(m)["tensordesc_meta"][0]["data_type"] = 14; }, kInvalid,
                {"'tensordesc_meta[0].data_type'", "sub-byte elements"}},
        BadCase{"meta_unknown_field",
                [](json& m) { Variant(m)["tensordesc_meta"][0]["swizle"] = 3; }, kInvalid,
                {"'swizle'", "unknown field in tensordesc_meta[0]"}},
        BadCase{"meta_element_strides",
                [](json& m) { Variant(m)["tensordesc_meta"][0]["element_strides"] = {1, 9}; },
                kInvalid, {"'tensordesc_meta[0].element_strides'", "in [1, 8]"}},
        BadCase{"meta_without_descriptors_in_kpack1",
                [](json& m) {
                  m["format"] = "kpack/1";
                  m["kernels"][0]["params"][0]["type"] = "i32";
                  m["kernels"][0]["params"][1]["type"] = "i32";
                },
                kInvalid, {"'tensordesc_meta'", "needs format 'kpack/2'"}},
        BadCase{"types_other_dtype",
                [](json& m) { Variant(m)["types"] = {{"in_desc", "tensordesc<bf16[64, 128]>"}}; },
                kInvalid, {"'types.in_desc'", "must keep the element type and rank"}},
        BadCase{"types_not_a_descriptor",
                [](json& m) { Variant(m)["types"] = {{"in_desc", "i64"}}; }, kInvalid,
                {"'types.in_desc'", "can only be another tensordesc type"}},
        BadCase{"div16_on_descriptor",
                [](json& m) { Variant(m)["assumptions"] = {{"in_desc", {"div16"}}}; }, kInvalid,
                {"'assumptions.in_desc'", "div16 applies to pointers and integers only"}},
        BadCase{"tuple_element_in_kpack1",
                [](json& m) {
                  m["format"] = "kpack/1";
                  m["kernels"][0]["params"] = {{{"name", "t.0"}, {"type", "i32"}}};
                },
                kInvalid, {"'params[0].name'", "needs format 'kpack/2'"}},
        BadCase{"tuple_element_bad_index",
                [](json& m) { m["kernels"][0]["params"][2]["name"] = "sizes.x"; }, kInvalid,
                {"'params[2].name'", "'sizes.x' is not an identifier"}}));

}  // namespace
}  // namespace kpack::internal
