#!/usr/bin/env python3
"""Host cost per launch from Python: Triton's launchers against kpack's Python package, on
torch tensors, in one run.

For the benchmark pack's ``args4`` and ``args14`` kernels (the same trivial kernel with 4
and 14 call arguments, ``tools/kpack_tools/build_bench_pack.py``) this measures

* ``triton_jit``: Triton's ``kernel[grid](...)`` (JIT, warmed up, grid a tuple);
* ``triton_compiled``: the cached ``CompiledKernel[grid](...)`` that ``kernel[grid]`` returns;
* ``kpack_eager``: ``pack.args4(x, out, n, s0)`` -- kpack's Python call, grid from the
  manifest, torch's current stream;
* ``kpack_bound``: ``b()`` for ``b = pack.args4.bind(...)``;
* ``kpack_torch_ops``: ``torch.ops.kpack_bench.args4(x, out, n, s0)`` -- the pack's
  kernels registered as torch ops (``kpack.torch.register``) with their C++
  implementations (libkpack_torch_ops.so; the run fails without them), called as a torch
  program calls an op;
* ``kpack_torch_overload``: the same op called as its overload,
  ``torch.ops.kpack_bench.args4.default(...)`` (as a compiled graph calls it);
* ``kpack_torch_ops_py``: the op with the Python implementation instead
  (``register(..., native=False)``: the kernel object as the op's CUDA kernel), what
  ``register`` falls back to without the C++ library;
* ``torch_ops_floor``: an op of the same schema whose CUDA implementation is a Python
  function doing nothing -- the cost of torch's dispatcher and its boundary to a Python
  kernel alone, which any op implemented from Python pays (the C++ ops do not);
* ``torch_ops_floor_cpp``: an op of the same schema whose CUDA implementation is C++ doing
  nothing (libkpack_torch_ops.so's no-op) -- torch's own cost of calling a C++ op from
  Python, the floor under ``kpack_torch_ops`` (which adds kpack's launch to it);
* ``kpack_dropin``: Triton's own ``kernel[grid](...)`` call, the same line as
  ``triton_jit``, with the benchmark pack installed (``kpack.install``) while this row is
  timed: the drop-in launches it through kpack. The committed benchmark pack predates the
  kpack/2 ``source`` field, so the row installs a copy of it whose manifest names the
  functions it was built from (``kpack_tools.pack.source_identity``);
* ``raw_params``: raw ``cuLaunchKernelEx`` from C++ on the same cubin, the floor
  (``bench/launch_bench.cc``, run as a subprocess: ``--kpack-bench``).

Python paths are timed as ``triton_launch_bench.py`` times them (``launch_common.py``, one
implementation for both): batches of launches between two clock reads, the stream
synchronized before each batch outside the timed region, paths in a random order per
repetition; each path's output is checked once first. The targets of
issues 15 and 25 are evaluated on the medians and printed (a benchmark, not a test: a missed
target is reported, not failed).

On the GPU machine, from the repository root, after ``pip install --no-build-isolation .``::

    python3 bench/python_launch_bench.py --kpack-bench build-gpu/bench/kpack_launch_bench \\
        --out bench/python_results [--reps 20]

It writes ``results.json`` and ``results.md`` and prints the table. ``--smoke`` is a short
run (the GPU-tier test). Exits 77 (skipped) without torch or a GPU, unless
``KPACK_REQUIRE_GPU=1``.

Without a GPU, ``--fake-driver build/tests/fake_driver/libkpack_fake_cuda.so`` measures
kpack's own Python-side cost instead: the fake driver's launch does nothing
(KPACK_FAKE_LAUNCH_NOOP=1), the tensors are C stand-ins with a DLPack exchange table
(kpack_testing.FakeTensor: tests/python/kpack_testing.cc, built by `pip install .`), and
the result is ns per call, best of several rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import launch_common as common  # noqa: E402
from launch_common import (BLOCK, INPUTS, N, NUM_WARPS, check_launch,  # noqa: E402,F401
                           looped, make_inputs, skip_or_fail)

REPO = Path(__file__).resolve().parents[1]
PACK = REPO / "kernels" / "benchpack"
KERNELS = ("args4", "args14")


@dataclass(frozen=True)
class LaunchPath:
    key: str
    label: str
    # (torch, pack, kernel name, call args, out) -> the path's batch (launch_common.Batch)
    make: Optional[Callable] = None
    # (pack) -> a context manager that the path is checked, warmed up and timed in
    active: Optional[Callable] = None
    # False for a reference row that launches nothing (its output is not checked)
    computes: bool = True


def _triton_jit(torch, pack, kernel, args, out):
    from kpack_tools.build_bench_pack import FUNCTIONS  # noqa: PLC0415
    return common.triton_paths(FUNCTIONS[kernel][0], args)[0]


def _triton_compiled(torch, pack, kernel, args, out):
    from kpack_tools.build_bench_pack import FUNCTIONS  # noqa: PLC0415
    return common.triton_paths(FUNCTIONS[kernel][0], args)[1]


def _called(fn, args) -> common.Batch:
    """The batch of ``fn(*args)``, the call itself in the loop."""
    def batch(count: int) -> None:
        for _ in range(count):
            fn(*args)
    return batch


def _kpack_eager(torch, pack, kernel, args, out):
    return _called(pack[kernel], args)


def _kpack_bound(torch, pack, kernel, args, out):
    return looped(pack[kernel].bind(*args))


def _kpack_torch_ops(torch, pack, kernel, args, out):
    import kpack.torch  # noqa: PLC0415
    return _called(kpack.torch.register(pack, "kpack_bench", native=True)[kernel], args)


def _kpack_torch_overload(torch, pack, kernel, args, out):
    import kpack.torch  # noqa: PLC0415
    return _called(kpack.torch.register(pack, "kpack_bench", native=True)[kernel].default, args)


def _kpack_torch_ops_py(torch, pack, kernel, args, out):
    import kpack.torch  # noqa: PLC0415
    return _called(kpack.torch.register(pack, "kpack_bench_py", native=False)[kernel], args)


_floor_libraries = {}


def _floor_op(torch, pack, kernel, args, namespace, implement):
    """The call of an op in `namespace` with the kpack op's schema, defined once and given
    its CUDA implementation by ``implement(library, name)``."""
    import kpack.torch  # noqa: PLC0415
    library = _floor_libraries.get(namespace)
    if library is None:
        library = _floor_libraries[namespace] = torch.library.Library(namespace, "DEF")
    name = kpack.torch.op_name(kernel)
    ops = getattr(torch.ops, namespace)
    if not hasattr(ops, name):
        library.define(kpack.torch.op_schema(pack[kernel], name))
        implement(library, name)
    return _called(getattr(ops, name), args)


def _torch_ops_floor(torch, pack, kernel, args, out):
    """An op with the kpack op's schema whose CUDA implementation is a Python function that
    does nothing: what torch's dispatcher and its boundary to a Python kernel cost alone."""
    def implement(library, name):
        library.impl(name, lambda *a, grid=None: None, "CUDA")
    return _floor_op(torch, pack, kernel, args, "kpack_bench_floor", implement)


def _torch_ops_floor_cpp(torch, pack, kernel, args, out):
    """An op with the kpack op's schema whose CUDA implementation is C++ that only drops its
    arguments: what calling a C++ op from Python costs in torch alone."""
    import kpack.torch  # noqa: PLC0415

    def implement(library, name):
        native = kpack.torch._native()
        if isinstance(native, str):
            raise RuntimeError(f"the C++ floor needs libkpack_torch_ops.so: {native}")
        num_args = sum(1 for p in pack[kernel].params if not p.constexpr) + 1  # and grid
        native.register_noop("kpack_bench_floor_cpp", name, num_args)
    return _floor_op(torch, pack, kernel, args, "kpack_bench_floor_cpp", implement)


_dropin_packs = {}


def dropin_pack(pack, driver=None):
    """The benchmark pack with the kpack/2 ``source`` of the functions it was built from,
    in a temporary copy (made once)."""
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    import kpack  # noqa: PLC0415
    from kpack_tools.build_bench_pack import FUNCTIONS  # noqa: PLC0415
    from kpack_tools.pack import source_identity  # noqa: PLC0415
    if pack.dir not in _dropin_packs:
        copy = Path(tempfile.mkdtemp(prefix="kpack_bench_dropin_")) / "pack"
        shutil.copytree(pack.dir, copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["format"] = "kpack/2"
        for k in manifest["kernels"]:
            k["source"] = dict(source_identity(FUNCTIONS[k["name"]][0]))
        (copy / "manifest.json").write_text(json.dumps(manifest, indent=1))
        _dropin_packs[pack.dir] = kpack.open(copy, preload="first_use", driver=driver,
                                             nvtx=driver is None)
    return _dropin_packs[pack.dir]


@contextlib.contextmanager
def _dropin_active(pack):
    import kpack  # noqa: PLC0415
    kpack.install(dropin_pack(pack), strict=True)  # a fallback would time Triton: refuse it
    try:
        yield
    finally:
        kpack.uninstall()


PATHS = [
    LaunchPath("triton_jit", "Triton `kernel[grid](...)`", _triton_jit),
    LaunchPath("triton_compiled", "Triton `CompiledKernel[grid](...)`", _triton_compiled),
    LaunchPath("kpack_eager", "kpack eager `k(...)`", _kpack_eager),
    LaunchPath("kpack_bound", "kpack bound `b()`", _kpack_bound),
]
# The torch-path rows: `make` gets (torch, pack, kernel_name, call_args, out) and returns
# the launch callable, `active` (if any) the context the row is checked and timed in; the
# rows are measured, checked and tabulated like the others, and TARGETS name them.
EXTRA_PATHS: list = [
    LaunchPath("kpack_torch_ops", "kpack `torch.ops.kpack_bench.args4(...)`", _kpack_torch_ops),
    LaunchPath("kpack_torch_overload", "kpack `torch.ops.kpack_bench.args4.default(...)`",
               _kpack_torch_overload),
    LaunchPath("kpack_torch_ops_py", "kpack `torch.ops...args4(...)`, Python implementation "
               "(`register(native=False)`)", _kpack_torch_ops_py),
    LaunchPath("torch_ops_floor", "an op of the same schema doing nothing in Python (torch's "
               "floor)", _torch_ops_floor, computes=False),
    LaunchPath("torch_ops_floor_cpp", "an op of the same schema doing nothing in C++ (torch's "
               "floor for C++ ops)", _torch_ops_floor_cpp, computes=False),
    LaunchPath("kpack_dropin", "Triton `kernel[grid](...)` after `kpack.install`", _triton_jit,
               _dropin_active),
]
RAW = LaunchPath("raw_params", "raw `cuLaunchKernelEx` (C++, params)")


@dataclass(frozen=True)
class Target:
    text: str
    kernel: str
    check: Callable  # medians {path: us} -> (value, met)


TARGETS = [
    Target("kpack eager <= raw + 0.6 us (4 args)", "args4",
           lambda m: (m["kpack_eager"] - m["raw_params"], m["kpack_eager"] - m["raw_params"] <= 0.6)),
    Target("Triton kernel[grid] >= 3x kpack eager (4 args)", "args4",
           lambda m: (m["triton_jit"] / m["kpack_eager"], m["triton_jit"] / m["kpack_eager"] >= 3)),
    Target("kpack eager <= raw + 1.2 us (14 args)", "args14",
           lambda m: (m["kpack_eager"] - m["raw_params"], m["kpack_eager"] - m["raw_params"] <= 1.2)),
    Target("kpack bound <= raw + 0.4 us (4 args)", "args4",
           lambda m: (m["kpack_bound"] - m["raw_params"], m["kpack_bound"] - m["raw_params"] <= 0.4)),
    Target("kpack bound <= raw + 0.4 us (14 args)", "args14",
           lambda m: (m["kpack_bound"] - m["raw_params"], m["kpack_bound"] - m["raw_params"] <= 0.4)),
    Target("kpack torch.ops (C++ ops) <= kpack eager + 1 us (4 args)", "args4",
           lambda m: (m["kpack_torch_ops"] - m["kpack_eager"],
                      m["kpack_torch_ops"] - m["kpack_eager"] <= 1)),
    Target("kpack torch.ops (C++ ops) <= kpack eager + 1 us (14 args)", "args14",
           lambda m: (m["kpack_torch_ops"] - m["kpack_eager"],
                      m["kpack_torch_ops"] - m["kpack_eager"] <= 1)),
    Target("Triton kernel[grid] >= 3x the drop-in (4 args)", "args4",
           lambda m: (m["triton_jit"] / m["kpack_dropin"], m["triton_jit"] / m["kpack_dropin"] >= 3)),
    Target("Triton kernel[grid] >= 3x the drop-in (14 args)", "args14",
           lambda m: (m["triton_jit"] / m["kpack_dropin"], m["triton_jit"] / m["kpack_dropin"] >= 3)),
]


def measure_python(torch, paths, args) -> tuple[dict, dict]:
    import kpack  # noqa: PLC0415
    pack = kpack.open(PACK)
    stream = torch.cuda.Stream()  # non-blocking, like the C++ harness's streams
    errors = {p.key: {} for p in paths}
    batches = {}
    by_key = {p.key: p for p in paths}

    def active(key):
        p = by_key[key]
        return p.active(pack) if p.active else contextlib.nullcontext()

    with torch.cuda.stream(stream):
        for kernel in KERNELS:
            call, out, expected = make_inputs(torch, kernel)
            for p in paths:
                batch = p.make(torch, pack, kernel, call, out)
                with active(p.key):
                    if p.computes:
                        errors[p.key][kernel] = check_launch(torch, batch, out, expected,
                                                             f"{p.key} {kernel}")
                    else:
                        batch(1)
                batches[(p.key, kernel)] = batch
        results = common.measure(torch, batches, args.batch, args.iters, args.warmup, args.reps,
                                 active=active)
    return results, errors


def measure_raw(args) -> dict:
    """raw_params per repetition from the C++ benchmark (Google Benchmark JSON)."""
    out_file = args.out / "kpack_launch_bench.json"
    cmd = common.gbench_command(str(Path(args.kpack_bench).resolve()), str(out_file),
                                ["raw_params"], KERNELS, args.reps, args.min_time)
    print("+ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAILED: kpack_launch_bench exited {r.returncode}:\n{r.stderr[-3000:]}")
    return common.parse_gbench(json.loads(out_file.read_text()), ["raw_params"],
                               KERNELS)["raw_params"]


def render(medians, ranges, keys, labels, verdicts) -> str:
    lines = ["## Host µs per launch (median, min–max over repetitions)", "",
             "| path | " + " | ".join(f"{k} ({2 * INPUTS[k] + 2} args)" for k in KERNELS) +
             " | ratio to raw (" + ", ".join(KERNELS) + ") |",
             "|---|" + "---:|" * (len(KERNELS) + 1)]
    for key in keys:
        cells = [f"{medians[key][k]:.3f} ({ranges[key][k][0]:.3f}–{ranges[key][k][1]:.3f})"
                 for k in KERNELS]
        ratios = ", ".join(f"{medians[key][k] / medians['raw_params'][k]:.2f}x" for k in KERNELS)
        lines.append(f"| {labels[key]} | " + " | ".join(cells) + f" | {ratios} |")
    lines += ["", "## Targets (issues 15, 25)", "", "| target | measured | |", "|---|---:|---|"]
    for text, value, met in verdicts:
        lines.append(f"| {text} | {value:.2f} | {'met' if met else 'MISSED'} |")
    return "\n".join(lines) + "\n"


def gpu_main(args) -> int:
    try:
        import torch  # noqa: PLC0415
        import triton  # noqa: PLC0415
    except ImportError as e:
        return skip_or_fail(f"cannot import torch/triton: {e}")
    if not torch.cuda.is_available():
        return skip_or_fail("torch sees no CUDA device")
    sys.path.insert(0, str(REPO / "tools"))
    args.out.mkdir(parents=True, exist_ok=True)
    paths = PATHS + EXTRA_PATHS
    try:
        python_results, errors = measure_python(torch, paths, args)
    except common.BenchError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    results = {**python_results, RAW.key: measure_raw(args)}
    keys = [p.key for p in paths] + [RAW.key]
    labels = {p.key: p.label for p in paths + [RAW]}
    medians = {key: {k: statistics.median(v) for k, v in results[key].items()} for key in keys}
    ranges = {key: {k: (min(v), max(v)) for k, v in results[key].items()} for key in keys}
    verdicts = []
    for t in TARGETS:
        m = {key: medians[key][t.kernel] for key in keys}
        value, met = t.check(m)
        verdicts.append((t.text, value, met))
    device = torch.cuda.get_device_name(0)
    header = (f"# Launch cost from Python: Triton vs kpack\n\n"
              f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, "
              f"{device}, torch {torch.__version__}, Triton "
              f"{triton.__version__}, Python {platform.python_version()}\n\n"
              f"Command: `{' '.join([sys.executable, *sys.argv])}`\n\n"
              f"{args.reps} repetitions x {args.iters} batches of {args.batch} launches per "
              f"Python path, n = {N} (one block), fp32, i32 scalars, a non-default torch "
              f"stream; raw from kpack_launch_bench ({args.reps} repetitions of "
              f"{args.min_time} s).\n\n")
    table = render(medians, ranges, keys, labels, verdicts)
    (args.out / "results.md").write_text(header + table)
    (args.out / "results.json").write_text(json.dumps(
        {"device": device, "us_per_launch": results, "medians": medians,
         "check_max_error": errors,
         "targets": [{"target": t, "value": v, "met": m} for t, v, m in verdicts]},
        indent=1) + "\n")
    print(header + table, flush=True)
    return 0


def fake_main(args) -> int:
    """kpack's Python-side cost with no GPU: ns per call against the no-op fake driver."""
    os.environ["KPACK_FAKE_LAUNCH_NOOP"] = "1"
    import kpack  # noqa: PLC0415
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
    import kpack_testing_path  # noqa: PLC0415
    kpack_testing_path.add_to_sys_path()  # the tensor stand-ins: a test-only module
    import kpack_testing as _testing  # noqa: PLC0415
    from kpack_tools.build_bench_pack import FUNCTIONS  # noqa: PLC0415
    pack = kpack.open(PACK, driver=args.fake_driver, nvtx=False)
    kpack.install(dropin_pack(pack, driver=args.fake_driver), strict=True)
    rows = []
    for kernel in KERNELS:
        k = pack[kernel]
        t = [_testing.FakeTensor(0x7F00_0000_0000 + 0x1000 * i) for i in range(INPUTS[kernel] + 1)]
        call = (*t, N, *[2 * i + 3 for i in range(INPUTS[kernel])])
        ints = tuple(0x7F00_0000_0000 + 0x1000 * i for i in range(INPUTS[kernel] + 1)) + call[len(t):]
        bound = k.bind(*call)
        grid = (1,)
        jit_fn = FUNCTIONS[kernel][0]
        cases = {"eager (tensor stand-ins)": lambda: k(*call),
                 "eager (int pointers)": lambda: k(*ints),
                 "kernel[grid] (tensor stand-ins)": lambda: k[grid](*call),
                 "bound b()": bound,
                 "drop-in Triton fn[grid](..., BLOCK=, num_warps=)":
                     lambda: jit_fn[grid](*call, BLOCK=BLOCK, num_warps=NUM_WARPS)}
        for name, fn in cases.items():
            best = min(_time_ns(fn, args.fake_launches) for _ in range(args.fake_rounds))
            rows.append((kernel, name, best))
    empty = min(_time_ns(lambda: None, args.fake_launches) for _ in range(args.fake_rounds))
    print(f"kpack Python launch cost against the no-op fake driver (ns per call, best of "
          f"{args.fake_rounds} rounds of {args.fake_launches}; a Python lambda call costs "
          f"{empty:.0f} ns and is included in each row):")
    for kernel, name, ns in rows:
        print(f"  {kernel:7} {name:32} {ns:8.1f}")
    return 0


def _time_ns(fn, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kpack-bench", help="the C++ benchmark binary (raw cuLaunchKernelEx rows)")
    p.add_argument("--out", type=Path, help="output directory")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--min-time", type=float, default=0.2)
    p.add_argument("--smoke", action="store_true", help="a short run (3 reps, small batches)")
    p.add_argument("--fake-driver", help="measure kpack's own cost against this fake driver")
    p.add_argument("--fake-launches", type=int, default=100000)
    p.add_argument("--fake-rounds", type=int, default=7)
    args = p.parse_args(argv)
    if args.smoke:
        args.reps, args.batch, args.iters, args.warmup, args.min_time = 3, 64, 3, 3, 0.02
    if not args.fake_driver and (not args.kpack_bench or not args.out):
        p.error("--kpack-bench and --out are required (or --fake-driver)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return fake_main(args) if args.fake_driver else gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())
