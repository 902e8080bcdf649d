#!/usr/bin/env python3
"""Host cost per launch: Triton's launchers against kpack, on the same kernels, in one run.

For each benchmark-pack kernel (``args4``, ``args14``, ``args32``: the same trivial kernel
with 4, 14 and 32 call arguments, ``tools/kpack_tools/build_bench_pack.py``) this measures

* ``triton_jit``: Triton's ``kernel[grid](...)`` (JIT, warmed up, grid a tuple);
* ``triton_compiled``: the cached ``CompiledKernel[grid](...)`` that ``kernel[grid]`` returns;
* ``triton_aot``: Triton's AOT C stub (``triton.tools.compile`` + ``triton.tools.link``),
  called from the C harness ``bench/aot/aot_bench.c``;
* ``raw_params`` ... ``kpack_bound``: raw ``cuLaunchKernelEx`` and kpack, from the C++
  benchmark binary (Google Benchmark, ``bench/launch_bench.cc``) on ``kernels/benchpack``.

Every path is timed the same way (``launch_common.py``, shared with
``python_launch_bench.py``): a sample is a batch of launches between two clock reads, the
stream synchronized before the batch and outside the timed region (so the GPU queue never
fills); the per-launch figure of a repetition is its batches' total time over their
launches; the table gives the median and the min-max over repetitions. Each path's output
is checked once against a reference before timing.

Run on the GPU machine from the repository root::

    python3 bench/triton_launch_bench.py --kpack-bench build-gpu/bench/kpack_launch_bench \\
        --out bench/results [--reps 20] [--batch 256]

It writes ``results.json`` (every per-repetition figure and the environment),
``results.md`` (the table, the ratios and the issue's targets), ``launch_cost.png`` and
the C++ binary's own ``kpack_launch_bench.json``, and prints the table. Exits 77 (skipped) when torch or a GPU is missing, unless
``KPACK_REQUIRE_GPU=1`` (then 1).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import launch_common as common  # noqa: E402
from launch_common import (BLOCK, INPUTS, N, NUM_WARPS, SKIP, BenchError,  # noqa: E402,F401
                           check_launch, make_inputs, skip_or_fail)

REPO = Path(__file__).resolve().parents[1]
KERNEL_SOURCE = REPO / "tools" / "kpack_tools" / "build_bench_pack.py"
HARNESS = REPO / "bench" / "aot" / "aot_bench.c"

KERNELS = ("args4", "args14", "args32")


@dataclass(frozen=True)
class LaunchPath:
    """One way of launching a kernel: a row of the table."""
    key: str
    label: str
    source: str  # "python", "aot" or "cpp"


PATHS = (
    LaunchPath("triton_jit", "Triton `kernel[grid](...)`", "python"),
    LaunchPath("triton_compiled", "Triton `CompiledKernel[grid](...)`", "python"),
    LaunchPath("triton_aot", "Triton AOT C stub (compile + link)", "aot"),
    LaunchPath("raw_params", "raw `cuLaunchKernelEx`, params", "cpp"),
    LaunchPath("raw_extra", "raw `cuLaunchKernelEx`, extra", "cpp"),
    LaunchPath("kpack_by_name", "kpack, by name", "cpp"),
    LaunchPath("kpack_by_kernel", "kpack, by `Kernel`", "cpp"),
    LaunchPath("kpack_bound", "kpack, `BoundLaunch`", "cpp"),
)
PATH_KEYS = tuple(p.key for p in PATHS)
CPP_PATHS = tuple(p.key for p in PATHS if p.source == "cpp")
BASELINE = "raw_params"


@dataclass(frozen=True)
class Target:
    """The issue's goal: ``slower`` costs at least ``factor`` times ``faster`` per launch."""
    faster: str
    slower: str
    factor: float


TARGETS = (Target("kpack_by_kernel", "triton_jit", 4.0),
           Target("kpack_by_kernel", "triton_compiled", 3.0))


# ---------------------------------------------------------------- statistics and tables


@dataclass(frozen=True)
class Summary:
    """Median and range of one path's per-repetition microseconds per launch."""
    median: float
    min: float
    max: float
    reps: int


def summarize(values: Sequence[float]) -> Summary:
    """The median, min and max of per-repetition figures (at least one)."""
    if not values:
        raise BenchError("no repetitions to summarize")
    return Summary(statistics.median(values), min(values), max(values), len(values))


Results = Mapping[str, Mapping[str, Sequence[float]]]  # path -> kernel -> us per launch


def summarize_all(results: Results) -> dict[str, dict[str, Summary]]:
    return {path: {k: summarize(v) for k, v in per_kernel.items()}
            for path, per_kernel in results.items()}


def ratio(summaries: Mapping[str, Mapping[str, Summary]], slower: str, faster: str,
          kernel: str) -> float:
    """How many times ``faster``'s median cost per launch fits in ``slower``'s."""
    return summaries[slower][kernel].median / summaries[faster][kernel].median


def target_verdicts(summaries: Mapping[str, Mapping[str, Summary]]) -> list[dict]:
    """One record per (target, kernel): the measured ratio and whether it meets the target."""
    verdicts = []
    for t in TARGETS:
        for kernel in KERNELS:
            r = ratio(summaries, t.slower, t.faster, kernel)
            verdicts.append({"faster": t.faster, "slower": t.slower, "kernel": kernel,
                             "target": t.factor, "ratio": r, "met": r >= t.factor})
    return verdicts


def _label(key: str) -> str:
    return next(p.label for p in PATHS if p.key == key)


def render_markdown(summaries: Mapping[str, Mapping[str, Summary]],
                    specializations: Mapping[str, str], notes: Sequence[str] = ()) -> str:
    """The results table (median µs per launch, min–max), the ratios and the targets."""
    header = "| path | " + " | ".join(f"{k} ({2 * INPUTS[k] + 2} args)" for k in KERNELS)
    rule = "|---|" + "---:|" * len(KERNELS)
    lines = ["## Host µs per launch (median, min–max over repetitions)", "", header + " |",
             rule]
    for key in PATH_KEYS:
        cells = [f"{s.median:.3f} ({s.min:.3f}–{s.max:.3f})"
                 for s in (summaries[key][k] for k in KERNELS)]
        lines.append(f"| {_label(key)} | " + " | ".join(cells) + " |")
    lines += ["", f"## Ratio to {_label(BASELINE)} (median over median)", "",
              "| path | " + " | ".join(KERNELS) + " |", rule]
    for key in PATH_KEYS:
        cells = [f"{ratio(summaries, key, BASELINE, k):.2f}x" for k in KERNELS]
        lines.append(f"| {_label(key)} | " + " | ".join(cells) + " |")
    lines += ["", "## Targets (issue 5)", "",
              "| target | " + " | ".join(KERNELS) + " |", rule]
    verdicts = target_verdicts(summaries)
    for t in TARGETS:
        cells = [f"{v['ratio']:.2f}x {'met' if v['met'] else 'MISSED'}"
                 for v in verdicts if v["slower"] == t.slower and v["faster"] == t.faster]
        lines.append(f"| {_label(t.faster)} at least {t.factor:g}x cheaper than "
                     f"{_label(t.slower)} | " + " | ".join(cells) + " |")
    lines += ["", "## What each path ran", ""]
    lines += [f"- {_label(key)}: {specializations[key]}" for key in PATH_KEYS]
    if notes:
        lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- Google Benchmark JSON


def gbench_filter(paths: Sequence[str] = CPP_PATHS, kernels: Sequence[str] = KERNELS) -> str:
    """``launch_common.gbench_filter`` of this comparison's C++ rows."""
    return common.gbench_filter(paths, kernels)


def gbench_command(binary: str, out_file: str, reps: int, min_time: float) -> list[str]:
    """The C++ benchmark's command line for this comparison's rows."""
    return common.gbench_command(binary, out_file, CPP_PATHS, KERNELS, reps, min_time)


def parse_gbench(doc: Mapping, paths: Sequence[str] = CPP_PATHS,
                 kernels: Sequence[str] = KERNELS) -> dict[str, dict[str, list[float]]]:
    """``launch_common.parse_gbench`` of this comparison's C++ rows."""
    return common.parse_gbench(doc, paths, kernels)


# ---------------------------------------------------------------- Triton AOT commands


def aot_signature(kernel: str, hinted: Sequence[str]) -> str:
    """triton.tools.compile's --signature for a bench kernel: ``*fp32`` pointers, ``i32``
    scalars, a ``:16`` divisibility hint on the parameters named in ``hinted``, and the
    constexpr BLOCK as its value."""
    from kpack_tools.build_bench_pack import bench_params  # noqa: PLC0415 (needs tools/)
    parts = []
    for name, ty in bench_params(INPUTS[kernel]):
        if ty == "constexpr":
            parts.append(str(BLOCK))
        else:
            parts.append(f"{ty}:16" if name in hinted else ty)
    return ", ".join(parts)


def aot_compile_command(python: str, kernel: str, hinted: Sequence[str], out_dir: Path,
                        target: str | None = None) -> list[str]:
    """``python -m triton.tools.compile`` for one kernel; the stub computes the grid
    ``cdiv(n, BLOCK)`` itself, and its entry points are named after ``kernel``. Without
    ``target`` it compiles for the current device."""
    cmd = [python, "-m", "triton.tools.compile", str(KERNEL_SOURCE),
           "--kernel-name", f"{kernel}_kernel", "--signature", aot_signature(kernel, hinted),
           "--grid", f"(n + {BLOCK - 1}) / {BLOCK},1,1", "--num-warps", str(NUM_WARPS),
           "--out-name", kernel, "--out-path", str(out_dir / kernel)]
    return cmd + (["--target", target] if target else [])


def aot_link_command(python: str, kernel: str, out_dir: Path) -> list[str]:
    """``python -m triton.tools.link`` over one kernel's stub headers, writing
    ``<kernel>_link.{c,h}`` whose entry point is ``<kernel>_default``."""
    headers = sorted(str(h) for h in out_dir.glob(f"{kernel}.*.h"))
    if not headers:
        raise BenchError(f"triton.tools.compile wrote no {kernel}.*.h in {out_dir}")
    return [python, "-m", "triton.tools.link", *headers, "-o", str(out_dir / f"{kernel}_link")]


def aot_build_command(cc: str, out_dir: Path, binary: Path, cuda_home: str) -> list[str]:
    """Compiles the harness with every stub and linked dispatcher in ``out_dir``. The
    stubs call exit() without including stdlib.h, hence ``-include stdlib.h``; libcuda is
    linked against the toolkit's stub library (the driver's own copy is loaded at run time)."""
    sources = sorted(str(c) for c in out_dir.glob("*.c"))
    return [cc, "-O2", "-std=gnu11", "-include", "stdlib.h", f"-I{out_dir}",
            f"-I{cuda_home}/include", str(HARNESS), *sources, "-o", str(binary),
            f"-L{cuda_home}/lib64/stubs", f"-L{cuda_home}/lib64", "-lcuda", "-lm"]


def parse_aot_output(text: str, tolerance: float = 1e-5) -> tuple[dict[str, list[float]], dict]:
    """Per-repetition µs per launch per kernel from aot_bench's JSON, and the JSON itself.
    Raises BenchError when a kernel's output check failed."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise BenchError(f"aot_bench printed no valid JSON ({e}): {text[:500]!r}") from e
    for kernel in KERNELS:
        err = doc["max_error"][kernel]
        if not isinstance(err, (int, float)) or not err <= tolerance:
            raise BenchError(f"AOT stub of {kernel} computed a wrong result: max error {err}")
        if len(doc["us_per_launch"][kernel]) != doc["reps"]:
            raise BenchError(f"aot_bench gave {len(doc['us_per_launch'][kernel])} repetitions "
                             f"of {kernel}, expected {doc['reps']}")
    return {k: list(doc["us_per_launch"][k]) for k in KERNELS}, doc


def run_checked(cmd: Sequence[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    """Runs a command, raising BenchError with its output when it fails."""
    print("+ " + shlex.join(cmd), flush=True)
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    except OSError as e:
        raise BenchError(f"{what}: could not run {cmd[0]}: {e}") from e
    if result.returncode != 0:
        raise BenchError(f"{what} failed with exit code {result.returncode}:\n"
                         f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result


# ---------------------------------------------------------------- GPU measurements


def jit_specialization(compiled, kernel: str) -> list[str]:
    """Names of the parameters Triton's JIT compiled with ``tt.divisibility = 16``."""
    from kpack_tools.build_bench_pack import bench_params  # noqa: PLC0415
    names = [name for name, _ in bench_params(INPUTS[kernel])]
    hinted = []
    for path, attrs in compiled.src.attrs.items():
        if any(a[0] == "tt.divisibility" and a[1] == 16 for a in attrs):
            hinted.append(names[path[0]])
    return hinted


def measure_python(torch, triton, args: argparse.Namespace, log: Callable[[str], None]):
    """Warms up, checks and times ``kernel[grid](...)`` and ``CompiledKernel[grid](...)``
    for every kernel, paths and kernels interleaved in a random order per repetition."""
    from kpack_tools.build_bench_pack import FUNCTIONS  # noqa: PLC0415
    stream = torch.cuda.Stream()  # non-blocking, like the C++ and AOT harness streams
    checks: dict[str, dict[str, float]] = {"triton_jit": {}, "triton_compiled": {}}
    hinted: dict[str, list[str]] = {}
    batches = {}
    with torch.cuda.stream(stream):
        for kernel in KERNELS:
            call_args, out, expected = make_inputs(torch, kernel, args.n)
            jit, cached, compiled = common.triton_paths(FUNCTIONS[kernel][0], call_args, args.n)
            for path, batch in (("triton_jit", jit), ("triton_compiled", cached)):
                checks[path][kernel] = check_launch(torch, batch, out, expected,
                                                    f"{path} {kernel}")
                batches[(path, kernel)] = batch
            hinted[kernel] = jit_specialization(compiled, kernel)
            log(f"{kernel}: JIT compiled {compiled.name}, num_warps "
                f"{compiled.metadata.num_warps}, divisibility 16 on {', '.join(hinted[kernel])}; "
                f"max error jit {checks['triton_jit'][kernel]:.1e}, compiled "
                f"{checks['triton_compiled'][kernel]:.1e}")
        results = common.measure(torch, batches, args.batch, args.iters, args.warmup, args.reps)
    return results, checks, hinted


def measure_aot(python: str, args: argparse.Namespace, hinted: Mapping[str, Sequence[str]],
                work: Path, log: Callable[[str], None]):
    """Generates, builds, checks and times Triton's AOT stubs (see bench/aot/aot_bench.c)."""
    stubs = work / "aot"
    stubs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / "tools")] + ([os.environ["PYTHONPATH"]] if "PYTHONPATH" in os.environ
                                 else [])))
    for kernel in KERNELS:
        run_checked(aot_compile_command(python, kernel, hinted[kernel], stubs),
                    f"triton.tools.compile {kernel}", env=env)
        run_checked(aot_link_command(python, kernel, stubs), f"triton.tools.link {kernel}",
                    env=env)
    binary = work / "aot_bench"
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise BenchError("no C compiler found for the AOT harness (set CC)")
    run_checked(aot_build_command(cc, stubs, binary, args.cuda_home), "building aot_bench")
    result = run_checked([str(binary), str(args.n), str(args.batch), str(args.iters),
                          str(args.reps), str(args.warmup)], "aot_bench")
    per_kernel, doc = parse_aot_output(result.stdout)
    log("AOT stubs: max error " + ", ".join(f"{k} {doc['max_error'][k]:.1e}" for k in KERNELS))
    return per_kernel, doc


def measure_cpp(args: argparse.Namespace) -> tuple[dict, dict]:
    """Runs the C++ benchmark binary, keeping its JSON in the output directory, and reads
    its per-repetition rows."""
    binary = Path(args.kpack_bench)
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise BenchError(f"kpack benchmark binary {binary} is missing or not executable "
                         "(build the target kpack_launch_bench)")
    out_file = args.out / "kpack_launch_bench.json"
    run_checked(gbench_command(str(binary.resolve()), str(out_file), args.reps, args.min_time),
                "kpack_launch_bench")
    try:
        doc = json.loads(out_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BenchError(f"kpack_launch_bench wrote no readable JSON to {out_file}: {e}") from e
    return parse_gbench(doc), doc


def read_first_line(path: str, prefix: str = "") -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line[len(prefix):].strip(" :\t")
    except OSError:
        pass
    return None


def environment(torch, triton, aot_doc: Mapping, gb_doc: Mapping) -> dict:
    """Where and with what the figures were measured."""
    driver = read_first_line("/proc/driver/nvidia/version", "NVRM version")
    smi = shutil.which("nvidia-smi")
    if smi:
        got = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        if got.returncode == 0 and got.stdout.strip():
            driver = got.stdout.strip().splitlines()[0]
    dv = aot_doc.get("driver_version", 0)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0),
        "driver_version": driver or "unknown (no nvidia-smi, no /proc/driver/nvidia/version)",
        "driver_cuda_version": f"{dv // 1000}.{dv % 1000 // 10}",
        "torch_cuda_version": torch.version.cuda,
        "triton_version": triton.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "cpu": read_first_line("/proc/cpuinfo", "model name") or platform.processor(),
        "host": platform.node(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "kpack_bench_context": {k: v for k, v in gb_doc.get("context", {}).items()
                                if k != "caches"},
    }


def plot(summaries: Mapping[str, Mapping[str, Summary]], out_png: Path, title: str) -> None:
    """Grouped bar chart of median host µs per launch, min-max error bars, log scale."""
    import matplotlib  # noqa: PLC0415 (only on the GPU machine)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    fig, ax = plt.subplots(figsize=(11, 5.5))
    width = 0.8 / len(PATH_KEYS)
    for i, key in enumerate(PATH_KEYS):
        s = [summaries[key][k] for k in KERNELS]
        xs = [j + (i - (len(PATH_KEYS) - 1) / 2) * width for j in range(len(KERNELS))]
        ax.bar(xs, [v.median for v in s], width, label=_label(key).replace("`", ""),
               yerr=[[v.median - v.min for v in s], [v.max - v.median for v in s]],
               capsize=2)
    ax.set_xticks(range(len(KERNELS)))
    ax.set_xticklabels([f"{k} ({2 * INPUTS[k] + 2} args)" for k in KERNELS])
    ax.set_yscale("log")
    ax.set_ylabel("host µs per launch (median, min–max)")
    ax.set_title(title)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out_png, dpi=150)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kpack-bench", required=True,
                        help="the C++ benchmark binary (build-gpu/bench/kpack_launch_bench)")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--reps", type=int, default=20, help="repetitions of every path")
    parser.add_argument("--batch", type=int, default=256,
                        help="launches per timed batch (Python and AOT paths)")
    parser.add_argument("--iters", type=int, default=20,
                        help="batches per repetition (Python and AOT paths)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up batches per path")
    parser.add_argument("--min-time", type=float, default=0.2,
                        help="--benchmark_min_time (seconds per repetition) of the C++ binary")
    parser.add_argument("--n", type=int, default=N, help="elements (n); grid cdiv(n, 128)")
    parser.add_argument("--cuda-home", default=os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    args = parser.parse_args(argv)
    for name in ("reps", "batch", "iters", "warmup", "n"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive")
    if args.n == 1:
        parser.error("--n 1 would be compiled into the kernel as a constant by Triton's JIT")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import torch  # noqa: PLC0415
        import triton  # noqa: PLC0415
    except ImportError as e:
        return skip_or_fail(f"cannot import torch/triton: {e}")
    if not torch.cuda.is_available():
        return skip_or_fail("no CUDA device visible to torch")
    args.out.mkdir(parents=True, exist_ok=True)
    log = lambda line: print(line, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="triton_launch_bench.") as tmp:
        work = Path(tmp)
        try:
            python_results, checks, hinted = measure_python(torch, triton, args, log)
            aot_results, aot_doc = measure_aot(sys.executable, args, hinted, work, log)
            cpp_results, gb_doc = measure_cpp(args)
        except BenchError as e:
            print(f"FAILED: {e}", file=sys.stderr)
            return 1
    results = {**python_results, "triton_aot": aot_results, **cpp_results}
    summaries = summarize_all(results)
    hints = {k: ", ".join(v) or "none" for k, v in hinted.items()}
    jit_spec = ("JIT-specialized at run time; divisibility 16 on " +
                "; ".join(f"{k}: {hints[k]}" for k in KERNELS))
    specializations = {
        "triton_jit": jit_spec + "; grid a tuple",
        "triton_compiled": jit_spec + " (the CompiledKernel kernel[grid] returned)",
        "triton_aot": "the same :16 hints as the JIT (link.py dispatcher tests them per "
                      "launch), grid computed in the stub",
    }
    for key in CPP_PATHS:
        specializations[key] = "kernels/benchpack cubins: generic, no divisibility hints"
    launches = gb_doc["context"]["launches_per_iteration"]
    notes = [f"n = {args.n} ({triton.cdiv(args.n, BLOCK)} block of {BLOCK}), "
             f"num_warps {NUM_WARPS}, fp32 inputs, i32 scalars",
             f"Python and AOT paths: {args.reps} repetitions x {args.iters} batches of "
             f"{args.batch} launches; C++ binary: {args.reps} repetitions of "
             f"{args.min_time} s, {launches} launches per iteration, random interleaving",
             "Launch cost does not depend on the divisibility specialization."]
    env = environment(torch, triton, aot_doc, gb_doc)
    table = render_markdown(summaries, specializations, notes)
    header = (f"# Launch cost: Triton vs kpack\n\n{env['date']}, {env['gpu']}, driver "
              f"{env['driver_version']} (CUDA {env['driver_cuda_version']}), torch "
              f"{env['torch_version']} (CUDA {env['torch_cuda_version']}), Triton "
              f"{env['triton_version']}, CPU {env['cpu']}\n\nCommand: `{env['command']}`\n\n")
    (args.out / "results.md").write_text(header + table)
    doc = {"environment": env,
           "config": {"n": args.n, "block": BLOCK, "num_warps": NUM_WARPS, "batch": args.batch,
                      "iters": args.iters, "reps": args.reps, "warmup": args.warmup,
                      "min_time": args.min_time, "cpp_launches_per_iteration": launches},
           "specializations": specializations, "checks_max_error": {
               **checks, "triton_aot": aot_doc["max_error"]},
           "us_per_launch": results,
           "summary": {p: {k: vars(s) for k, s in per.items()} for p, per in summaries.items()},
           "targets": target_verdicts(summaries)}
    (args.out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    try:
        plot(summaries, args.out / "launch_cost.png",
             f"Host cost per launch, {env['gpu']}, Triton {env['triton_version']}")
    except ImportError as e:
        print(f"FAILED: cannot plot launch_cost.png without matplotlib: {e}", file=sys.stderr)
        return 1
    print(header + table, flush=True)
    print(f"wrote {args.out}/results.json, results.md, launch_cost.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
