#!/usr/bin/env python3
"""Where a Llama-3.2-1B decode step's GPU time goes (issue 22, point 4), in one process:

* every launch of the step timed one by one (CUDA events around each launch, so no two
  kernels overlap; the whole step enqueued behind a gate kernel first, so that the GPU
  never waits for the host and only the kernels are timed): µs, bytes read (weights, KV at the context, activations ignored),
  GB/s and % of a measured device-to-device copy's bandwidth, per kernel and summed;
* the same launches back to back as eager bound launches (``kernel.bind``), and as one
  step graph (``kpack.graph``) with and without programmatic (PDL) edges;
* with ``--ablate``, the step graph (the engine's edge policy) once without each kernel's
  launches: the step time it saves is what that kernel costs inside the graph, overlap
  with its neighbours included (the outputs are wrong then; only the time is kept).

The difference between the graph step and the sum of its kernels is what the kernel
boundaries cost (tail of one kernel, ramp of the next), and the two graphs show what PDL's
overlap buys. The engine is examples/llama/python/engine.py's, with the KV cache filled
synthetically to ``--context`` (as the benchmark grid does); the LM head advances the
positions, so they are reset after every step (each step runs at the same context).

    python3 bench/llama_breakdown.py --checkpoint DIR --out DIR [--pack DIR]
        [--batches 1,4] [--context 128] [--reps 20] [--ablate]

Writes breakdown.json and breakdown.md into --out. Exits 77 without torch or a GPU,
unless KPACK_REQUIRE_GPU=1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "llama" / "python"))
sys.path.insert(0, str(REPO / "bench"))

from llama_bench import copy_bandwidth, skip_or_fail  # noqa: E402

# About 5 ms at the H200's clocks: longer than the host takes to enqueue a step's launches
# with an event pair around each.
GATE_CYCLES = 10_000_000


def kernel_bytes(cfg, call, B: int, context: int) -> int:
    """Bytes a launch must read from memory: its weight matrix (the call's own `w`), the
    embedding rows of the batch, or the KV cache up to the context for attention (one
    layer's share of config.kv_bytes_read); activations are a few KB and ignored."""
    args = call.named()
    if "w" in args:
        return args["w"].numel() * args["w"].element_size()
    if call.kernel == "llama_embed":
        return B * cfg.H * args["table"].element_size()
    if call.kernel == "llama_attn_decode":
        return cfg.kv_bytes_read([context] * B) // cfg.L
    return 0


def measure(eng, kpack, torch, B: int, context: int, reps: int, copy_bps: float,
            ablate: bool = False) -> dict:
    s, cfg = eng.state, eng.cfg
    eng.fill_synthetic(B, context)
    eng.use("eager")
    eng.set_batch(B)
    bound, calls = eng.backend.bound, eng.backend.calls
    n = len(bound)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2 * n)]

    def reset():
        s.pos[:B].fill_(context)

    # The GPU must not wait for the host between launches (that would be timed too): a
    # gate kernel spins while the host enqueues the whole step behind it.
    def gate():
        torch.cuda._sleep(GATE_CYCLES)

    one = [[] for _ in range(n)]
    for rep in range(reps + 2):
        gate()
        for i, b in enumerate(bound):
            ev[2 * i].record()
            b()
            ev[2 * i + 1].record()
        torch.cuda.synchronize()
        reset()
        if rep >= 2:
            for i in range(n):
                one[i].append(1e3 * ev[2 * i].elapsed_time(ev[2 * i + 1]))
    per_launch = [statistics.median(t) for t in one]

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def step_us(step) -> float:
        times = []
        for rep in range(reps + 2):
            gate()
            start.record()
            step()
            end.record()
            end.synchronize()
            reset()
            if rep >= 2:
                times.append(1e3 * start.elapsed_time(end))
        return statistics.median(times)

    def eager():
        for b in bound:
            b()

    def graph_arm(programmatic: bool) -> str:
        return f"graph, {'PDL' if programmatic else 'no PDL'} edges"

    arms, edges = {"eager step": step_us(eager)}, {}
    for programmatic in (True, False):
        arm = graph_arm(programmatic)
        g = kpack.graph(bound, programmatic_edges=programmatic)
        arms[arm] = step_us(g.replay)
        edges[arm] = g.graphs()[0]["programmatic_edges"]
        del g

    in_graph, baseline = {}, None
    if ablate:
        import config  # noqa: PLC0415
        programmatic = config.programmatic_edges(B)
        # The whole step's graph with the engine's edges was timed above: the baseline.
        baseline = graph_arm(programmatic)
        for name in dict.fromkeys(c.kernel for c in calls):
            g = kpack.graph([b for b, c in zip(bound, calls) if c.kernel != name],
                            programmatic_edges=programmatic)
            in_graph[name] = arms[baseline] - step_us(g.replay)
            del g

    kernels = {}
    for call, us in zip(calls, per_launch):
        k = kernels.setdefault(call.kernel, {"launches": 0, "us": [], "bytes": 0})
        k["launches"] += 1
        k["us"].append(us)
        k["bytes"] = kernel_bytes(cfg, call, B, context)
    rows = []
    for name, k in kernels.items():
        us = statistics.median(k["us"])
        bps = k["bytes"] / (us * 1e-6) if us > 0 else 0.0
        rows.append({"kernel": name, "launches": k["launches"], "us_each": us,
                     "us_total": sum(k["us"]), "bytes_each": k["bytes"], "gbps": bps / 1e9,
                     "pct_copy": 100 * bps / copy_bps})
        if name in in_graph:
            rows[-1]["in_graph_us_total"] = in_graph[name]
    total = sum(per_launch)
    return {"batch": B, "context": context, "reps": reps, "launches": n, "kernels": rows,
            "sum_of_kernels_us": total, "arms": arms, "programmatic_edges": edges,
            "ablation_baseline": baseline,
            "graph_over_sum": arms[graph_arm(True)] / total,
            "pdl_gain_us": arms[graph_arm(False)] - arms[graph_arm(True)]}


def render(results) -> str:
    lines = [f"# Llama decode step breakdown, {results['device']}", "",
             f"Device-to-device copy: {results['copy_bps'] / 1e12:.2f} TB/s (read + write), "
             "the bandwidth the % copy column compares each kernel's bytes read per second "
             "with (as kernels/llama/check_kernels.py does).", ""]
    for r in results["cells"]:
        lines += [f"## Batch {r['batch']}, context {r['context']} (medians of {r['reps']})", "",
                  "| kernel | launches | µs each | µs total | MB each | GB/s | % copy |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for k in r["kernels"]:
            lines.append(f"| {k['kernel']} | {k['launches']} | {k['us_each']:.2f} | "
                         f"{k['us_total']:.1f} | {k['bytes_each'] / 1e6:.2f} | "
                         f"{k['gbps']:.0f} | {k['pct_copy']:.1f} |")
        lines += ["", f"Sum of the {r['launches']} launches timed one by one: "
                  f"{r['sum_of_kernels_us']:.1f} µs.", ""]
        for arm, v in r["arms"].items():
            edges = r["programmatic_edges"].get(arm)
            note = "" if edges is None else f", {edges} programmatic edges"
            lines.append(f"- {arm}: {v:.1f} µs/step ({v / r['sum_of_kernels_us']:.3f}x the "
                         f"sum{note})")
        lines += [f"- PDL edges save {r['pdl_gain_us']:.1f} µs/step", ""]
        ablated = [k for k in r["kernels"] if "in_graph_us_total" in k]
        if ablated:
            lines += ["In the step graph (the step time saved without the kernel's launches, "
                      f"from the \"{r['ablation_baseline']}\" step; floor: its bytes at the "
                      "copy bandwidth):", "",
                      "| kernel | µs per step | µs per launch | floor µs per launch |",
                      "|---|---:|---:|---:|"]
            for k in ablated:
                floor = k["bytes_each"] / results["copy_bps"] * 1e6
                lines.append(f"| {k['kernel']} | {k['in_graph_us_total']:.1f} | "
                             f"{k['in_graph_us_total'] / k['launches']:.2f} | {floor:.2f} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--pack", type=Path, default=REPO / "kernels" / "llamapack")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batches", default="1")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ablate", action="store_true",
                    help="also time the step graph without each kernel's launches")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        return skip_or_fail(f"no torch ({e})")
    if not torch.cuda.is_available():
        return skip_or_fail("torch sees no CUDA device")
    import kpack  # noqa: PLC0415

    import checkpoint  # noqa: PLC0415
    import config  # noqa: PLC0415
    import engine  # noqa: PLC0415
    if not (args.checkpoint / "model.safetensors").is_file():
        checkpoint.write_checkpoint(args.checkpoint, config.preset_dict("llama-3.2-1b"), seed=1,
                                    backend="torch", device="cuda")
    batches = [int(b) for b in args.batches.split(",")]
    capacity = config.aligned_capacity(args.context + 2)  # as the protocol's 16,384
    eng = engine.LlamaEngine(str(args.checkpoint), str(args.pack), "eager", max(batches), 64,
                             capacity)
    copy_bps = copy_bandwidth(torch)
    results = {"device": torch.cuda.get_device_name(), "copy_bps": copy_bps, "cells": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for B in batches:
        results["cells"].append(measure(eng, kpack, torch, B, args.context, args.reps, copy_bps,
                                        args.ablate))
        (args.out / "breakdown.json").write_text(json.dumps(results, indent=1) + "\n")
    text = render(results)
    (args.out / "breakdown.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
