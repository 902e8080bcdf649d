"""What the two Python launch benchmarks share, implemented once.

``triton_launch_bench.py`` times Triton's launchers (``kernel[grid]``, ``CompiledKernel``,
the AOT C stub) against kpack's C++ paths; ``python_launch_bench.py`` times kpack's Python
paths (eager, bound, torch ops, the drop-in) against Triton's. Both run the benchmark
pack's kernels (``kernels/benchpack``, built by ``tools/kpack_tools/build_bench_pack.py``)
on the same inputs, time every path the same way, and read the C++ rows from
``kpack_launch_bench``'s Google Benchmark JSON. This module is that common part:

* ``make_inputs``: a kernel's call arguments and its exact expected output;
* ``check_launch``: one launch into a NaN-filled output, compared with it;
* ``time_batches`` and ``measure``: a sample is a batch of launches between two clock
  reads, the stream synchronized before the batch and outside the timed region (so the GPU
  queue never fills); paths are warmed up, then timed in a random order per repetition;
* ``triton_paths``: Triton's ``kernel[grid](...)`` and ``CompiledKernel[grid](...)``;
* ``gbench_filter``, ``gbench_command``, ``parse_gbench``: the C++ benchmark's rows;
* ``skip_or_fail``: exit 77 (skipped) without torch or a GPU, 1 with
  ``KPACK_REQUIRE_GPU=1``.

A launch is given as a batch function ``batch(count)`` that launches ``count`` times in a
plain loop, so no Python call but the launch itself is timed.
"""

from __future__ import annotations

import os
import random
import re
import sys
import time
from typing import Callable, Mapping, Sequence

SKIP = 77
BLOCK = 128  # the benchmark pack's kernels: one BLOCK per program, 4 warps
NUM_WARPS = 4
N = 128  # one block
INPUTS = {"args4": 1, "args14": 6, "args32": 15}  # input pointers; 2 * inputs + 2 arguments

Batch = Callable[[int], None]  # launches `count` times


class BenchError(RuntimeError):
    """A measurement could not be made or is not trustworthy; the message says why."""


def skip_or_fail(reason: str) -> int:
    """The exit status for a machine that cannot run the benchmark: 77 (skipped), or 1
    when ``KPACK_REQUIRE_GPU=1``."""
    if os.environ.get("KPACK_REQUIRE_GPU") == "1":
        print(f"FAILED: {reason} (KPACK_REQUIRE_GPU=1)", file=sys.stderr)
        return 1
    print(f"skipped: {reason}")
    return SKIP


def make_inputs(torch, kernel: str, n: int = N):
    """Device inputs and the reference output of one kernel: input i holds
    ``j * 0.25 + (i + 1)``, scalar i is ``2 * i + 3`` (never 1 nor a multiple of 16, so
    Triton's JIT specializes none of them), every sum exact in fp32. Returns
    ``(call arguments, out, expected)``."""
    k = INPUTS[kernel]
    ins = [torch.arange(n, dtype=torch.float32, device="cuda") * 0.25 + (i + 1)
           for i in range(k)]
    scalars = [2 * i + 3 for i in range(k)]
    out = torch.empty(n, dtype=torch.float32, device="cuda")
    expected = sum(ins) + float(sum(scalars))
    return (*ins, out, n, *scalars), out, expected


def check_launch(torch, batch: Batch, out, expected, what: str) -> float:
    """Launches once into a NaN-filled ``out``; returns the max error, raising BenchError
    on a mismatch."""
    out.fill_(float("nan"))
    batch(1)
    torch.cuda.synchronize()
    err = (out - expected).abs().max().item()
    if not err <= 1e-5:
        raise BenchError(f"{what} computed a wrong result: max abs error {err}")
    return err


def time_batches(torch, batch: Batch, count: int, iters: int) -> float:
    """µs per launch over ``iters`` batches of ``count`` launches, each batch timed with
    perf_counter_ns and the device synchronized before it, outside the timed region."""
    total = 0
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        batch(count)
        total += time.perf_counter_ns() - t0
    torch.cuda.synchronize()
    return total / 1e3 / (count * iters)


def measure(torch, batches: Mapping[tuple, Batch], count: int, iters: int, warmup: int,
            reps: int, active: Callable[[str], object] | None = None,
            seed: int = 1) -> dict[str, dict[str, list[float]]]:
    """Times every ``(path, kernel)`` batch: ``warmup`` batches each, then ``reps``
    repetitions in which every pair, in a new random order, is timed over ``iters``
    batches of ``count``. ``active(path)`` (optional) is the context manager a path runs
    in (e.g. the drop-in installed). Returns ``{path: {kernel: [µs per launch per
    repetition]}}``."""
    def context(path):
        return active(path) if active is not None else _Nothing()

    results: dict[str, dict[str, list[float]]] = {}
    for path, kernel in batches:
        results.setdefault(path, {})[kernel] = []
    for (path, _), batch in batches.items():
        with context(path):
            time_batches(torch, batch, count, warmup)
    order = list(batches)
    rng = random.Random(seed)
    for _ in range(reps):
        rng.shuffle(order)
        for path, kernel in order:
            with context(path):
                results[path][kernel].append(
                    time_batches(torch, batches[(path, kernel)], count, iters))
    return results


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def looped(launch: Callable[[], object]) -> Batch:
    """The batch of a launch that is already a callable of no argument (a BoundLaunch)."""
    def batch(count: int) -> None:
        for _ in range(count):
            launch()
    return batch


def triton_paths(fn, call_args: Sequence, n: int = N) -> tuple[Batch, Batch, object]:
    """Triton's two Python launch paths for a benchmark kernel ``fn`` (its ``@triton.jit``
    function): ``kernel[grid](...)`` with the grid a tuple, and the cached
    ``CompiledKernel[grid](...)`` that ``kernel[grid]`` returns, which takes the constexpr
    too. Returns ``(jit batch, compiled batch, the CompiledKernel)``; the first call
    compiles (or finds Triton's cache)."""
    grid = ((n + BLOCK - 1) // BLOCK,)
    compiled = fn[grid](*call_args, BLOCK=BLOCK, num_warps=NUM_WARPS)
    grid3, full = (grid[0], 1, 1), (*call_args, BLOCK)

    def jit(count: int) -> None:
        for _ in range(count):
            fn[grid](*call_args, BLOCK=BLOCK, num_warps=NUM_WARPS)

    def cached(count: int) -> None:
        for _ in range(count):
            compiled[grid3](*full)
    return jit, cached, compiled


# ---------------------------------------------------------------- Google Benchmark JSON

_TIME_UNITS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def gbench_filter(paths: Sequence[str], kernels: Sequence[str]) -> str:
    """The regex naming these C++ rows, as --benchmark_filter and for reading the JSON:
    ``path/kernel``, plus the ``/manual_time`` Google Benchmark appends; nothing else, so
    rows such as ``raw_params/args4/mt/manual_time/threads:2`` are out."""
    return "^(" + "|".join(paths) + ")/(" + "|".join(kernels) + ")(/manual_time)?$"


def gbench_command(binary: str, out_file: str, paths: Sequence[str], kernels: Sequence[str],
                   reps: int, min_time: float) -> list[str]:
    """The C++ benchmark's command line for these rows: random interleaving,
    per-repetition JSON in ``out_file``."""
    return [binary, f"--benchmark_filter={gbench_filter(paths, kernels)}",
            f"--benchmark_repetitions={reps}", f"--benchmark_min_time={min_time}",
            "--benchmark_enable_random_interleaving=true", f"--benchmark_out={out_file}",
            "--benchmark_out_format=json"]


def parse_gbench(doc: Mapping, paths: Sequence[str],
                 kernels: Sequence[str]) -> dict[str, dict[str, list[float]]]:
    """Per-repetition host µs per launch, ``path -> kernel -> [...]``, from a Google
    Benchmark JSON document. Each iteration is a batch of ``launches_per_iteration``
    launches (a context key); only ``run_type == "iteration"`` entries are read, so
    aggregates are ignored. Raises BenchError on a benchmark error or a missing row."""
    context = doc.get("context", {})
    if "launches_per_iteration" not in context:
        raise BenchError("the benchmark JSON has no context key 'launches_per_iteration'")
    launches = int(context["launches_per_iteration"])
    if launches <= 0:
        raise BenchError(f"launches_per_iteration is {launches}")
    name_re = re.compile(gbench_filter(paths, kernels))
    out: dict[str, dict[str, list[float]]] = {p: {k: [] for k in kernels} for p in paths}
    for bench in doc.get("benchmarks", []):
        m = name_re.match(bench.get("run_name", bench.get("name", "")))
        if not m or bench.get("run_type", "iteration") != "iteration":
            continue
        if bench.get("error_occurred"):
            raise BenchError(f"benchmark {bench['name']} failed: "
                             f"{bench.get('error_message', '(no message)')}")
        unit = bench.get("time_unit", "ns")
        if unit not in _TIME_UNITS:
            raise BenchError(f"benchmark {bench['name']}: unknown time_unit {unit!r}")
        out[m.group(1)][m.group(2)].append(bench["real_time"] * _TIME_UNITS[unit] / launches)
    missing = [f"{p}/{k}" for p in paths for k in kernels if not out[p][k]]
    if missing:
        raise BenchError("the benchmark JSON has no repetitions for " + ", ".join(missing))
    return out
