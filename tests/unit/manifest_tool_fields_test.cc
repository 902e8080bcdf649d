// The kpack/2 fields the pack tools write (docs/pack-format.md): a kernel's `source`,
// `autotune_key` and `grid_tolerance`, and a parameter's `readonly`. The runtime only parses and validates
// them; each is refused in a kpack/1 manifest, naming the field and the format it needs.

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manifest/manifest.h"
#include "test_manifest_json.h"

namespace kpack::internal {
namespace {

using ::kpack::testing::AddManifest;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

const std::string kSha(64, 'c');

json V2() {
  json m = AddManifest();
  m["format"] = "kpack/2";
  json& k = m["kernels"][0];
  k["source"] = {{"qualname", "mymodel.kernels.add_kernel"}, {"sha256", kSha}};
  k["autotune_key"] = {"n", "BLOCK"};
  k["params"][0]["readonly"] = true;
  k["params"][1]["readonly"] = false;
  return m;
}

std::string Error(const json& m) {
  absl::StatusOr<ManifestSpec> parsed = ParseManifest(m.dump(), "m.json");
  EXPECT_FALSE(parsed.ok()) << "accepted: " << m.dump();
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

TEST(ManifestToolFieldsTest, ParsesSourceAutotuneKeyAndReadonly) {
  absl::StatusOr<ManifestSpec> m = ParseManifest(V2().dump(), "m.json");
  ASSERT_TRUE(m.ok()) << m.status();
  const KernelSpec& k = m->kernels[0];
  EXPECT_EQ(k.source_qualname, "mymodel.kernels.add_kernel");
  EXPECT_EQ(k.source_sha256, kSha);
  EXPECT_THAT(k.autotune_key, ElementsAre(3, 4));  // indices into params: n, BLOCK
  EXPECT_TRUE(k.params[0].readonly);
  EXPECT_FALSE(k.params[1].readonly);
  EXPECT_FALSE(k.params[2].readonly);
}

TEST(ManifestToolFieldsTest, AbsentFieldsLeaveDefaults) {
  absl::StatusOr<ManifestSpec> m = ParseManifest(AddManifest().dump(), "m.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->kernels[0].source_qualname.empty());
  EXPECT_TRUE(m->kernels[0].autotune_key.empty());
  EXPECT_FALSE(m->kernels[0].params[0].readonly);
}

TEST(ManifestToolFieldsTest, EachFieldNeedsKpack2) {
  json m = V2();
  m["format"] = "kpack/1";
  EXPECT_THAT(Error(m), AllOf(HasSubstr("kernel 'add'"), HasSubstr("'params[0].readonly'"),
                              HasSubstr("needs format 'kpack/2'")));
  m["kernels"][0]["params"][0].erase("readonly");
  m["kernels"][0]["params"][1].erase("readonly");
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'source'"), HasSubstr("needs format 'kpack/2'")));
  m["kernels"][0].erase("source");
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'autotune_key'"), HasSubstr("needs format 'kpack/2'")));
}

TEST(ManifestToolFieldsTest, BadValuesNameTheField) {
  json m = V2();
  m["kernels"][0]["params"][3]["readonly"] = true;
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'params[3].readonly'"), HasSubstr("'n' is i32"),
                              HasSubstr("only a pointer")));
  m = V2();
  m["kernels"][0]["params"][0]["readonly"] = 1;
  EXPECT_THAT(Error(m), HasSubstr("expected true or false"));
  m = V2();
  m["kernels"][0]["source"]["sha256"] = std::string(64, 'C');
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'source.sha256'"), HasSubstr("64 lowercase hex")));
  m = V2();
  m["kernels"][0]["source"]["qualname"] = "";
  EXPECT_THAT(Error(m), HasSubstr("'source.qualname'"));
  m = V2();
  m["kernels"][0]["source"]["line"] = 3;
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'line'"), HasSubstr("unknown field in source")));
  m = V2();
  m["kernels"][0]["source"] = "add_kernel";
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'source'"), HasSubstr("expected an object")));
  m = V2();
  m["kernels"][0]["autotune_key"] = {"n", "M"};
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'autotune_key[1]'"), HasSubstr("\"M\" is not a parameter")));
  m = V2();
  m["kernels"][0]["autotune_key"] = {"n", "n"};
  EXPECT_THAT(Error(m), HasSubstr("listed twice"));
  m = V2();
  m["kernels"][0]["autotune_key"] = json::array();
  EXPECT_THAT(Error(m), HasSubstr("non-empty array"));
}

// `grid_tolerance` on a kernel bucketed on n (edges 16, 64): the flag, its proof, and the
// value the open-ended last bucket is padded to.
json Tolerant() {
  json m = V2();
  json& k = m["kernels"][0];
  k["buckets"] = json::array({{{"param", "n"}, {"edges", {16, 64}}}});
  k["grid_tolerance"] = {{"proof", "gpu"}, {"max", {{"n", 4096}}}};
  return m;
}

TEST(ManifestToolFieldsTest, ParsesGridTolerance) {
  absl::StatusOr<ManifestSpec> m = ParseManifest(Tolerant().dump(), "m.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->kernels[0].grid_tolerant);
  EXPECT_TRUE(m->kernels[0].grid_proven);
  EXPECT_EQ(m->kernels[0].buckets[0].grid_max, 4096);
  json asserted = Tolerant();
  asserted["kernels"][0]["grid_tolerance"] = {{"proof", "asserted"}};
  m = ParseManifest(asserted.dump(), "m.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->kernels[0].grid_tolerant);
  EXPECT_FALSE(m->kernels[0].grid_proven);
  EXPECT_FALSE(m->kernels[0].buckets[0].grid_max.has_value());
  m = ParseManifest(V2().dump(), "m.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->kernels[0].grid_tolerant);
}

TEST(ManifestToolFieldsTest, GridToleranceNeedsKpack2AndGoodValues) {
  json m = Tolerant();
  m["format"] = "kpack/1";
  for (json& p : m["kernels"][0]["params"]) p.erase("readonly");
  m["kernels"][0].erase("source");
  m["kernels"][0].erase("autotune_key");
  EXPECT_THAT(Error(m), AllOf(HasSubstr("kernel 'add'"), HasSubstr("'grid_tolerance'"),
                              HasSubstr("needs format 'kpack/2'")));
  m = Tolerant();
  m["kernels"][0]["grid_tolerance"]["proof"] = "yes";
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'grid_tolerance.proof'"), HasSubstr("\"asserted\"")));
  m = Tolerant();
  m["kernels"][0]["grid_tolerance"].erase("proof");
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'proof'"), HasSubstr("missing")));
  m = Tolerant();
  m["kernels"][0]["grid_tolerance"]["max"] = {{"x_ptr", 100}};
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'grid_tolerance.max.x_ptr'"),
                              HasSubstr("not a bucket parameter")));
  m = Tolerant();
  m["kernels"][0]["grid_tolerance"]["max"] = {{"n", 64}};
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'grid_tolerance.max.n'"),
                              HasSubstr("does not exceed the last edge 64")));
  m = Tolerant();
  m["kernels"][0]["grid_tolerance"]["max"] = {{"n", 1.5}};
  EXPECT_THAT(Error(m), HasSubstr("expected a 64-bit integer"));
  m = Tolerant();
  m["kernels"][0]["grid_tolerance"]["pad"] = true;
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'pad'"), HasSubstr("unknown field in grid_tolerance")));
  m = Tolerant();
  m["kernels"][0]["grid_tolerance"] = true;
  EXPECT_THAT(Error(m), AllOf(HasSubstr("'grid_tolerance'"), HasSubstr("expected an object")));
}

}  // namespace
}  // namespace kpack::internal
