#!/usr/bin/env python3
"""Llama-3.2-1B decode on the H200, every arm in one run (issue 21's benchmark):

* ``cpp-graph``, ``cpp-eager``: the C++ engine, ``kpack-llama --graphs on|off --json``;
* ``py-graph``, ``py-eager``: the Python engine (examples/llama/python/engine.py) through
  kpack: one ``kpack.graph`` per batch bucket replayed, or the bound launches one by one;
* ``triton``: the same @triton.jit kernels launched through Triton's JIT from a Python loop,
  each with the constexprs, warps and stages of the variant kpack picks;
* ``torch-compile``, ``torch-eager``: the PyTorch reference (examples/llama/python/
  reference.py, bf16, static KV cache) under ``torch.compile(mode="reduce-overhead")``
  and eager. Like Hugging Face's StaticCache, its decode step attends over the whole
  cache with a mask (fixed shapes: one CUDA graph), so its attention reads the capacity,
  not the context; the grid gives it capacity = context + steps + 1. ``--torch-sdpa math``
  forces SDPA's math backend (slower on the H200; see TorchArm).

Protocol row: batch 1, a 32-token prompt, 127 decode steps, KV capacity 16,384; µs/step is
the mean over 10 timed sequences (after 5 warm-ups) of each sequence's decode time (CUDA
events around the 127 steps) / 127. Each sequence prefills again.

Grid: batch {1, 4, 16, 64} x context {128, 1024, 4096, 8192}. Reaching a context by
prefilling it would cost minutes of GPU per cell, so the grid fills the KV cache
synthetically (random bf16 keys and values at positions 0..context-1, positions set to the
context) and then decodes --grid-steps steps; the C++ arms run a cell only if kpack-llama
has a --context option for that. The kpack arms run every cell; the torch arms only the
cells in --torch-cells (each is a new compile).

Per arm and cell: µs/step, tokens/s, host µs to issue a step, and the fraction of the
memory floor: (weight bytes + KV bytes read per step) / 4.8 TB/s, and the same bytes at the
bandwidth of a measured device-to-device copy (2 x bytes / time).

    python3 bench/llama_bench.py --kpack-llama build/examples/llama/kpack-llama \
        --out bench/llama_results [--quick] [--arms py-graph,cpp-graph,...] \
        [--cells 1:128,64:8192] [--torch-cells 1:1024] [--no-grid] [--no-protocol]

Writes results.json, results.md and llama_bench.png (matplotlib) into --out. The checkpoint
is written (random, seeded, make_checkpoint's torch path on the GPU) into --checkpoint
unless it is already there. Exits 77 without torch or a GPU, unless KPACK_REQUIRE_GPU=1.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "llama" / "python"))

HBM_BPS = 4.8e12
ARMS = ("cpp-graph", "cpp-eager", "py-graph", "py-eager", "triton", "torch-compile",
        "torch-eager")
ANCHORS = {"CUDA graph + PDL, positions fixed (published)": 794.74,
           "Hazy megakernel (published)": 759.83,
           "100 kernels, Python loop (published)": 817.83}


def skip_or_fail(reason: str) -> int:
    print(f"SKIPPED: {reason}")
    return 1 if os.environ.get("KPACK_REQUIRE_GPU") == "1" else 77


# ------------------------------------------------------------------ measurements

def copy_bandwidth(torch, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Bytes/s of a device-to-device copy, counting the bytes read and written."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        b.copy_(a)
    end.record()
    end.synchronize()
    bps = 2 * nbytes * reps / (start.elapsed_time(end) / 1e3)
    del a, b
    return bps


def floors(cfg, positions_per_step, copy_bps) -> dict:
    """µs floors of a step: mean over the steps of (weights + KV read) bytes."""
    kv = statistics.fmean(cfg.kv_bytes_read(p) for p in positions_per_step)
    nbytes = cfg.weight_bytes_per_step() + kv
    return {"bytes_per_step": nbytes, "kv_bytes_per_step": kv,
            "floor_us": 1e6 * nbytes / HBM_BPS, "copy_floor_us": 1e6 * nbytes / copy_bps}


def summarize(us_list, host_list, batch, fl) -> dict:
    us = statistics.fmean(us_list)
    return {"us_per_step": us, "us_min": min(us_list), "us_max": max(us_list),
            "tokens_per_s": batch * 1e6 / us,
            "host_us_per_step": statistics.fmean(host_list) if host_list else None,
            "frac_floor": fl["floor_us"] / us, "frac_copy_floor": fl["copy_floor_us"] / us,
            "sequences": len(us_list)}


def run_cpp(binary, pack, ckpt, graphs, batch, prompt, steps, capacity, warmup, timed,
            tmp: Path, context=None) -> dict:
    out = tmp / f"cpp_{int(graphs)}_{batch}_{context}.json"
    cmd = [binary, "--pack", str(pack), "--checkpoint", str(ckpt), "--batch", str(batch),
           "--prompt-lens", str(prompt), "--steps", str(steps), "--capacity", str(capacity),
           "--graphs", "on" if graphs else "off", "--warmup-seqs", str(warmup),
           "--timed-seqs", str(timed), "--json", str(out)]
    if context is not None:
        cmd += ["--context", str(context)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return json.loads(out.read_text())


def cpp_has_context_option(binary) -> bool:
    r = subprocess.run([binary, "--help"], capture_output=True, text=True)
    return "--context" in r.stdout + r.stderr


def py_sequences(eng, backend, batch, prompt, steps, warmup, timed, context=None):
    """(µs/step list, host µs/step list, graphs built, host µs/step spent issuing the step's
    launches, the rest being the token read-back's) of ``timed`` sequences."""
    from config import prompt_tokens  # noqa: PLC0415
    eng.use(backend)
    prompts = prompt_tokens(batch, [prompt] * batch, 0, eng.cfg.V) if context is None else None
    us, host, issue = [], [], []
    for i in range(warmup + timed):
        if context is not None:
            eng.fill_synthetic(batch, context, seed=i, fill_cache=i == 0)
        r = eng.run_sequence(prompts, steps, batch=batch)
        if i >= warmup:
            us.append(r.us_per_step)
            host.append(r.host_us_per_step)
            issue.append(r.host_issue_us_per_step)
    return us, host, eng.backend.stats().get("graphs_built"), statistics.fmean(issue)


class TorchArm:
    """The reference at one (batch, capacity): compiled or eager greedy decode."""

    def __init__(self, torch, cfg, weights, batch, capacity, compiled: bool, sdpa: str):
        import contextlib  # noqa: PLC0415

        import reference  # noqa: PLC0415
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415
        self.torch, self.batch = torch, batch
        # sdpa="math" forces SDPA's math backend. Measured on the H200 (2026-12-01, protocol
        # row): torch's own choice (cuDNN's flash kernel, one CTA per KV head for a decode
        # step's few query rows) 5.1 ms/step compiled, the math backend 10.7 ms/step.
        self.sdpa = ((lambda: sdpa_kernel([SDPBackend.MATH])) if sdpa == "math"
                     else contextlib.nullcontext)
        self.model = reference.ReferenceLlama(cfg, weights, torch.bfloat16, "cuda", batch,
                                              capacity)
        self.tokens = torch.zeros(batch, dtype=torch.int64, device="cuda")
        self.pos = torch.zeros(batch, dtype=torch.int64, device="cuda")
        self.step = self.model.decode_step
        if compiled:
            # The compiled function mutates no input but the static KV cache (the next
            # tokens are returned and copied eagerly), so that reduce-overhead has no input
            # mutation to skip its CUDA graphs for; perf_hints logs Inductor's reasons if
            # it does. (On the H200 the graphs replay, one graph launch per step: the
            # arm's time is the model's GPU time; bench/RESULTS.md.)
            self.model.mark_static()
            torch._logging.set_logs(perf_hints=True)
            model = self.model

            def next_tokens(tokens, pos):
                return model.forward(tokens[:, None], pos[:, None])[:, 0].argmax(dim=-1)

            compiled_step = torch.compile(next_tokens, mode="reduce-overhead", fullgraph=True)

            def step(tokens, pos):
                tokens.copy_(compiled_step(tokens, pos))
                pos.add_(1)

            self.step = step

    def sequence(self, steps, prompt=None, context=None, seed=0):
        import reference  # noqa: PLC0415
        from config import prompt_tokens  # noqa: PLC0415
        torch, B = self.torch, self.batch
        with torch.no_grad(), self.sdpa():
            if context is None:
                prompts = prompt_tokens(B, [prompt] * B, 0, self.model.cfg.V)
                self.tokens.copy_(reference.prefill(self.model, prompts).argmax(-1))
                self.pos.fill_(prompt)
            else:
                g = torch.Generator(device="cuda").manual_seed(seed)
                if seed == 0:
                    for cache in self.model.k_cache + self.model.v_cache:
                        cache[:B, :, :context].normal_(generator=g)
                self.tokens.copy_(torch.randint(0, self.model.cfg.V, (B,), generator=g,
                                                device="cuda"))
                self.pos.fill_(context)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            host = 0.0
            start.record()
            for _ in range(steps):
                t0 = time.perf_counter()
                self.step(self.tokens, self.pos)
                host += time.perf_counter() - t0
            end.record()
            end.synchronize()
        return 1e3 * start.elapsed_time(end) / steps, 1e6 * host / steps

    def close(self):
        # Each (batch, capacity) is a compile of its own: drop this one's code and graphs
        # (Dynamo would also stop compiling after its recompile limit).
        del self.model, self.step
        self.torch._dynamo.reset()


def cudagraph_skips(torch) -> dict:
    """Inductor's count of functions it ran without CUDA graphs (reduce-overhead's point),
    so far in this process: a compiled arm whose step was not captured says so."""
    from torch._dynamo.utils import counters  # noqa: PLC0415
    return {"cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0))}


def torch_sequences(arm, steps, warmup, timed, prompt=None, context=None):
    us, host = [], []
    for i in range(warmup + timed):
        u, h = arm.sequence(steps, prompt=prompt, context=context, seed=i)
        if i >= warmup:
            us.append(u)
            host.append(h)
    return us, host


# ------------------------------------------------------------------ outputs

def render(results) -> str:
    lines = [f"# Llama-3.2-1B decode, {results['device']}, {results['date']}", "",
             f"Memory floor: {results['weight_bytes'] / 1e9:.3f} GB of weights per step "
             f"+ KV read, at {HBM_BPS / 1e12:.1f} TB/s; device-to-device copy measured "
             f"{results['copy_bps'] / 1e12:.2f} TB/s (read + write).", ""]
    p = results.get("protocol")
    if p:
        lines += [f"## Protocol: batch 1, prompt 32, {p['steps']} steps, capacity "
                  f"{p['capacity']} ({p['warmup']} warm-up + {p['timed']} timed sequences)", "",
                  f"Floor {p['floor']['floor_us']:.1f} µs/step at 4.8 TB/s, "
                  f"{p['floor']['copy_floor_us']:.1f} µs/step at the copy's bandwidth.", "",
                  "| arm | µs/step (min-max) | tokens/s | host µs/step | % floor | % copy floor |",
                  "|---|---|---|---|---|---|"]
        for arm, r in p["arms"].items():
            if "error" in r:
                lines.append(f"| {arm} | {r['error']} | | | | |")
                continue
            host = "" if r.get("host_us_per_step") is None else f"{r['host_us_per_step']:.1f}"
            lines.append(f"| {arm} | {r['us_per_step']:.1f} ({r['us_min']:.1f}-{r['us_max']:.1f})"
                         f" | {r['tokens_per_s']:.0f} | {host} | {100 * r['frac_floor']:.1f} | "
                         f"{100 * r['frac_copy_floor']:.1f} |")
        lines += ["", "Published anchors (same protocol, H200): " +
                  "; ".join(f"{k} {v} µs/step" for k, v in ANCHORS.items()), ""]
    g = results.get("grid")
    if g:
        arms = sorted({a for c in g["cells"] for a in c["arms"]}, key=ARMS.index)
        lines += [f"## Grid: {g['steps']} decode steps after a synthetic context "
                  f"({g['warmup']} warm-up + {g['timed']} timed sequences per cell)", "",
                  "The KV cache is filled with random values up to the context and positions "
                  "are set, instead of prefilling the context (see the script's docstring). "
                  "Cells: µs/step (% of the 4.8 TB/s floor).", "",
                  "| batch | context | floor µs | " + " | ".join(arms) + " |",
                  "|---|---|---|" + "---|" * len(arms)]
        for c in g["cells"]:
            row = [str(c["batch"]), str(c["context"]), f"{c['floor']['floor_us']:.0f}"]
            for a in arms:
                r = c["arms"].get(a)
                row.append("" if r is None else r.get("error", "")[:40] if "error" in r else
                           f"{r['us_per_step']:.0f} ({100 * r['frac_floor']:.0f}%)")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(results, out_png: Path) -> None:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    panels = [key for key in ("protocol", "grid") if results.get(key)]
    if not panels:
        return
    # One panel per part that ran (a grid-only run draws no empty protocol panel).
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    axes = dict(zip(panels, axes[0]))
    left, right = axes.get("protocol"), axes.get("grid")
    p = results.get("protocol")
    if p:
        arms = [a for a, r in p["arms"].items() if "error" not in r]
        us = [p["arms"][a]["us_per_step"] for a in arms]
        left.barh(arms, us, color="tab:blue")
        for i, u in enumerate(us):
            left.text(u, i, f" {u:.0f}", va="center", fontsize=8)
        for (name, v), style in zip(ANCHORS.items(), (":", "--", "-.")):
            left.axvline(v, color="gray", linestyle=style, label=f"{name}: {v}")
        left.axvline(p["floor"]["floor_us"], color="red", label="memory floor (4.8 TB/s)")
        left.set_xlabel("µs per decode step (batch 1, prompt 32, 127 steps)")
        left.legend(fontsize=7, loc="lower right")
        left.invert_yaxis()
    g = results.get("grid")
    if g:
        for arm in ("cpp-graph", "py-graph", "py-eager", "triton"):
            for batch in sorted({c["batch"] for c in g["cells"]}):
                cells = [c for c in g["cells"] if c["batch"] == batch and arm in c["arms"]
                         and "error" not in c["arms"][arm]]
                if cells:
                    right.plot([c["context"] for c in cells],
                               [100 * c["arms"][arm]["frac_floor"] for c in cells],
                               marker="o", label=f"{arm} B={batch}")
        right.set_xscale("log", base=2)
        right.set_xlabel("context (synthetic)")
        right.set_ylabel("% of the memory floor (4.8 TB/s)")
        right.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out_png, dpi=130)


# ------------------------------------------------------------------ main

def parse_cells(spec):
    return [tuple(int(x) for x in c.split(":")) for c in spec.split(",") if c]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, help="Llama-3.2-1B-shaped checkpoint directory "
                    "(written here if absent; default: a temporary directory)")
    ap.add_argument("--pack", type=Path, default=REPO / "kernels" / "llamapack")
    ap.add_argument("--kpack-llama", help="the C++ engine's binary (the cpp-* arms)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--quick", action="store_true",
                    help="protocol 2 + 3 sequences, grid 32 steps 1 + 2 sequences, torch "
                         "arms on the protocol row only")
    ap.add_argument("--no-protocol", action="store_true")
    ap.add_argument("--no-grid", action="store_true")
    ap.add_argument("--cells", default="", help="grid cells B:context,... (default: all 16)")
    ap.add_argument("--torch-cells", default="", help="grid cells for the torch arms")
    ap.add_argument("--torch-sdpa", choices=("math", "auto"), default="auto",
                    help="the torch arms' SDPA backend: torch's own choice (default) or the "
                    "math backend (see TorchArm)")
    ap.add_argument("--grid-steps", type=int, default=64)
    ap.add_argument("--grid-warmup", type=int, default=2)
    ap.add_argument("--grid-timed", type=int, default=5)
    ap.add_argument("--steps", type=int, default=127)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timed", type=int, default=10)
    args = ap.parse_args(argv)
    if args.quick:
        args.warmup, args.timed = 2, 3
        args.grid_steps, args.grid_warmup, args.grid_timed = 32, 1, 2
        args.torch_cells = ""
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - set(ARMS)
    if unknown:
        ap.error(f"unknown arms {sorted(unknown)} (arms: {', '.join(ARMS)})")
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        return skip_or_fail(f"no torch ({e})")
    if not torch.cuda.is_available():
        return skip_or_fail("torch sees no CUDA device")
    if any(a.startswith("cpp") for a in arms) and not args.kpack_llama:
        print("no --kpack-llama: the cpp arms are left out")
        arms = [a for a in arms if not a.startswith("cpp")]
    import checkpoint  # noqa: PLC0415
    import config  # noqa: PLC0415
    import engine  # noqa: PLC0415

    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="llama_bench_"))
    ckpt = args.checkpoint or tmp / "llama-3.2-1b"
    if not (ckpt / "model.safetensors").is_file():
        t0 = time.perf_counter()
        checkpoint.write_checkpoint(ckpt, config.preset_dict("llama-3.2-1b"), seed=1,
                                    backend="torch", device="cuda")
        print(f"checkpoint written to {ckpt} in {time.perf_counter() - t0:.1f} s")
    cfg = config.load_config(ckpt)
    weights = checkpoint.torch_weights(ckpt, cfg)
    copy_bps = copy_bandwidth(torch)
    results = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now().isoformat(
        timespec="seconds"), "config": config.config_summary(cfg),
        "weight_bytes": cfg.weight_bytes_per_step(), "copy_bps": copy_bps, "arms": arms,
        "argv": sys.argv[1:]}
    print(f"{results['device']}: copy {copy_bps / 1e12:.2f} TB/s; weights "
          f"{cfg.weight_bytes_per_step() / 1e9:.3f} GB per step")
    py_arms = {"py-graph": "graph", "py-eager": "eager", "triton": "triton"}

    def save():  # after every arm and cell, so a run cut short keeps what it measured
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")

    def attempt(fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001  (an arm's failure is reported, the run goes on)
            print(f"  error: {type(e).__name__}: {e}")
            return {"error": f"{type(e).__name__}: {str(e)[:200]}"}

    # -- protocol row
    if not args.no_protocol:
        steps, prompt, capacity = args.steps, 32, 16384
        fl = floors(cfg, [[prompt + t] for t in range(steps)], copy_bps)
        proto = {"steps": steps, "capacity": capacity, "warmup": args.warmup,
                 "timed": args.timed, "floor": fl, "arms": {}}
        results["protocol"] = proto
        eng = None
        for arm in arms:
            t0 = time.perf_counter()
            if arm.startswith("cpp"):
                def cpp_arm(arm=arm):
                    j = run_cpp(args.kpack_llama, args.pack, ckpt, arm == "cpp-graph", 1, prompt,
                                steps, capacity, args.warmup, args.timed, tmp)
                    r = summarize([j["us_per_step"]], [j["host_us_per_step"]], 1, fl)
                    r["sequences"] = args.timed
                    r["graphs_built"] = j.get("graphs_built")
                    return r
                proto["arms"][arm] = attempt(cpp_arm)
            elif arm in py_arms:
                if eng is None:
                    eng = engine.LlamaEngine(str(ckpt), str(args.pack), py_arms[arm], 1, prompt,
                                             capacity, weights=weights)

                def py_arm(arm=arm):
                    us, host, built, issue = py_sequences(eng, py_arms[arm], 1, prompt, steps,
                                                          args.warmup, args.timed)
                    return dict(summarize(us, host, 1, fl), graphs_built=built,
                                host_issue_us_per_step=issue)
                proto["arms"][arm] = attempt(py_arm)
            else:
                def torch_arm(arm=arm):
                    t = TorchArm(torch, cfg, weights, 1, capacity, arm == "torch-compile",
                                 args.torch_sdpa)
                    try:
                        us, host = torch_sequences(t, steps, args.warmup, args.timed,
                                                   prompt=prompt)
                        skips = cudagraph_skips(torch)
                    finally:
                        t.close()
                    return dict(summarize(us, host, 1, fl), **skips)
                proto["arms"][arm] = attempt(torch_arm)
            r = proto["arms"][arm]
            save()
            if "error" not in r:
                issue = r.get("host_issue_us_per_step")
                issue = "" if issue is None else f" ({issue:.1f} issuing the launches)"
                print(f"protocol {arm}: {r['us_per_step']:.1f} µs/step, host "
                      f"{r['host_us_per_step'] or 0:.1f} µs{issue}, "
                      f"{100 * r['frac_floor']:.1f}% of floor ({time.perf_counter() - t0:.0f} s)")
        del eng
        gc.collect()
        torch.cuda.empty_cache()

    # -- grid
    if not args.no_grid:
        cells = parse_cells(args.cells) or [(b, c) for b in (1, 4, 16, 64)
                                           for c in (128, 1024, 4096, 8192)]
        torch_cells = set(parse_cells(args.torch_cells))
        steps = args.grid_steps
        # Aligned as the protocol's 16,384 (the first grids ran at 8,257, and so timed the
        # generic QKV and attention kernels).
        capacity = config.aligned_capacity(max(c for _, c in cells) + steps + 1)
        max_batch = max(b for b, _ in cells)
        grid = {"steps": steps, "warmup": args.grid_warmup, "timed": args.grid_timed,
                "capacity": capacity, "synthetic_context": True, "cells": []}
        results["grid"] = grid
        cpp_context = (any(a.startswith("cpp") for a in arms) and
                       cpp_has_context_option(args.kpack_llama))
        eng = None
        if any(a in py_arms for a in arms):
            eng = engine.LlamaEngine(str(ckpt), str(args.pack), "graph", max_batch, 1, capacity,
                                     weights=weights)
        for batch, context in cells:
            fl = floors(cfg, [[context + t] * batch for t in range(steps)], copy_bps)
            cell = {"batch": batch, "context": context, "floor": fl, "arms": {}}
            grid["cells"].append(cell)
            for arm in arms:
                if arm.startswith("cpp"):
                    if not cpp_context:
                        continue

                    def cpp_arm(arm=arm):
                        j = run_cpp(args.kpack_llama, args.pack, ckpt, arm == "cpp-graph", batch,
                                    1, steps, capacity, args.grid_warmup, args.grid_timed, tmp,
                                    context=context)
                        return summarize([j["us_per_step"]], [j["host_us_per_step"]], batch, fl)
                    cell["arms"][arm] = attempt(cpp_arm)
                elif arm in py_arms:
                    def py_arm(arm=arm):
                        us, host, built, issue = py_sequences(
                            eng, py_arms[arm], batch, None, steps, args.grid_warmup,
                            args.grid_timed, context=context)
                        return dict(summarize(us, host, batch, fl), graphs_built=built,
                                    host_issue_us_per_step=issue)
                    cell["arms"][arm] = attempt(py_arm)
                elif (batch, context) in torch_cells:
                    def torch_arm(arm=arm):
                        t = TorchArm(torch, cfg, weights, batch, context + steps + 1,
                                     arm == "torch-compile", args.torch_sdpa)
                        try:
                            us, host = torch_sequences(t, steps, args.grid_warmup,
                                                       args.grid_timed, context=context)
                            skips = cudagraph_skips(torch)
                        finally:
                            t.close()
                        return dict(summarize(us, host, batch, fl), **skips)
                    cell["arms"][arm] = attempt(torch_arm)
            save()
            print(f"grid B={batch} ctx={context}: " + ", ".join(
                f"{a} {r['us_per_step']:.0f} µs ({100 * r['frac_floor']:.0f}%)"
                for a, r in cell["arms"].items() if "error" not in r))
        if eng is not None:
            grid["py_graphs_built"] = eng.backends["graph"].stats().get("graphs_built") \
                if "graph" in eng.backends else None
        if not cpp_context and any(a.startswith("cpp") for a in arms):
            grid["note"] = "kpack-llama has no --context option: the cpp arms ran no grid cell"
        del eng
    save()
    md = render(results)
    (args.out / "results.md").write_text(md + "\n")
    print(md)
    try:
        plot(results, args.out / "llama_bench.png")
    except ImportError as e:
        print(f"no plot: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
