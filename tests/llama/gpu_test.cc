// The Llama engine's GPU tier (label gpu; skipped without a driver unless
// KPACK_REQUIRE_GPU=1): the tiny checkpoint (ctest fixture) and a full-size Llama-3.2-1B
// one written here by make_checkpoint.py, each run 128 decode steps at batch 1 and 8 with
// mixed prompt lengths, every step's tokens and logits bits the same through step graphs
// as eager; and the tiny model teacher-forced against the numpy oracle.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu_env.h"
#include "gtest/gtest.h"
#include "harness.h"

namespace kpack::llama {
namespace {

using ::kpack::llama::testing::ExpectGraphEqualsEager;
using ::kpack::llama::testing::ExpectMatchesOracle;
using ::kpack::llama::testing::Rig;

// Mixed prompt lengths, cycled over the rows: bucket edges and odd sizes.
const std::vector<int> kPromptLens = {32, 17, 64, 1, 5, 40, 16, 33};
constexpr int kSteps = 128;
constexpr int kCapacity = 256;

absl::StatusOr<Rig> OpenTiny() { return Rig::Open("", KPACK_LLAMA_PACK_DIR, KPACK_LLAMA_TINY_DIR); }

TEST(LlamaGpuTest, TinyGraphEqualsEagerEveryStep) {
  absl::StatusOr<Rig> rig = OpenTiny();
  KPACK_SKIP_WITHOUT_GPU(rig.status());
  for (int batch : {1, 8}) {
    SCOPED_TRACE(batch);
    ExpectGraphEqualsEager(*rig, batch, kPromptLens, kSteps, kCapacity);
  }
}

TEST(LlamaGpuTest, TinyMatchesTheNumpyOracle) {
  absl::StatusOr<Rig> rig = OpenTiny();
  KPACK_SKIP_WITHOUT_GPU(rig.status());
  absl::StatusOr<std::unique_ptr<Engine>> engine = rig->MakeEngine(3, 9, 64, true);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ExpectMatchesOracle(**engine, *rig->device, KPACK_LLAMA_ORACLE_DIR, 1e-2, 2e-2);
}

// Llama-3.2-1B's shape with seeded random weights, written by make_checkpoint.py (torch
// on the GPU when the Python has it: seconds; numpy otherwise: a minute or two).
TEST(LlamaGpuTest, FullSizeGraphEqualsEagerEveryStep) {
  absl::Status driver = Device::Open("", 0).status();
  KPACK_SKIP_WITHOUT_GPU(driver);
  char tmpl[] = "/tmp/kpack_llama_1b_XXXXXX";
  const std::filesystem::path dir = mkdtemp(tmpl);
  const std::string python = KPACK_LLAMA_PYTHON;
  const bool torch_cuda =
      std::system((python + " -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() "
                            "else 1)' >/dev/null 2>&1")
                      .c_str()) == 0;
  const std::string cmd = python + " " + KPACK_LLAMA_PYTHON_DIR +
                          "/make_checkpoint.py --preset llama-3.2-1b --seed 0 --out " +
                          dir.string() + (torch_cuda ? " --backend torch --device cuda" : "");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  {
    absl::StatusOr<Rig> rig = Rig::Open("", KPACK_LLAMA_PACK_DIR, dir.string());
    ASSERT_TRUE(rig.ok()) << rig.status();
    EXPECT_EQ(rig->checkpoint->config().vocab_size, 128256);
    for (int batch : {1, 8}) {
      SCOPED_TRACE(batch);
      ExpectGraphEqualsEager(*rig, batch, kPromptLens, kSteps, kCapacity);
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kpack::llama
