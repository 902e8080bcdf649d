#include "cli.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint.h"
#include "device.h"
#include "engine.h"
#include "kpack/kpack.h"
#include "model.h"
#include "run.h"

namespace kpack::llama {
namespace {

struct Args {
  std::string pack;
  std::string checkpoint;
  std::string graphs = "on";
  std::string json;
  int capacity = 16384;
  RunOptions run;
};

absl::Status Run(const Args& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::unique_ptr<Device>> device = Device::Open("", 0);
  if (!device.ok()) return device.status();
  absl::StatusOr<Runtime> runtime = Runtime::Open(args.pack);
  if (!runtime.ok()) return runtime.status();
  absl::StatusOr<Checkpoint> checkpoint = Checkpoint::Open(args.checkpoint);
  if (!checkpoint.ok()) return checkpoint.status();
  for (const std::string& w : checkpoint->warnings()) err << "kpack-llama: " << w << "\n";
  absl::StatusOr<Model> model = Model::Upload(**device, *checkpoint);
  if (!model.ok()) return model.status();

  RunOptions run = args.run;
  run.graphs = args.graphs == "on";
  absl::StatusOr<std::vector<int>> lens = RowPromptLens(run);
  if (!lens.ok()) return lens.status();
  EngineOptions options;
  options.max_batch = run.batch;
  options.max_prompt = *std::max_element(lens->begin(), lens->end());
  options.capacity = args.capacity;
  options.read_logits = run.digests;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(*runtime, **device, *model, options);
  if (!engine.ok()) return engine.status();
  absl::StatusOr<RunResult> result = RunSequences(**engine, run);
  if (!result.ok()) return result.status();

  const LlamaConfig& c = model->config();
  out << "kpack-llama: " << (*device)->name() << "; model H " << c.hidden_size << ", L "
      << c.num_hidden_layers << ", heads " << c.num_attention_heads << "/" << c.num_key_value_heads
      << ", V " << c.vocab_size << "; batch " << run.batch << ", " << run.steps << " steps, graphs "
      << args.graphs << "\n";
  for (size_t b = 0; b < result->generated.size(); ++b) {
    out << "row " << b << " (prompt " << result->prompt_lens[b]
        << "): " << absl::StrJoin(result->generated[b], " ") << "\n";
  }
  out << "decode: " << result->us_per_step << " us/step, " << result->tokens_per_s
      << " tokens/s, host " << result->host_us_per_step << " us/step to issue (" << run.timed_seqs
      << " timed sequences after " << run.warmup_seqs << " warm-up; " << result->graphs_built
      << " graphs built)\n";
  if (!args.json.empty()) {
    std::ofstream file(args.json);
    file << ResultJson(c, run, *result, (*device)->name()).dump(1) << "\n";
    if (!file) return absl::UnavailableError(absl::StrCat("cannot write ", args.json));
  }
  return absl::OkStatus();
}

}  // namespace

int KpackLlamaMain(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"kpack-llama: a Llama decode engine on kpack (prefill, then decode steps)"};
  Args args;
  app.add_option("--pack", args.pack, "the Llama kernel pack (kernels/llamapack)")->required();
  app.add_option("--checkpoint", args.checkpoint,
                 "Hugging Face checkpoint directory (config.json, model.safetensors)")
      ->required();
  app.add_option("--batch", args.run.batch, "sequences decoded together (default 1)");
  app.add_option("--prompt-lens", args.run.prompt_lens,
                 "prompt length, or a list cycled over the rows (default 32)")
      ->delimiter(',');
  app.add_option("--steps", args.run.steps, "decode steps per sequence (default 127)");
  app.add_option("--capacity", args.capacity, "KV-cache positions per sequence (default 16384)");
  app.add_option("--graphs", args.graphs, "decode through step graphs (default on)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--seed", args.run.seed, "prompt token seed (default 0)");
  app.add_option("--warmup-seqs", args.run.warmup_seqs, "untimed sequences first (default 1)");
  app.add_option("--timed-seqs", args.run.timed_seqs, "timed sequences (default 1)");
  app.add_option("--context", args.run.context,
                 "start every row at this position over a synthetic (random) KV cache "
                 "instead of prefilling its prompt: decode timing at a long context");
  app.add_option("--json", args.json, "write the results as JSON to this file");
  app.add_flag(
      "--digests", args.run.digests,
      "sha256 of the logits after prefill and every step (reads them back: not for timing)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e, out, err) == 0 ? 0 : 2;
  }
  if (absl::Status s = Run(args, out, err); !s.ok()) {
    err << "kpack-llama: " << s << "\n";
    return 1;
  }
  return 0;
}

}  // namespace kpack::llama
