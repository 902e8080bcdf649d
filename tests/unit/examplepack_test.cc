// The committed example pack (kernels/examplepack, built by kpack_tools.build from
// kernels/examples/*.py) opened by the runtime on the recording fake driver: every kernel
// launches, the chosen variant per bucket and specialization is the documented one, the
// grid comes from the grid expressions with the chosen variant's constexprs, and the
// argument bytes sit at the manifest's offsets (the fp32 eps of layer_norm as 4 float
// bytes, the trap Triton's AOT stubs fall into).

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "fake_driver.h"
#include "fake_runtime.h"
#include "gtest/gtest.h"
#include "kpack/kpack.h"
#include "nlohmann/json.hpp"

namespace kpack {
namespace {

using ::kpack::testing::At;
using ::kpack::testing::LastLaunch;
using ::kpack::testing::OpenFake;

const std::string kPack = KPACK_EXAMPLE_PACK_DIR;
const CUdeviceptr kA = 0x100000, kB = 0x200000, kC = 0x300000, kD = 0x400000;

class ExamplePackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ResetFake();
    auto rt = OpenFake(kPack);
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_ = std::make_unique<Runtime>(std::move(*rt));
    std::ifstream in(kPack + "/manifest.json");
    manifest_ = nlohmann::json::parse(in);
  }
  void TearDown() override {
    rt_.reset();
    fake::Reset();
  }
  const nlohmann::json& Variant(const std::string& kernel, const std::string& variant) {
    for (const auto& k : manifest_["kernels"]) {
      if (k["name"] != kernel) continue;
      for (const auto& v : k["variants"]) {
        if (v["name"] == variant) return v;
      }
    }
    ADD_FAILURE() << kernel << "/" << variant << " not in the manifest";
    static const nlohmann::json kNone = nlohmann::json::object();
    return kNone;
  }
  // Offset of `param`'s slot in the variant's layout; -1 if it has none (eq1).
  int Offset(const nlohmann::json& variant, const std::string& param) {
    for (const auto& slot : variant["layout"]) {
      if (slot["param"] == param) return slot["offset"].get<int>();
    }
    return -1;
  }
  std::string Select(const Kernel& k, const std::vector<Arg>& args) {
    auto name = k.SelectVariant(args);
    return name.ok() ? std::string(*name) : name.status().ToString();
  }
  std::unique_ptr<Runtime> rt_;
  nlohmann::json manifest_;
};

TEST_F(ExamplePackTest, LayerNormPassesEpsAsA4ByteFloat) {
  Kernel ln = *rt_->Find("layer_norm");
  const float eps = 1e-5f;
  std::vector<Arg> aligned = {
      Arg(kA),  Arg(kB), Arg(kC), Arg(kD), Arg(int32_t{4096}), Arg(int32_t{8}), Arg(int32_t{4096}),
      Arg(1e-5)};
  EXPECT_EQ(Select(ln, aligned), "div16");
  KP_ASSERT_OK(ln.LaunchArgs(nullptr, aligned));  // a double for an fp32 param: converted
  fake::LaunchRecord r = LastLaunch();
  const nlohmann::json& v = Variant("layer_norm", "div16");
  ASSERT_EQ(Offset(v, "eps"), 44);  // after 4 pointers and 3 i32
  EXPECT_EQ(At<float>(r, Offset(v, "eps")), eps) << "fp32 bytes, not a double";
  EXPECT_EQ(At<uint32_t>(r, 44), 0x3727c5acu) << "1e-5f as IEEE single";
  EXPECT_EQ(At<int32_t>(r, Offset(v, "stride")), 4096);
  EXPECT_EQ(At<int32_t>(r, Offset(v, "M")), 8);
  EXPECT_EQ(At<int32_t>(r, Offset(v, "N")), 4096);
  EXPECT_EQ(At<CUdeviceptr>(r, Offset(v, "w_ptr")), kC);
  EXPECT_EQ(At<uint64_t>(r, Offset(v, "$global_scratch")), 0u);
  EXPECT_EQ(r.grid[0], 8u) << "grid expression M";
  EXPECT_EQ(r.block[0], 32u * v["num_warps"].get<unsigned>());

  std::vector<Arg> odd = aligned;
  odd[6] = Arg(int32_t{1001});
  EXPECT_EQ(Select(ln, odd), "generic");
  KP_ASSERT_OK(ln.LaunchArgs(nullptr, odd));
  EXPECT_EQ(At<float>(LastLaunch(), Offset(Variant("layer_norm", "generic"), "eps")), eps);
}

TEST_F(ExamplePackTest, MatmulBucketsOnMAndDropsUnitStrides) {
  for (const char* name : {"matmul_fp16", "matmul_bf16"}) {
    Kernel mm = *rt_->Find(name);
    struct Case {
      int32_t m;
      int bucket;
    } cases[] = {{1, 0}, {16, 0}, {17, 1}, {64, 1}, {65, 2}, {256, 2}, {257, 3}, {5000, 3}};
    for (const Case& c : cases) {
      for (int32_t k : {512, 200}) {  // 200 is not a multiple of 16: the generic variant
        const int32_t n = 256;
        std::vector<Arg> args = {Arg(kA), Arg(kB), Arg(kC), Arg(c.m), Arg(n), Arg(k),
                                 Arg(k),  Arg(1),  Arg(n),  Arg(1),   Arg(n), Arg(1)};
        const std::string want =
            "b" + std::to_string(c.bucket) + (k == 512 ? "_contig" : "_generic");
        EXPECT_EQ(Select(mm, args), want) << name << " M=" << c.m << " K=" << k;
        KP_ASSERT_OK(mm.LaunchArgs(nullptr, args));
        fake::LaunchRecord r = LastLaunch();
        const nlohmann::json& v = Variant(name, want);
        const int bm = v["constexprs"]["BLOCK_M"], bn = v["constexprs"]["BLOCK_N"];
        EXPECT_EQ(r.grid[0], static_cast<unsigned>((c.m + bm - 1) / bm)) << want;
        EXPECT_EQ(r.grid[1], static_cast<unsigned>((n + bn - 1) / bn)) << want;
        EXPECT_EQ(r.shared_bytes, v["shared"].get<unsigned>());
        EXPECT_EQ(At<int32_t>(r, Offset(v, "M")), c.m);
        EXPECT_EQ(At<int32_t>(r, Offset(v, "K")), k);
        EXPECT_EQ(At<CUdeviceptr>(r, Offset(v, "c_ptr")), kC);
        if (k == 512) {
          EXPECT_EQ(Offset(v, "stride_ak"), -1) << "eq1: compiled away";
          EXPECT_EQ(Offset(v, "stride_cn"), -1);
          EXPECT_EQ(r.param_size, 8u * 3 + 4 * 6 + 16);
        } else {
          EXPECT_EQ(At<int32_t>(r, Offset(v, "stride_ak")), 1);
          EXPECT_EQ(r.param_size, 8u * 3 + 4 * 9 + 4 /* pad to 8 */ + 16);
        }
      }
    }
  }
}

TEST_F(ExamplePackTest, SoftmaxBucketsOnRowLength) {
  Kernel sm = *rt_->Find("softmax");
  struct Case {
    int32_t cols;
    const char* variant;
  } cases[] = {{512, "b0_div16"},  {1024, "b0_div16"},   {999, "b0_generic"},
               {1040, "b1_div16"}, {8192, "b1_div16"},   {3001, "b1_generic"},
               {8208, "b2_div16"}, {20001, "b2_generic"}};
  for (const Case& c : cases) {
    std::vector<Arg> args = {Arg(kA),     Arg(kB),          Arg(c.cols),
                             Arg(c.cols), Arg(int32_t{37}), Arg(c.cols)};
    EXPECT_EQ(Select(sm, args), c.variant) << c.cols;
    KP_ASSERT_OK(sm.LaunchArgs(nullptr, args));
    fake::LaunchRecord r = LastLaunch();
    const nlohmann::json& v = Variant("softmax", c.variant);
    EXPECT_EQ(r.grid[0], 37u) << "grid expression n_rows";
    EXPECT_EQ(At<int32_t>(r, Offset(v, "n_cols")), c.cols);
    EXPECT_EQ(At<CUdeviceptr>(r, Offset(v, "out_ptr")), kA) << "output first";
    EXPECT_EQ(r.block[0], 32u * v["num_warps"].get<unsigned>());
  }
}

// layer_norm_bwd: 8 pointers, 4 row strides and N specialized (13 properties, more than
// the old dispatch table's 12); each one that fails falls back to the bucket's generic.
TEST_F(ExamplePackTest, LayerNormBackwardDispatchesOnThirteenProperties) {
  Kernel bwd = *rt_->Find("layer_norm_bwd");
  auto args = [](int32_t m, int32_t n) {
    std::vector<Arg> a;
    for (int i = 0; i < 8; ++i) a.push_back(Arg(CUdeviceptr{0x100000u * (i + 1)}));
    for (int i = 0; i < 4; ++i) a.push_back(Arg(n));
    a.push_back(Arg(m));
    a.push_back(Arg(n));
    return a;
  };
  struct Case {
    int32_t n;
    const char* bucket;
  } cases[] = {{512, "b0"}, {1024, "b0"}, {2048, "b1"}, {4096, "b1"}, {8192, "b2"}};
  for (const Case& c : cases) {
    std::vector<Arg> a = args(100, c.n);
    EXPECT_EQ(Select(bwd, a), std::string(c.bucket) + "_contig") << c.n;
    KP_ASSERT_OK(bwd.LaunchArgs(nullptr, a));
    fake::LaunchRecord r = LastLaunch();
    const nlohmann::json& v = Variant("layer_norm_bwd", std::string(c.bucket) + "_contig");
    EXPECT_EQ(r.grid[0], 7u) << "cdiv(M, BLOCK_M) = cdiv(100, 16)";
    EXPECT_EQ(r.block[0], 32u * v["num_warps"].get<unsigned>());
    EXPECT_EQ(At<int32_t>(r, Offset(v, "N")), c.n);
    EXPECT_EQ(At<CUdeviceptr>(r, Offset(v, "Rstd")), CUdeviceptr{0x800000});
    for (size_t i = 0; i < a.size(); ++i) {  // break one specialized argument at a time
      if (i == 12) continue;                   // M: not specialized
      std::vector<Arg> broken = a;
      broken[i] = i < 8 ? Arg(CUdeviceptr{0x100000u * (i + 1) + 8}) : Arg(c.n - 8);
      EXPECT_EQ(Select(bwd, broken), std::string(c.bucket) + "_generic") << c.n << " arg " << i;
    }
  }
}

// layer_norm_fwd's grid is the row count, which is no parameter: the caller passes it.
TEST_F(ExamplePackTest, LayerNormForwardNeedsTheCallersGrid) {
  Kernel fwd = *rt_->Find("layer_norm_fwd");
  std::vector<Arg> args = {Arg(kA), Arg(kB), Arg(kC), Arg(kD), Arg(kA + 0x10000),
                           Arg(kB + 0x10000), Arg(4096), Arg(4096), Arg(4096), Arg(1e-5f)};
  EXPECT_EQ(Select(fwd, args), "contig");
  absl::Status s = fwd.LaunchArgs(nullptr, args);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(s.message()).find("no grid expression"), std::string::npos) << s;
  KP_ASSERT_OK(fwd.LaunchArgs(Grid{300}, nullptr, args));
  EXPECT_EQ(LastLaunch().grid[0], 300u);
}

TEST_F(ExamplePackTest, VectorAddAlignedAndMisaligned) {
  Kernel add = *rt_->Find("vector_add");
  std::vector<Arg> args = {Arg(kA), Arg(kB), Arg(kC), Arg(int32_t{1 << 20})};
  EXPECT_EQ(Select(add, args), "div16");
  KP_ASSERT_OK(add.LaunchArgs(nullptr, args));
  const int block = Variant("vector_add", "div16")["constexprs"]["BLOCK"];
  EXPECT_EQ(LastLaunch().grid[0], static_cast<unsigned>((1 << 20) / block));
  EXPECT_EQ(At<int32_t>(LastLaunch(), 24), 1 << 20);
  args[0] = Arg(kA + 4);  // a misaligned pointer
  EXPECT_EQ(Select(add, args), "generic");
  KP_ASSERT_OK(add.LaunchArgs(nullptr, args));
  EXPECT_EQ(At<CUdeviceptr>(LastLaunch(), 0), kA + 4);
}

}  // namespace
}  // namespace kpack
