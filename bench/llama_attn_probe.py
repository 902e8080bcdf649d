#!/usr/bin/env python3
"""Decode attention alone, timed in configs and source variants the pack does not hold.

A screening probe for llama_attn_decode (kernels/llama/llama_kernels.py), run on a GPU:
each (batch, context) cell launches the kernel at Llama-3.2-1B's heads with the engines'
split count (llama_torch.make_inputs takes it from the engines' config.decode_splits), KV
caches rotated beyond L2, replayed from a CUDA graph of back-to-back
launches (check_kernels.py's `_time_graph`: the kernel's cost inside a step graph, not
the step's). A source variant is the kernel file with text replaced (`VARIANTS`), loaded
as a module of its own; its outputs are compared with the committed kernel's first
(bits, or the largest difference), so a faster variant that computes something else is
visible in the same table.

    bench/llama_attn_probe.py [--cells 64:1024,4:4096] [--configs 64:4:3,32:4:3]
        [--variants base,pv1] [--ncu-once VARIANT:N:W:S:M:CTX]

The step-graph measure of a change stays bench/llama_variant_sweep.py's.
"""

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent / "kernels" / "llama"
sys.path[:0] = [str(KERNELS), str(HERE.parent / "tools")]

from llama_spec import MODEL  # noqa: E402

NH, NKV, D = MODEL["NH"], MODEL["NKV"], MODEL["D"]

# name -> [(old, new), ...] applied to llama_kernels.py's text.
VARIANTS = {
    "base": [],
    # P·V on the bf16 probabilities only (what FlashAttention does): one tensor-core
    # product per tile instead of two. Changes the outputs (the contract's hi + lo).
    "pv1": [("    return tl.dot(p_lo, v, tl.dot(p_hi, v, acc))",
             "    return tl.dot(p_hi, v, acc)")],
    # The scores' exp2 with log2(e) folded into the scale (what FlashAttention does). Only
    # where a row's context is one split: the combine still rescales partials with e^x.
    "exp2": [("    s = tl.dot(qt, tl.trans(kt)) * sm_scale\n",
              "    s = tl.dot(qt, tl.trans(kt)) * (sm_scale * 1.4426950408889634)\n"),
             ("    alpha = tl.exp(m_i - m_new)\n    pr = tl.exp(s - m_new[:, None])",
              "    alpha = tl.exp2(m_i - m_new)\n    pr = tl.exp2(s - m_new[:, None])")],
}


def variant_source(name):
    """llama_kernels.py's text with variant `name`'s replacements, each of which must
    match exactly once (tools/tests/test_llama_attn_probe.py checks them without a GPU)."""
    text = (KERNELS / "llama_kernels.py").read_text()
    for old, new in VARIANTS[name]:
        if text.count(old) != 1:
            raise SystemExit(f"variant {name}: {old!r} found {text.count(old)} times")
        text = text.replace(old, new)
    return text


def load_variant(name, tmp):
    text = variant_source(name)
    path = Path(tmp) / f"lk_{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"lk_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def inputs(m, ctx, copies):
    """check_kernels.py's attention arguments (llama_torch.make_inputs, the engines' S),
    every row at context ctx, and `copies` KV caches to rotate."""
    import llama_torch as lt
    a = lt.make_inputs("llama_attn_decode", dict(MODEL, M=m, CAP=ctx, ctx=ctx), "cuda")
    a["pos"][:] = ctx - 1
    a["caches"] = [(a["k_cache"], a["v_cache"])] + [
        (a["k_cache"].clone(), a["v_cache"].clone()) for _ in range(copies - 1)]
    return a


def launch(mod, a, cfg, i=0):
    bn, w, st = cfg
    k, v = a["caches"][i % len(a["caches"])]
    mod.llama_attn_decode[(a["S"], NKV, a["M"])](
        a["q"], k, v, a["pos"], a["seq"], a["o_part"], a["ml_part"], a["counters"], a["out"],
        a["M"], NH, NKV, a["CAP"], a["S"], a["sm_scale"], HEAD_DIM=D, GROUP_BLOCK=16,
        BLOCK_N=bn, SHORT_CTX=0, SHORT_N=bn, SHORT_STAGES=0, USE_PDL=True, num_warps=w,
        num_stages=st, launch_pdl=True)


def main():
    import check_kernels as ck  # exits 77 without torch (its import needs it)
    import torch
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", default="64:128,64:1024,64:4096,16:1024,4:1024,4:4096")
    p.add_argument("--configs", default="64:4:3,64:4:2,64:4:4,64:2:3,64:8:3,32:4:3,32:2:3,"
                                        "128:4:2,128:8:2")
    p.add_argument("--variants", default="base,pv1,exp2")
    p.add_argument("--ncu-once", default="",
                   help="VARIANT:BLOCK_N:WARPS:STAGES:M:CTX: launch that once (for ncu) and exit")
    args = p.parse_args()
    tmp = tempfile.mkdtemp()
    if args.ncu_once:
        name, bn, w, st, m, ctx = args.ncu_once.split(":")
        mod = load_variant(name, tmp)
        a = inputs(int(m), int(ctx), 1)
        for _ in range(3):
            launch(mod, a, (int(bn), int(w), int(st)))
        torch.cuda.synchronize()
        return
    mods = {n: load_variant(n, tmp) for n in args.variants.split(",")}
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",")]
    bw = ck.copy_bandwidth()
    print(f"device-to-device copy {bw / 1e12:.2f} TB/s (read + write)")
    print(f"{'M':>3} {'ctx':>5} {'S':>3} {'variant':8} {'n_w_s':9} {'µs':>8} {'GB/s':>6} "
          f"{'% copy':>7} {'vs base':>8}  outputs")
    for cell in args.cells.split(","):
        m, ctx = (int(x) for x in cell.split(":"))
        moved = m * NKV * ctx * D * 2 * 2
        a = inputs(m, ctx, ck._rotations(moved))
        ref = None
        for cfg in configs:
            base_us = None
            for name, mod in mods.items():
                try:
                    launch(mod, a, cfg)
                    torch.cuda.synchronize()
                    got = a["out"].clone()
                    us = ck._time_graph(lambda i=0, mod=mod, cfg=cfg: launch(mod, a, cfg, i),
                                        max(20, len(a["caches"])))
                except Exception as err:  # noqa: BLE001 - a config may not compile
                    print(f"{m:3} {ctx:5} {a['S']:3} {name:8} {cfg} failed: "
                          f"{type(err).__name__}: {str(err)[:120]}")
                    continue
                if ref is None:
                    ref = got
                diff = (got.float() - ref.float()).abs().max().item()
                same = "same bits" if torch.equal(got, ref) else f"max |diff| {diff:.3g}"
                base_us = us if name == "base" else base_us
                rel = f"{us - base_us:+8.2f}" if base_us is not None and name != "base" else ""
                gbs = moved / us / 1e3
                print(f"{m:3} {ctx:5} {a['S']:3} {name:8} {'%d_%d_%d' % cfg:9} {us:8.2f} "
                      f"{gbs:6.0f} {100 * gbs * 1e9 / bw:6.1f}% {rel:>8}  {same}", flush=True)


if __name__ == "__main__":
    main()
