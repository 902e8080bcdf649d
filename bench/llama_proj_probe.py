#!/usr/bin/env python3
"""A Llama projection kernel alone in configs of its spec, at the engines' shapes.

A screening probe, run on a GPU: for each M, each config of KERNEL named on the command
line (any of kernels/llama/llama_spec.py's configs, tuned or not) is launched at
Llama-3.2-1B's shapes with its weights rotated beyond L2, replayed from a CUDA graph of
back-to-back launches (check_kernels.py's `_time_graph`: a kernel's cost inside a step
graph, not the step's), and its outputs compared with the first config's.

    bench/llama_proj_probe.py KERNEL --m 16,64 CONFIG [CONFIG ...]

The step-graph measure of a config stays bench/llama_variant_sweep.py's; its correctness
check, kernels/llama/check_kernels.py's.
"""

import argparse
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "kernels" / "llama"), str(HERE.parent / "tools")]

import check_kernels as ck  # noqa: E402
import llama_spec  # noqa: E402
import llama_torch as lt  # noqa: E402
import torch  # noqa: E402

PROJECTIONS = ("llama_qkv_rope", "llama_o_proj", "llama_gate_up", "llama_down_proj",
               "llama_lm_head")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kernel", choices=PROJECTIONS)
    p.add_argument("configs", nargs="+")
    p.add_argument("--m", default="16,64")
    args = p.parse_args()
    spec = ck.SPECS[args.kernel]
    outputs = spec.outputs  # compared from config to config, restored before each
    bw = ck.copy_bandwidth()
    print(f"{args.kernel}; device-to-device copy {bw / 1e12:.2f} TB/s (read + write)")
    print(f"{'M':>3} {'config':26} {'programs':>8} {'µs':>8} {'GB/s':>6} {'% copy':>7}  outputs")
    for m in (int(x) for x in args.m.split(",")):
        base = lt.make_inputs(args.kernel, dict(llama_spec.MODEL, M=m, CAP=4096), "cuda")
        nbytes = base["w"].numel() * base["w"].element_size()
        copies = ck._rotations(nbytes)
        weights = [base["w"]] + [base["w"].clone() for _ in range(copies - 1)]
        keep = {k: base[k].clone() for k in outputs}
        first = None
        for name in args.configs:
            config = spec.config(name)
            grid = spec.grid_for(base, config)
            for k, v in keep.items():
                base[k].copy_(v)
            try:
                ck.launch(args.kernel, base, config, grid, True)
                torch.cuda.synchronize()
                got = [base[k].clone() for k in outputs]
                us = ck._time_graph(lambda i=0, c=config, g=grid: ck.launch(
                    args.kernel, {**base, "w": weights[i % copies]}, c, g, True), 2 * copies)
            except Exception as err:  # noqa: BLE001 - report and go on
                print(f"{m:3} {name:26} failed: {type(err).__name__}: {str(err)[:160]}")
                continue
            if first is None:
                first = got
            diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, first))
            same = "same bits" if all(torch.equal(a, b) for a, b in zip(got, first)) else (
                f"max |diff| {diff:.3g}")
            programs = math.prod(grid)
            gbs = nbytes / us / 1e3
            print(f"{m:3} {name:26} {programs:8} {us:8.2f} {gbs:6.0f} "
                  f"{100 * gbs * 1e9 / bw:6.1f}%  {same}", flush=True)


if __name__ == "__main__":
    main()
