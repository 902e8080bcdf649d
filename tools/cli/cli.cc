// The `kpack` command line's parsing: subcommands, their options, and the dispatch to the
// command functions (commands.h).

#include "CLI/CLI.hpp"

#include <exception>
#include <string>

#include "commands.h"

namespace kpack::cli {

int RunCli(int argc, char** argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"kpack: inspect, verify, run and benchmark kernel packs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("kpack ") + KPACK_VERSION);

  InspectOptions inspect;
  CLI::App* inspect_cmd = app.add_subcommand("inspect", "show what a pack contains");
  inspect_cmd->add_option("pack", inspect.pack, "pack directory")->required();
  inspect_cmd->add_option("kernel", inspect.kernel, "only this kernel");
  inspect_cmd->add_flag("--json", inspect.json, "machine-readable output");
  inspect_cmd->add_option("--driver", inspect.driver,
                          "CUDA driver library to load (inspecting needs none; a named one must "
                          "load)");

  VerifyOptions verify;
  CLI::App* verify_cmd = app.add_subcommand(
      "verify",
      "check a pack offline (manifest, files, sha256, layouts against the cubins); "
      "with a GPU, also load every variant");
  verify_cmd->add_option("pack", verify.pack, "pack directory")->required();
  verify_cmd->add_option("--driver", verify.driver,
                         "CUDA driver library to load (a named one must load; by default, "
                         "the driver checks are skipped where no driver loads)");
  verify_cmd->add_flag("--offline", verify.offline, "the offline checks only: load no driver");

  RunOptions run;
  auto add_run_options = [&run](CLI::App* cmd) {
    cmd->add_option("pack", run.pack, "pack directory")->required();
    cmd->add_option("kernel", run.kernel, "kernel name")->required();
    cmd->add_option("--arg", run.args,
                    "name=VALUE: x=@in.npy, out=zeros:float32:4096, n=4096, alpha=0.5, "
                    "flag=true");
    cmd->add_option("--grid", run.grid, "X[,Y[,Z]] (default: the manifest's grid expressions)");
    cmd->add_option("--driver", run.driver, "CUDA driver library to load");
    cmd->add_option("--device", run.device, "device ordinal (default 0)");
    cmd->add_flag("--no-size-check", run.size_check_off,
                  "allow pointer buffers with fewer elements than the smallest positive "
                  "integer argument (for buffers small by design)");
  };
  CLI::App* run_cmd = app.add_subcommand("run", "launch one kernel on inputs from files");
  add_run_options(run_cmd);
  run_cmd->add_option("--out", run.outputs, "name=@file.npy: write a buffer back");
  CLI::App* bench_cmd = app.add_subcommand(
      "bench", "host time per launch of one kernel, kpack and the raw driver side by side");
  add_run_options(bench_cmd);
  bench_cmd->add_option("--batch", run.batch, "launches per timed batch (default 256)");
  bench_cmd->add_option("--repetitions", run.repetitions, "timed batches (default 20)");

  DoctorOptions doctor;
  CLI::App* doctor_cmd = app.add_subcommand(
      "doctor",
      "driver, CUDA version, devices, NVTX and log level; exit 1 when nothing can launch");
  doctor_cmd->add_option("--driver", doctor.driver, "CUDA driver library to load");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e, out, err) == 0 ? kOk : kUsage;
  }
  if (inspect_cmd->parsed()) return Inspect(inspect, out, err);
  if (verify_cmd->parsed()) return Verify(verify, out, err);
  if (run_cmd->parsed()) return Run(run, out, err);
  if (bench_cmd->parsed()) return Bench(run, out, err);
  return Doctor(doctor, out, err);
}

}  // namespace kpack::cli
