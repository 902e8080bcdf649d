#!/usr/bin/env python3
"""Do TMA weight loads make the Llama projections faster above one row? A screening probe.

Above one row the pack's projections stream their weights through pointer loads (`tl.load`
of a masked tile, pipelined by Triton into cp.async stages). On Hopper a tile can instead
come in through a tensor map (TMA: one thread issues the copy, no per-thread addresses
or masks, the registers freed for deeper pipelines). This probe times a plain GEMM,
y = x · wᵀ (bf16 in, fp32 out), at Llama-3.2-1B's projection shapes and M rows, in both
load styles with the same tiles, beside cuBLAS (`torch.matmul`), each replayed from a CUDA
graph of back-to-back launches with the weights rotated beyond L2 (check_kernels.py's
`_time_graph`), so the numbers compare with `llama_proj_probe.py`'s and the per-kernel
table's. It is not the pack's kernels (no norm, RoPE, residual, PDL): a kernel-shaped
question, answered before the pack's kernels are rewritten.

    bench/llama_tma_probe.py [--m 16,64] [--shapes qkv,o,gate_up,down] [--jobs 12]

Configs are `{p|t|d}_{BLOCK_N}_k{BLOCK_K}_w{warps}_s{stages}[_t][_xS]`: p pointer loads,
t TMA through tensor maps encoded on the host (kernel parameters), d TMA through tensor
maps each program writes to global scratch (`tl.make_tensor_descriptor`: the kernel's
parameters stay pointers, as the pack's), _t the swapped product (w · xᵀ, the weight rows
as the MMA's M), _xS S programs over K adding fp32 partials with atomics (the pack's split
K orders its adds; this one does not, so its bits are not compared). BLOCK_M is M. A TMA
config and its pointer twin run the same MMAs in the same order and must give the same
bits; every output is also checked against an fp32 product. The configs compile first in
--jobs processes (Triton's cache), then run one at a time.

On an H100 (session 27, bench/llama_results/tma_probe_h100_s27.txt) host tensor maps were
within a few percent of pointer loads in the same tiles and device-written ones slower.
"""

import argparse
import math
import multiprocessing as mp
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "kernels" / "llama")]

SHAPES = {  # name: (N, K), the weights' rows and row length
    "qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
    "lm_head": (128256, 2048)}
CONFIGS = [
    "p_16_k128_w4_s6", "p_32_k128_w4_s6", "p_64_k64_w4_s6", "p_64_k128_w4_s4_t",
    "p_64_k128_w4_s4_t_x2",
    "t_16_k128_w4_s6", "t_32_k128_w4_s6", "t_32_k64_w4_s8", "t_64_k64_w4_s6",
    "t_64_k64_w4_s8", "t_128_k64_w4_s4", "t_128_k64_w8_s4", "t_64_k128_w4_s4_t",
    "t_128_k64_w4_s6_t", "t_64_k64_w4_s6_x2", "t_64_k64_w4_s6_x4", "t_128_k64_w4_s4_t_x4",
    "d_32_k64_w4_s8", "d_64_k64_w4_s6", "d_128_k64_w4_s4", "d_64_k64_w4_s6_x4",
]
MODES = {"p": 0, "t": 1, "d": 2}


def parse(name):
    parts = name.split("_")
    c = {"tma": MODES[parts[0]], "BLOCK_N": int(parts[1]), "BLOCK_K": int(parts[2][1:]),
         "num_warps": int(parts[3][1:]), "STAGES": int(parts[4][1:]), "SWAP": False,
         "SPLIT": 1}
    for p in parts[5:]:
        if p == "t":
            c["SWAP"] = True
        elif p.startswith("x"):
            c["SPLIT"] = int(p[1:])
        else:
            raise ValueError(f"config {name}: unknown part {p!r}")
    return c


def twin(name):
    """The pointer-load config with the same tiles as TMA config `name` (None if not TMA)."""
    return "p" + name[1:] if name[0] in "td" else None


def _kernel():
    import torch
    import triton
    import triton.language as tl

    # Device-side tensor maps (d configs) live in global scratch that Triton's launcher
    # asks this allocator for.
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))

    @triton.jit
    def gemm(x, w, y, x_desc, w_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, STAGES: tl.constexpr, SWAP: tl.constexpr,
             SPLIT: tl.constexpr, TMA: tl.constexpr):
        if TMA == 2:
            x_desc = tl.make_tensor_descriptor(x, shape=[M, K], strides=[K, 1],
                                               block_shape=[BLOCK_M, BLOCK_K])
            w_desc = tl.make_tensor_descriptor(w, shape=[N, K], strides=[K, 1],
                                               block_shape=[BLOCK_N, BLOCK_K])
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        split = tl.program_id(2)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if SWAP:
            acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        k_len = K // SPLIT
        k_lo = split * k_len
        for k0 in tl.range(k_lo, k_lo + k_len, BLOCK_K, num_stages=STAGES):
            if TMA != 0:
                a = x_desc.load([pid_m * BLOCK_M, k0])
                b = w_desc.load([pid_n * BLOCK_N, k0])
            else:
                ks = k0 + tl.arange(0, BLOCK_K)
                a = tl.load(x + rows.to(tl.int64)[:, None] * K + ks[None, :],
                            mask=(rows < M)[:, None] & (ks < K)[None, :], other=0.0)
                b = tl.load(w + cols.to(tl.int64)[:, None] * K + ks[None, :],
                            mask=(cols < N)[:, None] & (ks < K)[None, :], other=0.0)
            if SWAP:
                acc = tl.dot(b, tl.trans(a), acc)
            else:
                acc = tl.dot(a, tl.trans(b), acc)
        if SWAP:
            out = tl.trans(acc)
        else:
            out = acc
        ptrs = y + rows.to(tl.int64)[:, None] * N + cols[None, :]
        ok = (rows < M)[:, None] & (cols < N)[None, :]
        if SPLIT == 1:
            tl.store(ptrs, out, mask=ok)
        else:
            tl.atomic_add(ptrs, out, mask=ok, sem="relaxed")

    return gemm


def _args(x, w, y, name, m):
    """(arguments, constexprs and launch options, grid) of config `name` at M = m."""
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor
    c = parse(name)
    if c["tma"] == 1:
        xd = TensorDescriptor.from_tensor(x, [m, c["BLOCK_K"]])
        wd = TensorDescriptor.from_tensor(w, [c["BLOCK_N"], c["BLOCK_K"]])
    else:
        xd = wd = None
    n, k = w.shape
    grid = (triton.cdiv(n, c["BLOCK_N"]), 1, c["SPLIT"])  # BLOCK_M is m: one program row
    kw = dict(BLOCK_M=m, BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], STAGES=c["STAGES"],
              SWAP=c["SWAP"], SPLIT=c["SPLIT"], TMA=c["tma"], num_warps=c["num_warps"])
    return (x, w, y, xd, wd, m, n, k), kw, grid


def _first_line(err):
    return f"{type(err).__name__}: {str(err).splitlines()[0][:150]}"


def _compile(job):
    """One config at one shape and M, compiled into Triton's cache (a worker process)."""
    shape, m, name = job
    import torch
    n, k = SHAPES[shape]
    x = torch.zeros(m, k, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(n, k, dtype=torch.bfloat16, device="cuda")
    y = torch.zeros(m, n, dtype=torch.float32, device="cuda")
    gemm = _kernel()
    try:
        args, kw, grid = _args(x, w, y, name, m)
        gemm.warmup(*args, grid=grid, **kw)
        return None
    except Exception as err:  # noqa: BLE001 - reported in the table
        return _first_line(err)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="16,64")
    p.add_argument("--shapes", default="qkv,o,gate_up,down")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--jobs", type=int, default=12)
    args = p.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    shapes = args.shapes.split(",")
    configs = args.configs.split(",")
    for c in configs:
        parse(c)
    jobs = [(s, m, c) for s in shapes for m in ms for c in configs]
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        errors = dict(zip(jobs, pool.map(_compile, jobs)))

    import check_kernels as ck  # noqa: PLC0415 - after the workers, which need no torch state
    import torch  # noqa: PLC0415
    gemm = _kernel()
    bw = ck.copy_bandwidth()
    print(f"device-to-device copy {bw / 1e12:.2f} TB/s (read + write), "
          f"{torch.cuda.get_device_name()}")
    print(f"{'shape':8} {'M':>3} {'config':24} {'programs':>8} {'µs':>8} {'GB/s':>6} "
          f"{'% copy':>7}  check")
    torch.manual_seed(0)
    for shape in shapes:
        n, k = SHAPES[shape]
        nbytes = n * k * 2
        copies = ck._rotations(nbytes)
        weights = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(copies)]
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            want = x.float() @ weights[0].float().t()
            scale = want.abs().max().item()
            same_us = ck.copy_us(nbytes)
            print(f"{shape:8} {m:3} {'(copy of the same bytes)':24} {'':8} {same_us:8.2f}")
            outs = {}
            yb = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            us = ck._time_graph(lambda i=0: torch.matmul(x, weights[i % copies].t(), out=yb),
                                2 * copies)
            gbs = nbytes / us / 1e3
            print(f"{shape:8} {m:3} {'cuBLAS (bf16 out)':24} {'':8} {us:8.2f} {gbs:6.0f} "
                  f"{100 * gbs * 1e9 / bw:6.1f}%", flush=True)
            for name in configs:
                if errors[(shape, m, name)]:
                    print(f"{shape:8} {m:3} {name:24} compile failed: "
                          f"{errors[(shape, m, name)]}")
                    continue
                y = torch.zeros(m, n, dtype=torch.float32, device="cuda")
                try:
                    a, kw, grid = _args(x, weights[0], y, name, m)
                    gemm[grid](*a, **kw)
                    torch.cuda.synchronize()
                    got = y.clone()
                    per = [_args(x, wt, y, name, m)[0] for wt in weights]
                    us = ck._time_graph(lambda i=0: gemm[grid](*per[i % copies], **kw),
                                        2 * copies)
                except Exception as err:  # noqa: BLE001 - report and go on
                    print(f"{shape:8} {m:3} {name:24} failed: {_first_line(err)}")
                    continue
                outs[name] = got
                err = (got - want).abs().max().item() / scale
                check = f"rel err {err:.1e}" + (" WRONG" if err > 2e-2 else "")
                t = twin(name)
                if t in outs and parse(name)["SPLIT"] == 1:
                    check += ", same bits as " + t if torch.equal(got, outs[t]) else (
                        ", DIFFERS from " + t)
                gbs = nbytes / us / 1e3
                print(f"{shape:8} {m:3} {name:24} {math.prod(grid):8} {us:8.2f} {gbs:6.0f} "
                      f"{100 * gbs * 1e9 / bw:6.1f}%  {check}", flush=True)
        weights.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
