// The kpack/2 fields the pack tools write (docs/pack-format.md): a kernel's `source` and
// `autotune_key`, and a parameter's `readonly`. The runtime only parses and validates
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

}  // namespace
}  // namespace kpack::internal
