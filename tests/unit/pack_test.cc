// kpack::Pack: the driver-free reader, its descriptions, and the property that makes
// "a pack that verifies offline always opens" hold: on every committed pack and every
// hostile pack below, Pack::Read succeeds exactly when Runtime::Open (fake driver, lazy)
// does, with the same error, and `kpack verify` (offline) reports that same error. The
// hostile packs are those of the runtime, dispatch and CLI tests' hostile cases, and the
// ones this round made Open refuse.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "fake_driver.h"
#include "fake_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "nlohmann/json.hpp"
#include "pack/pack_state.h"
#include "util/sha256.h"

namespace kpack {
namespace {

namespace fs = std::filesystem;
using ::kpack::testing::FakeOptions;
using ::kpack::testing::TempPack;
using nlohmann::json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// `kpack verify PACK` with no driver: the offline checks only.
struct VerifyResult {
  int code;
  std::string out, err;
};
VerifyResult VerifyOffline(const std::string& dir) {
  std::ostringstream out, err;
  int code = cli::Verify({.pack = dir, .offline = true}, out, err);
  return {code, out.str(), err.str()};
}

// Rewrites a cubin and makes the manifest's sha256 match, so that what is tested is the
// check after the sha256.
void ReplaceCubin(TempPack& pack, const std::string& kernel, const std::string& bytes) {
  json& variant = pack.variant(kernel);
  std::ofstream(fs::path(pack.dir()) / variant["cubin"].get<std::string>(),
                std::ios::binary | std::ios::trunc)
      << bytes;
  variant["sha256"] = internal::Sha256Hex(std::as_bytes(std::span(bytes.data(), bytes.size())));
}

std::string CubinBytes(TempPack& pack, const std::string& kernel) {
  std::ifstream in(fs::path(pack.dir()) / pack.variant(kernel)["cubin"].get<std::string>(),
                   std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A pack that lies: a copy of a committed pack, broken one way.
struct HostileCase {
  std::string name;
  std::string source;
  std::function<void(TempPack&)> mutate;  // Save() is called after
  absl::StatusCode code;
  std::vector<std::string> substrings;  // each must appear in the error
};

std::vector<HostileCase> HostileCases() {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  return {
      // Issue 12 item 2: layout order.
      {"swapped_same_size_pointers",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) {
         p.variant("add")["layout"][0]["param"] = "y_ptr";
         p.variant("add")["layout"][1]["param"] = "x_ptr";
       },
       kInvalid,
       {"kernel 'add': variant 'default'", "'layout[1].param'", "'x_ptr' comes after 'y_ptr'"}},
      {"swapped_same_size_integers",
       KPACK_DISPATCH_PACK_DIR,
       [](TempPack& p) {
         p.variant("axpy")["layout"][3]["param"] = "stride_x";
         p.variant("axpy")["layout"][4]["param"] = "n";
       },
       kInvalid,
       {"kernel 'axpy': variant 'b0_generic'", "'layout[4].param'", "'n' comes after 'stride_x'"}},
      {"profile_scratch_before_global",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) {
         p.variant("add")["layout"][4]["param"] = "$profile_scratch";
         p.variant("add")["layout"][5]["param"] = "$global_scratch";
       },
       kInvalid,
       {"kernel 'add': variant 'default'", "'layout[5].param'",
        "$global_scratch comes after $profile_scratch (layout[4])"}},
      // Issue 12 item 3: what the cubin's ELF contradicts.
      {"entry_not_in_cubin",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.variant("add")["entry"] = "not_in_the_cubin"; },
       kInvalid,
       {"kernel 'add': variant 'default': field 'entry'", "(it has: add_kernel)"}},
      {"arch_80_for_an_sm90_cubin",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.variant("add")["arch"] = 80; },
       kInvalid,
       {"kernel 'add': variant 'default': field 'arch'", "the manifest says 80",
        "was built for 90"}},
      {"arch_90_for_an_sm80_cubin",
       KPACK_ARCH_PACK_DIR,
       [](TempPack& p) { p.variant("add_sm80")["arch"] = 90; },
       kInvalid,
       {"field 'arch'", "the manifest says 90", "was built for 80"}},
      {"layout_not_kparam_info",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.variant("add")["layout"][3]["offset"] = 28; },
       kInvalid,
       {"field 'layout'", "entry 'add_kernel'",
        "parameter 'n' (#3): expected offset 28 size 4 (manifest), found offset 24 size 4"}},
      {"layout_shorter_than_kparam_info",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.variant("add")["layout"].erase(5); },
       kInvalid,
       {"field 'layout'", "parameter #5: the cubin has it"}},
      {"layout_of_another_kernel",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) {
         // The scalars kernel's cubin under add's name: a real cubin, the wrong one.
         json& add = p.variant("add");
         const json& scalars = p.variant("scalars");
         add["cubin"] = scalars["cubin"];
         add["sha256"] = scalars["sha256"];
         add["entry"] = scalars["entry"];
       },
       kInvalid,
       {"kernel 'add': variant 'default': field 'layout'", "scalars_kernel"}},
      {"not_a_cubin",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { ReplaceCubin(p, "add", std::string(4096, 'x')); },
       kInvalid,
       {"kernel 'add': variant 'default': cubin 'cubins/add/default.cubin'", "not a valid cubin",
        "ELF magic"}},
      {"cubin_truncated",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { ReplaceCubin(p, "add", CubinBytes(p, "add").substr(0, 3000)); },
       kInvalid,
       {"kernel 'add': variant 'default'", "not a valid cubin", "truncated"}},
      // Grid expressions (compiled for every variant) and dispatch tables.
      {"grid_unknown_name",
       KPACK_DISPATCH_PACK_DIR,
       [](TempPack& p) { p.kernel("axpy")["grid"] = {"cdiv(n, BLOK)"}; },
       kInvalid,
       {"kernel 'axpy': variant 'b0_generic': field 'grid[0]'", "BLOK"}},
      {"grid_divides_by_zero",
       KPACK_DISPATCH_PACK_DIR,
       [](TempPack& p) { p.kernel("axpy")["grid"] = {"cdiv(n, 0)"}; },
       kInvalid,
       {"kernel 'axpy': variant 'b0_generic': field 'grid[0]'"}},
      {"grid_syntax_error",
       KPACK_DISPATCH_PACK_DIR,
       [](TempPack& p) { p.kernel("axpy")["grid"] = {"cdiv(n, "}; },
       kInvalid,
       {"field 'grid[0]'"}},
      {"grid_names_a_pointer",
       KPACK_DISPATCH_PACK_DIR,
       [](TempPack& p) { p.kernel("axpy")["grid"] = {"x_ptr"}; },
       kInvalid,
       {"field 'grid[0]'", "x_ptr"}},
      {"too_many_buckets",
       KPACK_DISPATCH_PACK_DIR,
       [](TempPack& p) {
         json edges = json::array();
         for (int e = 1; e <= 2000; ++e) edges.push_back(e);
         p.kernel("axpy")["buckets"].push_back({{"param", "stride_x"}, {"edges", edges}});
         for (json& v : p.kernel("axpy")["variants"]) v["bucket"].push_back(0);
       },
       kInvalid,
       {"kernel 'axpy'", "'buckets'", "6003 buckets"}},
      // A block size the cubin refuses: ptxas recorded .reqntid 128 (Triton's 4 warps).
      {"num_warps_contradicts_the_cubins_block",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.variant("add")["num_warps"] = 8; },
       kInvalid,
       {"kernel 'add': variant 'default': field 'num_warps'",
        "8 warps launch blocks of 256x1x1 threads", "entry 'add_kernel'",
        "requires blocks of 128x1x1 (its .reqntid"}},
      // Sizes from fstat, checked before anything is allocated (a sparse terabyte).
      {"cubin_of_a_terabyte",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) {
         fs::resize_file(fs::path(p.dir()) / "cubins/add/default.cubin", uintmax_t{1} << 40);
       },
       kInvalid,
       {"kernel 'add': variant 'default': field 'cubin'", "1099511627776 bytes",
        "more than the 1073741824 a pack's cubin may have"}},
      // The manifest.
      {"num_warps_1e30",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.variant("add")["num_warps"] = 1e30; },
       kInvalid,
       {"'num_warps'", "expected an integer in [1, 32], got 1e+30"}},
      {"layout_size_lie",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.variant("add")["layout"][3]["size"] = 8; },
       kInvalid,
       {"'layout[3].size'", "parameter 'n'"}},
      {"duplicate_kernel",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.manifest()["kernels"].push_back(p.kernel("add")); },
       kInvalid,
       {"duplicate kernel 'add'"}},
      {"unknown_field",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.variant("add")["num_warp"] = 4; },
       kInvalid,
       {"'num_warp'"}},
      {"host_tma_descriptor",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.kernel("add")["params"][0]["type"] = "nvTmaDesc"; },
       absl::StatusCode::kUnimplemented,
       {"nvTmaDesc"}},
      // Files.
      {"sha256_mismatch",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) {
         std::ofstream(fs::path(p.dir()) / "cubins/add/default.cubin", std::ios::app) << "x";
       },
       kInvalid,
       {"kernel 'add': variant 'default': field 'sha256'", "changed or corrupted"}},
      {"cubin_empty",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) {
         std::ofstream(fs::path(p.dir()) / "cubins/add/default.cubin", std::ios::trunc);
       },
       kInvalid,
       {"is empty"}},
      {"cubin_missing",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { fs::remove(fs::path(p.dir()) / "cubins/add/default.cubin"); },
       absl::StatusCode::kNotFound,
       {"kernel 'add': variant 'default'", "does not exist"}},
      {"cubin_path_dotdot",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.variant("add")["cubin"] = "../outside.cubin"; },
       kInvalid,
       {"'..'"}},
      {"cubin_path_absolute",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) {
         p.variant("add")["cubin"] = std::string(KPACK_TEST_PACK_DIR) + "/cubins/add/default.cubin";
       },
       kInvalid,
       {"absolute"}},
      {"cubin_symlink_outside",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) {
         const fs::path outside = p.root() / "outside.cubin";
         fs::copy_file(fs::path(p.dir()) / "cubins/add/default.cubin", outside);
         fs::create_symlink(outside, fs::path(p.dir()) / "cubins/add/link.cubin");
         p.variant("add")["cubin"] = "cubins/add/link.cubin";
       },
       kInvalid,
       {"outside the pack directory"}},
      {"manifest_missing",
       KPACK_TEST_PACK_DIR,
       [](TempPack& p) { p.manifest() = nullptr; },
       absl::StatusCode::kNotFound,
       {"manifest.json"}},
  };
}

class HostilePackTest : public ::testing::TestWithParam<HostileCase> {
 protected:
  void SetUp() override { fake::Reset(); }
  void TearDown() override { fake::Reset(); }
};

// The property, on one pack directory: Read, Open (lazy, fake driver), Verify and
// `kpack verify` agree.
void ExpectReadOpenAndVerifyAgree(const std::string& dir) {
  absl::StatusOr<Pack> read = Pack::Read(dir);
  absl::StatusOr<Runtime> open = Runtime::Open(dir, FakeOptions());
  ASSERT_EQ(read.ok(), open.ok()) << "Read: " << read.status() << "\nOpen: " << open.status();
  if (!read.ok()) EXPECT_EQ(read.status(), open.status());
  std::vector<absl::Status> problems = Pack::Verify(dir);
  EXPECT_EQ(problems.empty(), read.ok());
  if (!read.ok() && !problems.empty()) EXPECT_EQ(problems[0], read.status());
  VerifyResult verify = VerifyOffline(dir);
  EXPECT_EQ(verify.code == cli::kOk, read.ok()) << verify.err;
  if (!read.ok()) EXPECT_THAT(verify.err, HasSubstr(Msg(read.status())));
  EXPECT_EQ(fake::CallCount("LibraryLoadData"), 0) << "Open is lazy: nothing is loaded";
}

TEST_P(HostilePackTest, RefusedAlikeByReadOpenAndVerify) {
  const HostileCase& c = GetParam();
  TempPack pack(c.source);
  c.mutate(pack);
  if (pack.manifest().is_null()) {
    fs::remove(fs::path(pack.dir()) / "manifest.json");
  } else {
    pack.Save();
  }
  absl::StatusOr<Pack> read = Pack::Read(pack.dir());
  ASSERT_FALSE(read.ok()) << c.name << " was accepted";
  EXPECT_EQ(read.status().code(), c.code) << read.status();
  for (const std::string& s : c.substrings) EXPECT_THAT(Msg(read.status()), HasSubstr(s));
  ExpectReadOpenAndVerifyAgree(pack.dir());
}

INSTANTIATE_TEST_SUITE_P(Cases, HostilePackTest, ::testing::ValuesIn(HostileCases()),
                         [](const ::testing::TestParamInfo<HostileCase>& info) {
                           return info.param.name;
                         });

TEST(PackTest, AManifestOfATerabyteIsRefusedByItsSize) {
  fake::Reset();
  TempPack pack(KPACK_TEST_PACK_DIR);
  fs::resize_file(fs::path(pack.dir()) / "manifest.json", uintmax_t{1} << 40);
  absl::StatusOr<Pack> read = Pack::Read(pack.dir());
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
  EXPECT_THAT(Msg(read.status()),
              AllOf(HasSubstr("manifest.json' is 1099511627776 bytes"),
                    HasSubstr("more than the 268435456 a pack's manifest may have")));
  ExpectReadOpenAndVerifyAgree(pack.dir());
}

// kpack::DescribeBucket and BucketDimInfo::RangeOf: the one rule for a bucket's range and
// its spelling, which dispatch errors, StepGraph errors, `kpack inspect` and the Python
// tools (through the extension) all use.
TEST(PackTest, BucketRangesHaveOneSpelling) {
  const BucketDimInfo m{"M", {16, 64}, std::nullopt};
  EXPECT_FALSE(m.RangeOf(0).low.has_value());
  EXPECT_EQ(m.RangeOf(0).high, 16);
  EXPECT_EQ(m.RangeOf(1).low, 17);
  EXPECT_EQ(m.RangeOf(1).high, 64);
  EXPECT_EQ(m.RangeOf(2).low, 65);
  EXPECT_FALSE(m.RangeOf(2).high.has_value());
  EXPECT_EQ(m.DescribeRange(0), "M <= 16");
  EXPECT_EQ(m.DescribeRange(1), "17 <= M <= 64");
  EXPECT_EQ(m.DescribeRange(2), "M >= 65");
  EXPECT_EQ(m.DescribeRange(3), "M in no bucket (index 3 of 3)");
  const BucketDimInfo n{"N", {4096}, 8192};
  const BucketDimInfo dims[] = {m, n};
  const int index[] = {1, 1};
  EXPECT_EQ(DescribeBucket(dims, index), "17 <= M <= 64, N >= 4097");
  EXPECT_EQ(DescribeBucket(dims, {}), "every bucket");
  EXPECT_EQ(DescribeBucket({}, index), "no buckets");
  // The largest edge there is: the bucket above it holds nothing, and nothing overflows.
  const BucketDimInfo top{"n", {0, std::numeric_limits<int64_t>::max()}, std::nullopt};
  EXPECT_EQ(top.DescribeRange(1), "1 <= n <= 9223372036854775807");
  EXPECT_EQ(top.DescribeRange(2), "n >= 9223372036854775807");
  // What `kpack inspect` prints for the dispatch pack (whose edges are 4096 and 262144).
  absl::StatusOr<Pack> pack = Pack::Read(KPACK_DISPATCH_PACK_DIR);
  ASSERT_TRUE(pack.ok()) << pack.status();
  const KernelInfo& axpy = pack->kernels()[0];
  EXPECT_EQ(DescribeBucket(axpy.buckets, axpy.variants[0].bucket), "n <= 4096");
}

TEST(PackTest, CommittedPacksAreReadOpenedAndVerifiedAlike) {
  for (const char* dir : {KPACK_TEST_PACK_DIR, KPACK_DISPATCH_PACK_DIR, KPACK_ARCH_PACK_DIR,
                          KPACK_EXAMPLE_PACK_DIR, KPACK_BENCH_PACK_DIR, KPACK_GRAPH_PACK_DIR}) {
    SCOPED_TRACE(dir);
    fake::Reset();
    ASSERT_TRUE(Pack::Read(dir).ok()) << Pack::Read(dir).status();
    ExpectReadOpenAndVerifyAgree(dir);
  }
  fake::Reset();
  EXPECT_EQ(Pack::Read("/nonexistent/pack").status().code(), absl::StatusCode::kNotFound);
  ExpectReadOpenAndVerifyAgree("/nonexistent/pack");
}

// Reading spreads its work over threads on large packs; on any pack, any number of
// threads reports what one thread does: the same first problem, the same list.
TEST(PackTest, ThreadsChangeNothingButTheTime) {
  TempPack pack;
  json& kernels = pack.manifest()["kernels"];
  const json originals = kernels;
  for (int copy = 0; copy < 20; ++copy) {  // 147 kernels, each with its cubin
    for (json kernel : originals) {
      kernel["name"] = kernel["name"].get<std::string>() + "_" + std::to_string(copy);
      kernels.push_back(kernel);
    }
  }
  const json entry = kernels[40]["variants"][0]["entry"];
  kernels[40]["variants"][0]["entry"] = "nope";
  kernels[90]["variants"][0]["arch"] = 80;
  pack.Save();
  auto read = [&](unsigned threads, std::vector<absl::Status>* problems) {
    return internal::ReadPack(pack.dir(), {.problems = problems, .threads = threads}).status();
  };
  std::vector<absl::Status> serial_problems;
  const absl::Status serial = read(1, nullptr);
  ASSERT_TRUE(read(1, &serial_problems).ok());
  ASSERT_EQ(serial_problems.size(), 2u);
  EXPECT_EQ(serial, serial_problems[0]);
  EXPECT_THAT(Msg(serial), HasSubstr("field 'entry'"));
  for (unsigned threads : {2u, 4u, 8u}) {
    SCOPED_TRACE(threads);
    EXPECT_EQ(read(threads, nullptr), serial);
    std::vector<absl::Status> problems;
    ASSERT_TRUE(read(threads, &problems).ok());
    EXPECT_EQ(problems, serial_problems);
  }
  kernels[40]["variants"][0]["entry"] = entry;
  kernels[90]["variants"][0]["arch"] = 90;
  pack.Save();
  for (unsigned threads : {1u, 4u}) {
    absl::StatusOr<internal::ReadPackResult> ok =
        internal::ReadPack(pack.dir(), {.keep_cubins = true, .threads = threads});
    ASSERT_TRUE(ok.ok()) << ok.status();
    ASSERT_EQ(ok->state->kernels.size(), kernels.size());
    EXPECT_EQ(ok->state->kernels[146].name, "softmax_19");
    EXPECT_FALSE(ok->tables[146].variants[0].cubin.empty());
  }
}

TEST(PackTest, ReadNeedsNoDriver) {
  const char* old = std::getenv("KPACK_CUDA_DRIVER");
  const std::string saved = old != nullptr ? old : "";
  setenv("KPACK_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  absl::StatusOr<Pack> pack = Pack::Read(KPACK_TEST_PACK_DIR);
  absl::StatusOr<Runtime> rt = Runtime::Open(KPACK_TEST_PACK_DIR);
  if (old != nullptr) {
    setenv("KPACK_CUDA_DRIVER", saved.c_str(), 1);
  } else {
    unsetenv("KPACK_CUDA_DRIVER");
  }
  ASSERT_TRUE(pack.ok()) << pack.status();
  EXPECT_EQ(pack->kernels().size(), 7u);
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kUnavailable) << "the driver really is absent";
}

TEST(PackTest, DescribesTheTestPack) {
  absl::StatusOr<Pack> pack = Pack::Read(KPACK_TEST_PACK_DIR);
  ASSERT_TRUE(pack.ok()) << pack.status();
  EXPECT_EQ(pack->format_version(), 1);
  EXPECT_THAT(pack->generator(), HasSubstr("triton"));
  EXPECT_EQ(pack->dir(), fs::canonical(KPACK_TEST_PACK_DIR).string());
  absl::StatusOr<const KernelInfo*> add = pack->Find("add");
  ASSERT_TRUE(add.ok()) << add.status();
  const KernelInfo& k = **add;
  EXPECT_EQ(k.name, "add");
  ASSERT_EQ(k.params.size(), 5u);
  EXPECT_EQ(k.params[0].name, "x_ptr");
  EXPECT_EQ(k.params[0].type, "*fp32");
  EXPECT_FALSE(k.params[3].is_constexpr);
  EXPECT_TRUE(k.params[4].is_constexpr);
  EXPECT_THAT(k.call_params, ElementsAre(0, 1, 2, 3));
  EXPECT_TRUE(k.buckets.empty());
  EXPECT_TRUE(k.grid.empty());
  ASSERT_EQ(k.variants.size(), 1u);
  const VariantInfo& v = k.variants[0];
  EXPECT_EQ(v.name, "default");
  EXPECT_EQ(v.entry, "add_kernel");
  EXPECT_EQ(v.cubin, "cubins/add/default.cubin");
  EXPECT_EQ(v.arch, 90);
  EXPECT_EQ(v.num_warps, 4);
  EXPECT_EQ(json::parse(v.constexprs_json), json({{"BLOCK", 1024}}));
  EXPECT_THAT(v.arg_types, ElementsAre("*fp32", "*fp32", "*fp32", "i32"));
  ASSERT_EQ(v.layout.size(), 6u);
  EXPECT_EQ(v.layout[3].name, "n");
  EXPECT_EQ(v.layout[3].offset, 24u);
  EXPECT_EQ(v.layout[3].size, 4u);
  EXPECT_EQ(v.layout[5].name, "$profile_scratch");
  EXPECT_EQ(v.param_bytes, 48u);

  absl::StatusOr<const KernelInfo*> scratch = pack->Find("scratch");
  ASSERT_TRUE(scratch.ok());
  EXPECT_GT((*scratch)->variants[0].global_scratch_size, 0u);
  EXPECT_TRUE((*pack->Find("pdl"))->variants[0].launch_pdl);
  EXPECT_EQ((*pack->Find("cluster"))->variants[0].num_ctas, 2);
}

TEST(PackTest, DescribesDispatch) {
  absl::StatusOr<Pack> pack = Pack::Read(KPACK_DISPATCH_PACK_DIR);
  ASSERT_TRUE(pack.ok()) << pack.status();
  const KernelInfo& k = pack->kernels()[0];
  ASSERT_EQ(k.buckets.size(), 1u);
  EXPECT_EQ(k.buckets[0].param, "n");
  EXPECT_THAT(k.buckets[0].edges, ElementsAre(4096, 262144));
  EXPECT_THAT(k.grid, ElementsAre("cdiv(n, BLOCK)"));
  const VariantInfo& unit = k.variants[2];
  EXPECT_EQ(unit.name, "b0_div16_unit");
  EXPECT_THAT(unit.bucket, ElementsAre(0));
  ASSERT_EQ(unit.assumptions.size(), 5u);
  std::vector<std::string> assumed;
  for (const AssumptionInfo& a : unit.assumptions) assumed.push_back(a.param + ":" + a.kind);
  EXPECT_THAT(assumed, ::testing::UnorderedElementsAre("x_ptr:div16", "y_ptr:div16",
                                                       "out_ptr:div16", "n:div16", "stride_x:eq1"));
  EXPECT_EQ(unit.layout.size(), 7u) << "stride_x was compiled away";
  const VariantInfo& wide = k.variants[9];
  EXPECT_EQ(wide.name, "b2_generic_i64");
  EXPECT_EQ(wide.arg_types[3], "i64");
  EXPECT_EQ(wide.arg_types[4], "i32");
}

// The kpack/2 fields the pack tools write: what a torch-op schema and the Python drop-in
// read from the public description.
TEST(PackTest, DescribesTheToolFields) {
  absl::StatusOr<Pack> example = Pack::Read(KPACK_EXAMPLE_PACK_DIR);
  ASSERT_TRUE(example.ok()) << example.status();
  const KernelInfo& add = **example->Find("vector_add");
  EXPECT_EQ(add.source.qualname, "vector_add.vector_add_kernel");
  EXPECT_EQ(add.source.sha256.size(), 64u);
  std::vector<bool> readonly;
  for (const ParamInfo& p : add.params) readonly.push_back(p.readonly);
  EXPECT_THAT(readonly, ElementsAre(true, true, false, false, false)) << "x_ptr, y_ptr read only";
  EXPECT_TRUE(add.autotune_key.empty());
  // Two pack kernels compiled from one function (fp16 and bf16 matmul) share its source.
  EXPECT_EQ((*example->Find("matmul_fp16"))->source.sha256,
            (*example->Find("matmul_bf16"))->source.sha256);

  TempPack pack;
  pack.manifest()["format"] = "kpack/2";
  json& k = pack.kernel("add");
  k["source"] = {{"qualname", "models.kernels.add_kernel"}, {"sha256", std::string(64, 'a')}};
  k["autotune_key"] = {"n", "BLOCK"};
  k["params"][2]["readonly"] = false;
  pack.Save();
  absl::StatusOr<Pack> read = Pack::Read(pack.dir());
  ASSERT_TRUE(read.ok()) << read.status();
  const KernelInfo& info = **read->Find("add");
  EXPECT_EQ(info.source.qualname, "models.kernels.add_kernel");
  EXPECT_EQ(info.source.sha256, std::string(64, 'a'));
  EXPECT_THAT(info.autotune_key, ElementsAre("n", "BLOCK"));
  EXPECT_FALSE(info.params[2].readonly);
  const KernelInfo& scalars = **read->Find("scalars");
  EXPECT_TRUE(scalars.source.qualname.empty() && scalars.source.sha256.empty());
  EXPECT_TRUE(scalars.autotune_key.empty());
}

TEST(PackTest, FindListsTheKernelsThereAre) {
  absl::StatusOr<Pack> pack = Pack::Read(KPACK_TEST_PACK_DIR);
  ASSERT_TRUE(pack.ok());
  absl::StatusOr<const KernelInfo*> none = pack->Find("nosuch");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(none.status()),
              AllOf(HasSubstr("no kernel named 'nosuch' in pack '" + pack->dir() + "'"),
                    HasSubstr("(it has: add, scalars, matmul, cluster, pdl, scratch, softmax)")));
}

// The fast path opens cubins with openat2(RESOLVE_BENEATH), which refuses every symlink
// that is absolute; the rule is only that the target stays inside the pack.
TEST(PackTest, SymlinksThatStayInsideThePackAreFollowed) {
  TempPack pack;
  const fs::path cubins = fs::path(pack.dir()) / "cubins";
  fs::create_symlink("../add/default.cubin", cubins / "scalars" / "relative.cubin");
  fs::create_symlink(cubins / "add" / "default.cubin", cubins / "pdl" / "absolute.cubin");
  fs::create_directory_symlink(cubins / "add", cubins / "add_link");
  for (const auto& [kernel, path] : {std::pair{"scalars", "cubins/scalars/relative.cubin"},
                                     std::pair{"pdl", "cubins/pdl/absolute.cubin"},
                                     std::pair{"cluster", "cubins/add_link/default.cubin"}}) {
    json& v = pack.variant(kernel);
    v = pack.variant("add");  // the add variant's cubin, reached through the link
    v["cubin"] = path;
  }
  for (const char* kernel : {"scalars", "pdl", "cluster"}) {
    pack.kernel(kernel)["params"] = pack.kernel("add")["params"];
  }
  pack.Save();
  absl::StatusOr<Pack> read = Pack::Read(pack.dir());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read->Find("pdl"))->variants[0].cubin, "cubins/pdl/absolute.cubin");
}

TEST(PackTest, CopiesShareTheDescription) {
  absl::StatusOr<Pack> pack = Pack::Read(KPACK_TEST_PACK_DIR);
  ASSERT_TRUE(pack.ok());
  Pack copy = *pack;
  EXPECT_EQ(&copy.kernels(), &pack->kernels());
}

TEST(PackTest, VerifyListsEveryProblemAndReadTheFirst) {
  TempPack pack;
  pack.variant("add")["entry"] = "nope";
  pack.variant("pdl")["arch"] = 80;
  pack.variant("softmax")["layout"][1]["offset"] = 0;  // overlaps layout[0]
  pack.Save();
  // The manifest is checked before any cubin: a manifest that does not parse is the one
  // problem, as nothing after it can be checked.
  std::vector<absl::Status> problems = Pack::Verify(pack.dir());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(Msg(problems[0]), HasSubstr("kernel 'softmax': variant 'default': field "
                                          "'layout[1].offset'"));
  pack.variant("softmax")["layout"][1]["offset"] = 8;
  pack.Save();
  problems = Pack::Verify(pack.dir());
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_THAT(Msg(problems[0]), HasSubstr("kernel 'add': variant 'default': field 'entry'"));
  EXPECT_THAT(Msg(problems[1]), HasSubstr("kernel 'pdl': variant 'default': field 'arch'"));
  EXPECT_EQ(Pack::Read(pack.dir()).status(), problems[0]);
}

TEST(PackTest, RuntimeDescribesItsPackAndKernels) {
  fake::Reset();
  absl::StatusOr<Runtime> rt = Runtime::Open(KPACK_DISPATCH_PACK_DIR, FakeOptions());
  ASSERT_TRUE(rt.ok()) << rt.status();
  EXPECT_EQ(rt->pack().dir(), fs::canonical(KPACK_DISPATCH_PACK_DIR).string());
  ASSERT_EQ(rt->pack().kernels().size(), 1u);
  absl::StatusOr<Kernel> axpy = rt->Find("axpy");
  ASSERT_TRUE(axpy.ok());
  EXPECT_EQ(&axpy->info(), &rt->pack().kernels()[0]);
  EXPECT_EQ(axpy->info().variants.size(), 10u);
  // A Runtime's unknown-kernel error lists the kernels too.
  EXPECT_THAT(Msg(rt->Find("axp").status()), HasSubstr("(it has: axpy)"));
  Pack copy = rt->pack();
  rt = absl::UnavailableError("gone");  // the Runtime closes; the copy lives on
  EXPECT_EQ(copy.kernels()[0].name, "axpy");
}

TEST(PackTest, GridForEvaluatesTheGridExpressions) {
  fake::Reset();
  absl::StatusOr<Runtime> rt = Runtime::Open(KPACK_DISPATCH_PACK_DIR, FakeOptions());
  ASSERT_TRUE(rt.ok()) << rt.status();
  Kernel axpy = *rt->Find("axpy");
  const CUdeviceptr p = 0x10000;
  const Arg args[] = {Arg(p), Arg(p), Arg(p), Arg(int64_t{5000}), Arg(int64_t{3}), Arg(2.0f)};
  absl::StatusOr<Grid> grid = axpy.GridFor(args);
  ASSERT_TRUE(grid.ok()) << grid.status();
  // The grid is cdiv(n, BLOCK) with the BLOCK of the variant these arguments select.
  absl::StatusOr<std::string_view> chosen = axpy.SelectVariant(args);
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(*chosen, "b1_generic");
  const int64_t block = json::parse(axpy.info().variants[3].constexprs_json)["BLOCK"];
  EXPECT_EQ(grid->x, static_cast<uint32_t>((5000 + block - 1) / block));
  EXPECT_EQ(grid->y, 1u);
  EXPECT_EQ(grid->z, 1u);
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);

  absl::StatusOr<Runtime> test = Runtime::Open(KPACK_TEST_PACK_DIR, FakeOptions());
  ASSERT_TRUE(test.ok());
  const Arg add_args[] = {Arg(p), Arg(p), Arg(p), Arg(int64_t{5000})};
  EXPECT_EQ(test->Find("add")->GridFor(add_args).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "add has no grid expressions";
}

}  // namespace
}  // namespace kpack
