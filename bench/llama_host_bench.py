#!/usr/bin/env python3
"""Host µs to issue a Llama decode step from Python (examples/llama/python/engine.py), with
no GPU: the engine against the tests' fake CUDA driver with its launches made no-ops
(KPACK_FAKE_LAUNCH_NOOP=1: cuLaunchKernelEx and cuGraphLaunch return at once), so what is
timed is the engine's Python, torch's and kpack's host work per step, not a driver's.

The model has Llama-3.2-1B's step shape (16 layers: 5 L + 2 = 82 launches, the same
decode split S at batch 1) at tiny sizes (the ``tiny`` preset with 16 layers); the tensors
are CPU tensors passed to kpack as addresses. Rows, per backend (graph: ``kpack.graph``
replays; eager: the bound launches one by one):

- ``sequence``: the engine's own host µs per step of ``run_sequence`` (what
  bench/llama_bench.py reports on the GPU: the step's issue plus the token read-back's),
  median / min over the timed sequences;
- ``issue``: the part of it spent issuing the step's launches (``host_issue_us_per_step``);
- ``replay`` (graph only): ``StepGraph.replay(stream=0)`` called in a loop, kpack alone.

On a GPU the figures add the driver's cost (cuGraphLaunch of 82 nodes, the read-back's
copy and event) and torch's CUDA paths; here the machine's noise dominates what is left
between runs, so compare medians of several runs made back to back.

    python3 bench/llama_host_bench.py [--fake-driver LIB] [--sequences 15] [--steps 127]
        [--backends graph,eager] [--json FILE]

Exits 77 without torch or without the fake driver (build the CMake target kpack_fake_cuda).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "llama" / "python"))


def use_primary_context(lib: ctypes.CDLL) -> None:
    """Makes device 0's primary context current, as torch would on a GPU (the fake gives a
    thread no current context)."""
    def proc(name, version, *argtypes):
        fn = ctypes.c_void_p()
        if lib.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), version, 0, None) != 0:
            raise RuntimeError(f"the fake driver has no {name}")
        return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(fn.value)
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if (proc("cuDeviceGet", 2000, ctypes.POINTER(ctypes.c_int), ctypes.c_int)(
            ctypes.byref(dev), 0) != 0 or
            proc("cuDevicePrimaryCtxRetain", 7000, ctypes.POINTER(ctypes.c_void_p),
                 ctypes.c_int)(ctypes.byref(ctx), dev.value) != 0 or
            proc("cuCtxSetCurrent", 4000, ctypes.c_void_p)(ctx) != 0):
        raise RuntimeError("could not make the fake driver's primary context current")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fake-driver", default=os.environ.get("KPACK_FAKE_DRIVER") or str(
        REPO / "build" / "tests" / "fake_driver" / "libkpack_fake_cuda.so"))
    ap.add_argument("--pack", default=str(REPO / "kernels" / "llamapack"))
    ap.add_argument("--backends", default="graph,eager")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=127)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sequences", type=int, default=15)
    ap.add_argument("--replays", type=int, default=2000)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not Path(args.fake_driver).is_file():
        print(f"SKIPPED: no fake driver at {args.fake_driver} (build kpack_fake_cuda)")
        return 77
    try:
        import torch  # noqa: F401,PLC0415
    except ImportError as e:
        print(f"SKIPPED: no torch ({e})")
        return 77
    os.environ["KPACK_FAKE_LAUNCH_NOOP"] = "1"  # read when the fake is first used
    import checkpoint  # noqa: PLC0415
    import config  # noqa: PLC0415
    import engine  # noqa: PLC0415
    import kpack  # noqa: PLC0415

    kpack.open(args.pack, driver=args.fake_driver)  # loads the fake (cuInit)
    use_primary_context(ctypes.CDLL(args.fake_driver))
    ckpt = Path(tempfile.mkdtemp(prefix="llama_host_bench_"))
    shape = config.preset_dict("tiny")
    shape["num_hidden_layers"] = args.layers
    checkpoint.write_checkpoint(ckpt, shape, seed=2, backend="numpy")
    prompt = 32
    eng = engine.LlamaEngine(str(ckpt), args.pack, "graph", max_batch=1, max_prompt=prompt,
                             capacity=prompt + args.steps + 1, device="cpu",
                             driver=args.fake_driver)
    prompts = config.prompt_tokens(1, [prompt], 0, eng.cfg.V)
    launches = 5 * eng.cfg.L + 2
    out = {"launches_per_step": launches, "steps": args.steps, "sequences": args.sequences,
           "python": sys.version.split()[0], "torch": torch.__version__, "backends": {}}
    print(f"{launches} launches per step, {args.steps} steps, {args.sequences} timed "
          f"sequences (after {args.warmup}); host µs per step, median (min):")
    for backend in [b for b in args.backends.split(",") if b]:
        eng.use(backend)
        seq, issue = [], []
        for i in range(args.warmup + args.sequences):
            r = eng.run_sequence(prompts, args.steps)
            if i >= args.warmup:
                seq.append(r.host_us_per_step)
                if getattr(r, "host_issue_us_per_step", None) is not None:
                    issue.append(r.host_issue_us_per_step)
        row = {"sequence": seq, "issue": issue}
        line = (f"  {backend:5s}  sequence {statistics.median(seq):7.2f} ({min(seq):.2f})")
        if issue:
            line += f"  issue {statistics.median(issue):7.2f} ({min(issue):.2f})"
        if backend == "graph":
            graph, rounds = eng.backend.graph, []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(args.replays):
                    graph.replay(stream=0)
                rounds.append(1e6 * (time.perf_counter() - t0) / args.replays)
            row["replay"] = rounds
            line += f"  replay {statistics.median(rounds):7.2f} ({min(rounds):.2f})"
        out["backends"][backend] = row
        print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
