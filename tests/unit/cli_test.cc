// The `kpack` command line, run in-process: inspect, verify (offline, and through the
// fake driver), run and bench (through the fake driver), doctor, and their error cases.

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "commands.h"
#include "fake_driver.h"
#include "fake_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "npy.h"

namespace kpack::cli {
namespace {

using ::kpack::testing::At;
using ::kpack::testing::LastLaunch;
using ::kpack::testing::TempPack;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kFake = KPACK_FAKE_DRIVER;
const std::string kNoDriver = "/nonexistent/libcuda.so.1";

struct Result {
  int code;
  std::string out, err;
};

Result Cli(std::vector<std::string> args) {
  args.insert(args.begin(), "kpack");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::ostringstream out, err;
  int code = RunCli(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::Reset();
    dir_ = std::filesystem::temp_directory_path() /
           ("kpack_cli_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    fake::Reset();
  }
  std::string Npy(const std::string& name, const std::vector<float>& values) {
    NpyArray a;
    a.dtype = "<f4";
    a.shape = {static_cast<int64_t>(values.size())};
    a.data.resize(values.size() * 4);
    std::memcpy(a.data.data(), values.data(), a.data.size());
    std::string path = (dir_ / name).string();
    EXPECT_TRUE(WriteNpy(path, a).ok());
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(CliTest, UsageErrors) {
  EXPECT_EQ(Cli({}).code, kUsage);
  EXPECT_EQ(Cli({"frobnicate"}).code, kUsage);
  Result help = Cli({"--help"});
  EXPECT_EQ(help.code, kOk);
  EXPECT_THAT(help.out, AllOf(HasSubstr("inspect"), HasSubstr("verify"), HasSubstr("run"),
                              HasSubstr("bench"), HasSubstr("doctor")));
}

TEST_F(CliTest, InspectShowsKernelsVariantsAndLayouts) {
  Result r = Cli({"inspect", KPACK_TEST_PACK_DIR});
  ASSERT_EQ(r.code, kOk) << r.err;
  EXPECT_THAT(
      r.out,
      AllOf(HasSubstr("kernel add(x_ptr: *fp32"), HasSubstr("BLOCK: constexpr"),
            HasSubstr("variant default: entry add_kernel, sm_90a, 4 warps"),
            HasSubstr("layout (48 B): x_ptr@0:8"), HasSubstr("$global_scratch@32:8"),
            HasSubstr("cluster 2x1x1"), HasSubstr("programmatic stream serialization (PDL)"),
            HasSubstr("scratch: global 128 B/program (align 128)"), HasSubstr("65536 B shared")));
  r = Cli({"inspect", KPACK_DISPATCH_PACK_DIR, "axpy"});
  ASSERT_EQ(r.code, kOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("buckets on n: edges 4096, 262144"),
                           HasSubstr("grid: (cdiv(n, BLOCK))"),
                           HasSubstr("bucket: 4097 <= n <= 262144"), HasSubstr("n >= 262145"),
                           HasSubstr("\"stride_x\":[\"eq1\"]"), HasSubstr("{\"n\":\"i64\"}")));
}

TEST_F(CliTest, InspectJson) {
  Result r = Cli({"inspect", KPACK_DISPATCH_PACK_DIR, "--json"});
  ASSERT_EQ(r.code, kOk) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["kernels"].size(), 1u);
  const auto& k = j["kernels"][0];
  EXPECT_EQ(k["name"], "axpy");
  EXPECT_EQ(k["buckets"][0]["param"], "n");
  EXPECT_EQ(k["variants"].size(), 10u);
  EXPECT_EQ(k["variants"][2]["assumptions"]["stride_x"][0], "eq1");
  EXPECT_EQ(k["variants"][2]["layout"].size(), 7u);
  EXPECT_EQ(k["variants"][9]["types"]["n"], "i64");
}

TEST_F(CliTest, InspectShowsGridTolerance) {
  Result r = Cli({"inspect", KPACK_GRAPH_PACK_DIR, "vector_add"});
  ASSERT_EQ(r.code, kOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("grid tolerance: asserted, unproven (a CUDA graph pads the grid "
                               "to the buckets' upper edges)"));
  r = Cli({"inspect", KPACK_GRAPH_PACK_DIR, "--json"});
  ASSERT_EQ(r.code, kOk) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kernels"][0]["grid_tolerance"], nlohmann::json({{"proof", "asserted"}}));
  EXPECT_FALSE(j["kernels"][2].contains("grid_tolerance")) << "softmax";
}

TEST_F(CliTest, InspectErrors) {
  Result r = Cli({"inspect", KPACK_TEST_PACK_DIR, "nope"});
  EXPECT_EQ(r.code, kFailed);
  // The kernels there are, so that a typo is one look away from its fix.
  EXPECT_THAT(r.err, AllOf(HasSubstr("no kernel named 'nope'"),
                           HasSubstr("(it has: add, scalars, matmul, cluster, pdl, scratch, "
                                     "softmax)")));
  r = Cli({"inspect", "/nonexistent"});
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.err, HasSubstr("not a directory"));
}

TEST_F(CliTest, VerifyBundledPacksOfflineAndThroughTheDriver) {
  for (const char* pack : {KPACK_TEST_PACK_DIR, KPACK_DISPATCH_PACK_DIR}) {
    Result offline = Cli({"verify", pack, "--offline"});
    EXPECT_EQ(offline.code, kOk) << offline.err;
    EXPECT_THAT(offline.out, AllOf(HasSubstr("grid expressions; dispatch tables): OK"),
                                   HasSubstr("driver checks skipped: --offline"),
                                   HasSubstr("OK: ")));
    fake::Reset();
    Result loaded = Cli({"verify", pack, "--driver", kFake});
    EXPECT_EQ(loaded.code, kOk) << loaded.err;
    EXPECT_THAT(loaded.out, HasSubstr("variants loaded and checked on device 0: OK"));
    EXPECT_GT(fake::LibraryLoads(), 0);
  }
}

// Counts in words ("1 kernel", not "1 kernels"), and each problem on stderr under the
// subcommand's name, as the other subcommands write theirs.
TEST_F(CliTest, VerifySpeaksLikeTheOtherSubcommands) {
  Result one = Cli({"verify", KPACK_SCALAR_PACK_DIR, "--offline"});
  EXPECT_EQ(one.code, kOk) << one.err;
  EXPECT_THAT(one.out, HasSubstr("offline: manifest, 1 kernel, 1 variant ("));
  Result many = Cli({"verify", KPACK_DISPATCH_PACK_DIR, "--offline"});
  EXPECT_THAT(many.out, HasSubstr("offline: manifest, 1 kernel, 10 variants ("));
  TempPack pack;
  pack.variant("add")["arch"] = 80;
  pack.variant("scalars")["entry"] = "not_there";
  pack.Save();
  Result bad = Cli({"verify", pack.dir(), "--offline"});
  EXPECT_EQ(bad.code, kFailed);
  const std::vector<std::string> lines = absl::StrSplit(bad.err, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << bad.err;
  for (const std::string& line : lines) {
    EXPECT_TRUE(absl::StartsWith(line, "kpack verify: ")) << line;
  }
  EXPECT_EQ(lines.back(), "kpack verify: FAILED: 2 problems");
}

TEST_F(CliTest, VerifyCatchesALayoutLieOfflineNamingTheParameter) {
  TempPack pack;
  pack.variant("add")["layout"][3]["offset"] = 28;  // the cubin says 24
  pack.Save();
  Result r = Cli({"verify", pack.dir(), "--offline"});
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.err,
              AllOf(HasSubstr("kernel 'add': variant 'default'"), HasSubstr("parameter 'n' (#3)"),
                    HasSubstr("expected offset 28 size 4 (manifest)"),
                    HasSubstr("found offset 24 size 4 (cubin)"), HasSubstr("FAILED: 1 problem")));
  EXPECT_THAT(r.out, Not(HasSubstr("OK: ")));
}

TEST_F(CliTest, VerifyCatchesASizeLieInTheManifest) {
  TempPack pack;
  pack.variant("add")["layout"][3]["size"] = 8;
  pack.Save();
  Result r = Cli({"verify", pack.dir(), "--offline"});
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("kernel 'add'"), HasSubstr("layout[3].size"),
                           HasSubstr("parameter 'n'")));
}

TEST_F(CliTest, VerifyReportsEveryProblemOnItsOwnLine) {
  TempPack pack;
  pack.variant("add")["arch"] = 80;
  pack.variant("scalars")["entry"] = "not_there";
  std::ofstream(std::filesystem::path(pack.dir()) / "cubins/pdl/default.cubin", std::ios::app)
      << "x";
  pack.Save();
  Result r = Cli({"verify", pack.dir(), "--offline"});
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("kernel 'add': variant 'default': field 'arch': the "
                                     "manifest says 80, cubin 'cubins/add/default.cubin' was "
                                     "built for 90"),
                           HasSubstr("kernel 'scalars': variant 'default': field 'entry': "
                                     "'not_there' is not a kernel of cubin "
                                     "'cubins/scalars/default.cubin' (it has: scalars_kernel)"),
                           HasSubstr("kernel 'pdl': variant 'default': field 'sha256'"),
                           HasSubstr("FAILED: 3 problems")));
}

// A driver named with --driver must load, as doctor requires: `verify --driver PATH` fails
// (it used to print OK) when PATH does not load; --offline loads none.
TEST_F(CliTest, VerifyFailsWhenTheDriverItIsGivenDoesNotLoad) {
  Result r = Cli({"verify", KPACK_TEST_PACK_DIR, "--driver", kNoDriver});
  EXPECT_EQ(r.code, kFailed) << r.out;
  EXPECT_THAT(r.err, AllOf(HasSubstr("driver: no CUDA driver: dlopen(\"" + kNoDriver + "\")"),
                           HasSubstr("FAILED: 1 problem")));
  EXPECT_THAT(r.out, AllOf(HasSubstr("offline: manifest, 7 kernels"), Not(HasSubstr("OK: "))));
}

// Every subcommand takes --driver (the README says so): inspect needs none, so a named one
// is only loaded, and must load.
TEST_F(CliTest, InspectTakesDriver) {
  Result r = Cli({"inspect", KPACK_TEST_PACK_DIR, "add", "--driver", kFake});
  ASSERT_EQ(r.code, kOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("driver: " + kFake + " (loads; inspecting needs none)"),
                           HasSubstr("kernel add(")));
  r = Cli({"inspect", KPACK_TEST_PACK_DIR, "--driver", kNoDriver});
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.err, HasSubstr("kpack inspect: no CUDA driver"));
}

// A wrong pack path, or kernel name, is what the error says, also where no driver loads
// (it used to say only that no driver loaded).
TEST_F(CliTest, AWrongPackIsReportedAsSuchWithoutADriver) {
  for (const char* command : {"run", "bench"}) {
    Result r = Cli({command, "/nonexistent/pack", "add", "--driver", kNoDriver});
    EXPECT_EQ(r.code, kFailed);
    EXPECT_THAT(r.err, AllOf(HasSubstr("pack '/nonexistent/pack' is not a directory"),
                             Not(HasSubstr("no CUDA driver"))))
        << command;
    r = Cli({command, KPACK_TEST_PACK_DIR, "nope", "--driver", kNoDriver});
    EXPECT_THAT(r.err, AllOf(HasSubstr("no kernel named 'nope'"), Not(HasSubstr("no CUDA driver"))))
        << command;
  }
}

// Offline verify compiles every grid expression and builds every dispatch table, as Open
// does (it used to accept both of these packs, which Open then refused).
TEST_F(CliTest, VerifyCompilesGridExpressions) {
  for (const char* grid : {"cdiv(n, BLOK)", "cdiv(n, 0)"}) {
    SCOPED_TRACE(grid);
    TempPack pack(KPACK_DISPATCH_PACK_DIR);
    pack.kernel("axpy")["grid"] = {grid};
    pack.Save();
    Result r = Cli({"verify", pack.dir(), "--offline"});
    EXPECT_EQ(r.code, kFailed);
    // Every variant's grid is compiled, so each of the ten says so.
    EXPECT_THAT(r.err, AllOf(HasSubstr("kernel 'axpy': variant 'b0_generic': field 'grid[0]'"),
                             HasSubstr("FAILED: 10 problems")));
  }
}

TEST_F(CliTest, RunWritesOutputsAndLaunchesTheRightBytes) {
  std::string x = Npy("x.npy", std::vector<float>(1000, 1.5f));
  std::string y = Npy("y.npy", std::vector<float>(1000, 2.5f));
  std::string out = (dir_ / "out.npy").string();
  std::string x_back = (dir_ / "x_back.npy").string();
  Result r = Cli({"run", KPACK_TEST_PACK_DIR, "add", "--arg", "x_ptr=@" + x, "--arg", "y_ptr=@" + y,
                  "--arg", "out_ptr=zeros:float32:1000", "--arg", "n=1000", "--grid", "1", "--out",
                  "out_ptr=@" + out, "--out", "x_ptr=@" + x_back, "--driver", kFake});
  ASSERT_EQ(r.code, kOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("variant default, grid (1, 1, 1), block 128"),
                           HasSubstr("wrote out_ptr=@")));
  fake::LaunchRecord launch = LastLaunch();
  EXPECT_STREQ(launch.entry.data(), "add_kernel");
  EXPECT_EQ(At<int32_t>(launch, 24), 1000);
  EXPECT_NE(At<uint64_t>(launch, 0), 0u);
  // The x buffer, read back from the (fake) device, holds what the file held.
  auto x_read = ReadNpy(x_back);
  ASSERT_TRUE(x_read.ok()) << x_read.status();
  auto x_in = ReadNpy(x);
  EXPECT_EQ(x_read->data, x_in->data);
  auto written = ReadNpy(out);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->dtype, "<f4");
  EXPECT_THAT(written->shape, ::testing::ElementsAre(1000));
}

TEST_F(CliTest, RunUsesGridExpressionsAndDispatch) {
  std::string x = Npy("x.npy", std::vector<float>(5008, 1.0f));
  Result r = Cli({"run", KPACK_DISPATCH_PACK_DIR, "axpy", "--arg", "x_ptr=@" + x, "--arg",
                  "y_ptr=@" + x, "--arg", "out_ptr=zeros:float32:5008", "--arg", "n=5008", "--arg",
                  "stride_x=1", "--arg", "alpha=0.5", "--driver", kFake});
  ASSERT_EQ(r.code, kOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("variant b1_div16_unit, grid (5, 1, 1) (from the grid "
                               "expressions), block 128"));
  EXPECT_EQ(At<float>(LastLaunch(), 28), 0.5f);
}

TEST_F(CliTest, RunErrorsNameTheProblem) {
  std::string x = Npy("x.npy", {1, 2, 3});
  const std::vector<std::string> base = {"run", KPACK_TEST_PACK_DIR, "add", "--driver", kFake};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    fake::Reset();
    return Cli(a);
  };
  Result r = with({"--arg", "x_ptr=@" + x});
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("missing --arg y_ptr=VALUE"), HasSubstr("n: i32")));
  r = with({"--arg", "m=3"});
  EXPECT_THAT(r.err, HasSubstr("no call parameter 'm'"));
  r = with({"--arg", "x_ptr=@" + x, "--arg", "y_ptr=@" + x, "--arg", "out_ptr=@" + x, "--arg",
            "n=three"});
  EXPECT_THAT(r.err, HasSubstr("--arg n=three (i32): expected an integer"));
  r = with({"--arg", "x_ptr=@" + x, "--arg", "y_ptr=@" + x, "--arg", "out_ptr=@" + x, "--arg",
            "n=3000000000", "--grid", "1", "--no-size-check"});
  EXPECT_THAT(r.err, AllOf(HasSubstr("'n'"), HasSubstr("does not fit")));
  r = with({"--arg", "x_ptr=zeros:float99:3"});
  EXPECT_THAT(r.err, HasSubstr("float99"));
  r = with({"--arg", "x_ptr=3"});
  EXPECT_THAT(r.err, HasSubstr("a pointer takes @file.npy or zeros:DTYPE:COUNT"));
  r = with({"--arg", "x_ptr=@/nonexistent.npy"});
  EXPECT_THAT(r.err, HasSubstr("/nonexistent.npy"));
  r = with({"--arg", "x_ptr=@" + x, "--arg", "y_ptr=@" + x, "--arg", "out_ptr=@" + x, "--arg",
            "n=3", "--grid", "1", "--out", "n=@" + (dir_ / "n.npy").string()});
  EXPECT_THAT(r.err, HasSubstr("'n' is not a pointer argument"));
  r = with({"--arg", "x_ptr=@" + x, "--arg", "y_ptr=@" + x, "--arg", "out_ptr=@" + x, "--arg",
            "n=3", "--grid", "1,x"});
  EXPECT_THAT(r.err, HasSubstr("--grid '1,x'"));
  r = with(
      {"--arg", "x_ptr=@" + x, "--arg", "y_ptr=@" + x, "--arg", "out_ptr=@" + x, "--arg", "n=3"});
  EXPECT_THAT(r.err, HasSubstr("no grid expression"));
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
  EXPECT_EQ(fake::LiveAllocations(), 0) << "buffers are freed on every path";
}

// --out is checked before anything launches (it used to be checked after the launch).
TEST_F(CliTest, RunChecksOutputsBeforeLaunching) {
  std::string x = Npy("x.npy", std::vector<float>(8, 1.0f));
  for (const std::string& out : {"y=@" + (dir_ / "y.npy").string(), std::string("out_ptr=y.npy"),
                                 "n=@" + (dir_ / "n.npy").string()}) {
    fake::Reset();
    Result r = Cli({"run", KPACK_TEST_PACK_DIR, "add", "--arg", "x_ptr=@" + x, "--arg",
                    "y_ptr=@" + x, "--arg", "out_ptr=zeros:float32:8", "--arg", "n=8", "--grid",
                    "1", "--out", out, "--driver", kFake});
    EXPECT_EQ(r.code, kFailed) << out;
    EXPECT_THAT(r.err, HasSubstr("--out '" + out + "'"));
    EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0) << out;
    EXPECT_EQ(fake::LiveAllocations(), 0);
  }
}

// A pointer argument's buffer is checked against its parameter (element size) and the
// call's sizes (at least the smallest positive integer argument's elements), as
// descriptor arguments are checked against theirs; nothing launches otherwise.
TEST_F(CliTest, RunChecksPointerBuffersAgainstTheParameterAndTheSizes) {
  const std::string x16 = Npy("x16.npy", std::vector<float>(16, 1.0f));
  auto run = [&](const std::string& x, const std::string& out, const std::string& n,
                 std::vector<std::string> extra = {}) {
    fake::Reset();
    std::vector<std::string> a = {"run", KPACK_TEST_PACK_DIR, "add", "--arg", "x_ptr=" + x,
                                  "--arg", "y_ptr=" + x, "--arg", "out_ptr=" + out, "--arg",
                                  "n=" + n, "--grid", "4", "--driver", kFake};
    a.insert(a.end(), extra.begin(), extra.end());
    return Cli(a);
  };
  Result r = run("zeros:float32:4096", "zeros:int8:4096", "4096");
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.err, HasSubstr("--arg out_ptr=zeros:int8:4096 (*fp32): the buffer's elements "
                               "(<i1) are 1 bytes, the parameter's fp32 4"));
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
  r = run("@" + x16, "zeros:float32:4096", "4096");
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("--arg x_ptr (*fp32): the buffer has 16 elements, fewer "
                                     "than the smallest size argument of the call (n=4096)"),
                           HasSubstr("--no-size-check")));
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
  EXPECT_EQ(fake::LiveAllocations(), 0);
  // Elements of the parameter's size but another kind are bits of it (bf16 as uint16).
  r = run("zeros:uint32:4096", "zeros:int32:4096", "4096");
  EXPECT_EQ(r.code, kOk) << r.err;
  // A buffer small by design, say a one-element result, with the check off.
  r = run("@" + x16, "zeros:float32:4096", "4096", {"--no-size-check"});
  EXPECT_EQ(r.code, kOk) << r.err;
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 1);
}

TEST_F(CliTest, InspectAndVerifyShowDescriptorSlots) {
  Result r = Cli({"inspect", KPACK_DESC_PACK_DIR, "copy_tma"});
  ASSERT_EQ(r.code, kOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("in_desc: tensordesc<fp16[64, 128]>"),
                           HasSubstr("tensordesc in_desc: fp16, block [64, 128]; TMA: CUtensorMap "
                                     "data type 6 (2 B), box [64, 64], swizzle 128B"),
                           HasSubstr("in_desc.tma@48:128 in_desc.shape[0]@176:4"),
                           HasSubstr("out_desc.strides[1]@384:8 M@392:4")));
  r = Cli({"inspect", KPACK_DESC_PACK_DIR, "axpy_pair", "--json"});
  ASSERT_EQ(r.code, kOk) << r.err;
  const nlohmann::json pair = nlohmann::json::parse(r.out)["kernels"][0];
  EXPECT_EQ(pair["params"][1]["name"], "ptrs.1");
  r = Cli({"inspect", KPACK_DESC_PACK_DIR, "copy_tma", "--json"});
  const nlohmann::json v = nlohmann::json::parse(r.out)["kernels"][0]["variants"][0];
  EXPECT_EQ(v["layout"][0]["part"], "tma");
  EXPECT_EQ(v["tensordescs"][0]["block_size"], nlohmann::json({64, 64}));
  // Offline, every descriptor slot against the cubin's KPARAM_INFO; then through the
  // (fake) driver's cuKernelGetParamInfo.
  r = Cli({"verify", KPACK_DESC_PACK_DIR, "--driver", kFake});
  EXPECT_EQ(r.code, kOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("driver: all 3 variants loaded and checked"));
  TempPack lying(KPACK_DESC_PACK_DIR);
  lying.variant("copy_tma")["layout"][1]["offset"] = 180;  // in_desc.shape[0]
  lying.variant("copy_tma")["layout"][2]["offset"] = 184;
  lying.variant("copy_tma")["layout"][3]["offset"] = 192;
  lying.variant("copy_tma")["layout"][4]["offset"] = 200;
  lying.Save();
  r = Cli({"verify", lying.dir()});
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.err, HasSubstr("parameter 'in_desc.shape[0]' (#1): expected offset 180 size 4 "
                               "(manifest), found offset 176 size 4 (cubin)"));
}

// A tensordesc argument from a .npy file and one of zeros: each a device buffer of the
// array's shape, contiguous, encoded at launch with the variant's block shape; --out
// writes a descriptor's buffer back like a pointer's.
TEST_F(CliTest, RunTakesTensorDescriptors) {
  NpyArray in;
  in.dtype = "<f2";
  in.shape = {100, 200};
  in.data.resize(100 * 200 * 2, std::byte{0x3c});
  const std::string in_path = (dir_ / "in.npy").string();
  ASSERT_TRUE(WriteNpy(in_path, in).ok());
  const std::string out_path = (dir_ / "out.npy").string();
  const int64_t encodes = fake::TensorMapEncodeCount();
  Result r = Cli({"run", KPACK_DESC_PACK_DIR, "copy_tma", "--arg", "in_desc=tdesc:@" + in_path,
                  "--arg", "out_desc=tdesc:zeros:float16:100x200:nan", "--arg", "M=100", "--arg",
                  "N=200", "--out", "out_desc=@" + out_path, "--driver", kFake});
  ASSERT_EQ(r.code, kOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("variant default, grid (2, 2, 1) (from the grid expressions)"));
  ASSERT_EQ(fake::TensorMapEncodeCount() - encodes, 2);
  const fake::TensorMapEncode a = fake::GetTensorMapEncode(encodes);
  const fake::TensorMapEncode b = fake::GetTensorMapEncode(encodes + 1);
  EXPECT_EQ(a.dims[0], 200u);
  EXPECT_EQ(a.dims[1], 100u);
  EXPECT_EQ(a.strides[0], 400u);
  EXPECT_EQ(a.oob_fill, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  EXPECT_EQ(b.oob_fill, CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA);
  EXPECT_EQ(At<uint64_t>(LastLaunch(), 0), 0u) << "slots before the map stay zero";
  auto written = ReadNpy(out_path);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->dtype, "<f2");
  EXPECT_THAT(written->shape, ::testing::ElementsAre(100, 200));
}

TEST_F(CliTest, RunTensorDescriptorErrors) {
  NpyArray flat;
  flat.dtype = "<f4";
  flat.shape = {64};
  flat.data.resize(64 * 4);
  const std::string flat_path = (dir_ / "flat.npy").string();
  ASSERT_TRUE(WriteNpy(flat_path, flat).ok());
  auto run = [&](const std::string& in) {
    fake::Reset();
    return Cli({"run", KPACK_DESC_PACK_DIR, "copy_tma", "--arg", "in_desc=" + in, "--arg",
                "out_desc=tdesc:zeros:float16:64x128", "--arg", "M=64", "--arg", "N=128",
                "--driver", kFake});
  };
  Result r = run("@" + flat_path);
  EXPECT_THAT(r.err, HasSubstr("a tensordesc takes tdesc:@file.npy or tdesc:zeros:DTYPE:D0xD1"));
  r = run("tdesc:@" + flat_path);
  EXPECT_THAT(r.err, HasSubstr("the array has 1 dimensions, the descriptor 2"));
  r = run("tdesc:zeros:float32:64x128");
  EXPECT_THAT(r.err, HasSubstr("the array's elements (<f4) are 4 bytes, the descriptor's fp16 2"));
  r = run("tdesc:zeros:float16:64x0");
  EXPECT_THAT(r.err, HasSubstr("'0' is not a dimension"));
  r = run("tdesc:zeros:float16:64x100");  // 200-byte rows: TMA needs multiples of 16
  EXPECT_THAT(r.err, AllOf(HasSubstr("argument 0 ('in_desc'"),
                           HasSubstr("strides[0] = 100 elements of 2 bytes")));
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 0);
  EXPECT_EQ(fake::LiveAllocations(), 0);
}

TEST_F(CliTest, BenchReportsKpackAndRawSideBySide) {
  std::string x = Npy("x.npy", std::vector<float>(4096, 1.0f));
  Result r = Cli({"bench",
                  KPACK_DISPATCH_PACK_DIR,
                  "axpy",
                  "--arg",
                  "x_ptr=@" + x,
                  "--arg",
                  "y_ptr=@" + x,
                  "--arg",
                  "out_ptr=zeros:float32:4096",
                  "--arg",
                  "n=4096",
                  "--arg",
                  "stride_x=1",
                  "--arg",
                  "alpha=2",
                  "--batch",
                  "8",
                  "--repetitions",
                  "3",
                  "--driver",
                  kFake});
  ASSERT_EQ(r.code, kOk) << r.err;
  EXPECT_THAT(
      r.out, AllOf(HasSubstr("variant b0_div16_unit"), HasSubstr("3 batches of 8"),
                   HasSubstr("raw cuLaunchKernelEx"), HasSubstr("kpack (dispatch, pack, launch)")));
  // Warm-up batch plus three timed ones, for each of the two paths.
  EXPECT_EQ(fake::CallCount("LaunchKernelEx"), 2 * 4 * 8);
}

TEST_F(CliTest, Doctor) {
  Result r = Cli({"doctor", "--driver", kFake});
  EXPECT_EQ(r.code, kOk) << r.out;
  EXPECT_THAT(r.out,
              AllOf(HasSubstr(KPACK_ENABLE_NVTX ? "NVTX: compiled in"
                                                : "NVTX: compiled out (-DKPACK_ENABLE_NVTX=OFF)"),
                    HasSubstr("log level: warn (KPACK_LOG_LEVEL unset)"),
                    HasSubstr("CUDA 13.0"), HasSubstr("devices: 1"),
                    HasSubstr("device 0: Fake H200, compute capability 9.0"),
                    Not(HasSubstr("nothing can launch"))));
}

// Nothing can launch: doctor says why and exits non-zero, so scripts can rely on it.
TEST_F(CliTest, DoctorFailsWithoutADriverAndAdvisesByWhereThePathCameFrom) {
  Result r = Cli({"doctor", "--driver", kNoDriver});
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.out, AllOf(HasSubstr("driver: not available"), HasSubstr(kNoDriver),
                           HasSubstr("the path was given explicitly"),
                           Not(HasSubstr("set KPACK_CUDA_DRIVER")),
                           HasSubstr("nothing can launch on this machine")));

  setenv("KPACK_CUDA_DRIVER", "/nonexistent/from-env.so", 1);
  r = Cli({"doctor"});
  unsetenv("KPACK_CUDA_DRIVER");
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.out, AllOf(HasSubstr("/nonexistent/from-env.so"),
                           HasSubstr("the path came from KPACK_CUDA_DRIVER"),
                           Not(HasSubstr("set KPACK_CUDA_DRIVER"))));

  // A library that loads but has no usable GPU.
  fake::SetInitError(CUDA_ERROR_NO_DEVICE);
  r = Cli({"doctor", "--driver", kFake});
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.out, AllOf(HasSubstr("CUDA_ERROR_NO_DEVICE"), HasSubstr("no usable GPU"),
                           HasSubstr("nothing can launch")));
}

TEST_F(CliTest, DoctorFailsOnAnInvalidLogLevel) {
  setenv("KPACK_LOG_LEVEL", "bogus", 1);
  Result bad = Cli({"doctor", "--driver", kFake});
  setenv("KPACK_LOG_LEVEL", "debug", 1);
  Result good = Cli({"doctor", "--driver", kFake});
  unsetenv("KPACK_LOG_LEVEL");
  EXPECT_EQ(bad.code, kFailed);
  EXPECT_THAT(bad.out, AllOf(HasSubstr("KPACK_LOG_LEVEL='bogus' is not a log level"),
                             HasSubstr("trace, debug, info, warn, error, critical or off"),
                             HasSubstr("nothing can launch: fix KPACK_LOG_LEVEL")));
  EXPECT_EQ(good.code, kOk) << good.out;
  EXPECT_THAT(good.out, HasSubstr("log level: debug (KPACK_LOG_LEVEL)"));
}

// `kpack run` opens the pack, so it is refused there too, naming the accepted levels.
TEST_F(CliTest, RunRefusesAnInvalidLogLevel) {
  setenv("KPACK_LOG_LEVEL", "verbose", 1);
  Result r = Cli({"run", KPACK_TEST_PACK_DIR, "add", "--arg", "x_ptr=zeros:float32:16", "--arg",
                  "y_ptr=zeros:float32:16", "--arg", "out_ptr=zeros:float32:16", "--arg", "n=16",
                  "--driver", kFake});
  unsetenv("KPACK_LOG_LEVEL");
  EXPECT_EQ(r.code, kFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("KPACK_LOG_LEVEL='verbose' is not a log level"),
                           HasSubstr("trace, debug, info, warn, error, critical or off")));
  EXPECT_EQ(fake::LaunchCount(), 0);
}

TEST_F(CliTest, Version) {
  Result r = Cli({"--version"});
  EXPECT_EQ(r.code, kOk) << r.err;
  EXPECT_EQ(r.out, "kpack " KPACK_VERSION "\n");
}

}  // namespace
}  // namespace kpack::cli
