"""Check the Llama kernels (llama_kernels.py) against the torch math of docs/llama.md.

::

    python kernels/llama/check_kernels.py --device cpu    # interpreter (torch: pip install torch)
    python kernels/llama/check_kernels.py --device cuda [--bench-only] [--no-bench]
        [--bench-chosen] [--bench-m 1,4,16,64] [--json FILE]

Every case runs a kernel on inputs whose tensors are followed by guard memory of random
bytes and checks: its outputs against ``llama_torch`` within the spec's tolerances (the
integer outputs exactly), every other tensor unchanged (scratch excepted), a second run
giving the same bits, and a padded grid (every axis doubled plus one: extra programs)
giving the same bits with the guards untouched.

Exits 77 (skipped) without torch or, for ``--device cuda``, without a GPU, unless
``KPACK_REQUIRE_GPU=1`` (then 1); ctest runs the cuda checks as ``kpack_llama_kernels_gpu``.

``--device cpu`` runs Triton's interpreter (``TRITON_INTERPRET=1``, torch CPU tensors,
``USE_PDL`` off) at the tiny model's shapes and odd sizes, with one config per code path
(the GEMV with K in one tile and with a K loop, the products of a few rows kept per k
with K in one tile and with a K loop, ``tl.dot`` as x · wᵀ and as w · xᵀ (``SWAP``);
``llama_rmsnorm`` with a row in one tile and in a loop). ``--device cuda`` compiles them
(``USE_PDL`` on, launched with PDL): the same cases with every bucket's default config
and the committed pack's (every config for attention), the Llama-3.2-1B shapes of every
bucket, then the timing tables issue 22 asks for: each projection at M = 1 with every
candidate of the bucket (µs, GB/s, % of a measured 1 GiB device-to-device copy, µs of a
copy moving the same bytes in the same kind of graph and the kernel's speed relative to
it, µs with the weights in L2; ``--bench-chosen``: only the committed pack's config, the
per-kernel table, with one JIT compile per projection instead of one per candidate;
``--bench-m``: the same at more batch sizes, the committed config of each one's bucket)
and decode attention at batch 1/4/16/64 and contexts 128/512/1K/4K/8K the same way. On
either device ``--spec-buckets 1`` adds every spec candidate of the projection kernels'
M = 2-4 bucket at the tiny shapes.
"""

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--bench-only", action="store_true", help="cuda: timings only")
    parser.add_argument("--no-bench", action="store_true", help="cuda: checks only")
    parser.add_argument("--no-pdl", action="store_true",
                        help="cuda: compile and launch without PDL")
    parser.add_argument("--only", default="", help="comma-separated kernel names")
    parser.add_argument("--spec-buckets", default="",
                        help="also check every spec candidate of these M buckets of the "
                             "projection kernels (comma-separated numbers, 0 for M = 1) at "
                             "the tiny shapes, M at the bucket's lowest and highest")
    parser.add_argument("--bench-chosen", action="store_true",
                        help="cuda: time only the committed pack's config of each "
                             "projection (the per-kernel table), not every candidate")
    parser.add_argument("--bench-m", default="1",
                        help="cuda: time the projections at these batch sizes (comma-"
                             "separated; above 1 the committed pack's config of M's "
                             "bucket only)")
    parser.add_argument("--json", help="write the timing tables here")
    return parser.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None and ARGS.device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

sys.path[:0] = [str(HERE), str(REPO / "tools")]
SKIP = 77  # ctest's skip code (tests/CMakeLists.txt)


def unavailable(reason):
    """Exit 77 (skipped), or 1 under KPACK_REQUIRE_GPU=1."""
    print(f"check_kernels: {reason}")
    sys.exit(1 if os.environ.get("KPACK_REQUIRE_GPU") == "1" else SKIP)


try:
    import torch  # noqa: E402
except ImportError:
    unavailable("torch is not installed")
import triton  # noqa: E402

import llama_kernels as lk  # noqa: E402
import llama_spec  # noqa: E402
import llama_torch as lt  # noqa: E402

SPECS = {spec.name: spec for spec in llama_spec.ALL_KERNELS}
SCRATCH = {"o_part", "ml_part", "part_max", "part_idx", "part"}
GUARD = 4096  # bytes of random guard after every tensor


def interpreter_fixes():
    """Triton 3.6's interpreter with numpy 2 and bf16, fixed for this check only: a
    1-element array as a loop bound (numpy 2 refuses int() of it), fp32 -> bf16 casts
    (it truncates; the GPU rounds to nearest even) and tl.dot on bf16 (it multiplies the
    raw uint16 patterns)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as it
    if getattr(it, "_llama_fixed", False):
        return
    it._llama_fixed = True
    patch = it._patch_lang_tensor

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
    it._patch_lang_tensor = patched
    builder, handle = it.InterpreterBuilder, it.TensorHandle
    cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return handle(rounded.view(torch.int16).numpy().view(np.uint16), dst_type.scalar)
        return cast(self, src, dst_type)
    builder.cast_impl = cast_impl

    def as_f32(h):
        if h.dtype.scalar == tl.bfloat16:
            return (h.data.astype(np.uint32) << 16).view(np.float32)
        return h.data

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return handle(np.matmul(as_f32(a), as_f32(b), dtype=d.data.dtype) + d.data,
                      d.dtype.scalar)
    builder.create_dot = create_dot


# ---------------------------------------------------------------------------- running

def _guarded(args, seed=11):
    """Copies of the tensors of `args`, each at the front of a buffer whose last GUARD
    bytes are random; returns (args, [(name, tail, pattern)])."""
    gen = torch.Generator().manual_seed(seed)
    out, guards = dict(args), []
    for name, value in args.items():
        if not isinstance(value, torch.Tensor):
            continue
        nbytes = value.numel() * value.element_size()
        buf = torch.empty(nbytes + GUARD, dtype=torch.uint8, device=value.device)
        tail = buf[nbytes:]
        tail.copy_(torch.randint(0, 256, (GUARD,), generator=gen, dtype=torch.uint8))
        view = buf[:nbytes].view(value.dtype).view(value.shape)
        view.copy_(value)
        out[name] = view
        guards.append((name, tail, tail.clone()))
    return out, guards


def _fn(name):
    return SPECS[name].fn


def _grid(spec, args, config):
    return spec.grid_for(args, config)


def launch(name, args, config, grid, pdl):
    spec = SPECS[name]
    kwargs = {k: v for k, v in args.items() if k in spec.call_params}
    kwargs.update(spec.constexprs(config))
    kwargs["USE_PDL"] = pdl
    opts = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if pdl:
        opts["launch_pdl"] = True
    spec.fn[grid](**kwargs, **opts)


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


FAILURES = []


def _fail(where, text):
    FAILURES.append(f"{where}: {text}")
    print(f"  FAIL {where}: {text}", flush=True)


def _tolerance(spec, output):
    tol = spec.tolerance
    if isinstance(tol, dict):
        tol = tol.get(output)
    return tol


def _compare(where, spec, output, got, want):
    tol = _tolerance(spec, output)
    if got.dtype in (torch.int32, torch.int64) or tol == (0.0, 0.0):
        if not torch.equal(got, want):
            bad = (got != want).nonzero()
            _fail(where, f"{output}: {len(bad)} elements differ, first at "
                         f"{bad[0].tolist()}: {got[tuple(bad[0])].item()} != "
                         f"{want[tuple(bad[0])].item()}")
            return False
        return True
    rtol, atol = tol
    g, w = got.double(), want.double()
    diff = (g - w).abs()
    bad = ~(diff <= atol + rtol * w.abs())
    if bad.any():
        i = int(torch.where(bad.reshape(-1), diff.reshape(-1), -1.0).argmax())
        _fail(where, f"{output}: {int(bad.sum())} of {g.numel()} elements outside rtol "
                     f"{rtol} atol {atol}; worst at {i}: {g.reshape(-1)[i].item():.6g} vs "
                     f"{w.reshape(-1)[i].item():.6g}")
        return False
    return True


def _same_bits(a, b):
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def check_case(name, shape, config, device, pdl, padded=True, tweak=None):
    """One kernel, one shape, one config: reference, determinism, padded grid."""
    spec = SPECS[name]
    where = f"{name} {config.name} {dict((k, v) for k, v in shape.items() if k not in lt.TINY or shape.get(k) != lt.TINY.get(k))}"
    t0 = time.time()
    pristine = lt.make_inputs(name, shape, device)
    if tweak is not None:
        tweak(pristine)
    want = lt.reference(name, {k: v.clone() if isinstance(v, torch.Tensor) else v
                               for k, v in pristine.items()})
    grid = _grid(spec, pristine, config)
    runs = []
    grids = [grid, grid] + ([tuple(2 * g + 1 for g in grid)] if padded else [])
    for number, g in enumerate(grids):
        args, guards = _guarded(pristine, seed=11)
        launch(name, args, config, g, pdl)
        _sync(device)
        damaged = [n for n, tail, pattern in guards if not torch.equal(tail, pattern)]
        if damaged:
            _fail(where, f"grid {g}: wrote past the end of {damaged}")
        runs.append(args)
    ok = True
    for output in spec.outputs:
        ok &= _compare(where, spec, output, runs[0][output], want[output])
    for n, value in pristine.items():
        if isinstance(value, torch.Tensor) and n not in spec.outputs and n not in SCRATCH:
            if not _same_bits(runs[0][n], value):
                ok = False
                _fail(where, f"input '{n}' changed")
    for number, label in ((1, "second run"), (2, f"padded grid {grids[-1]}")):
        if number >= len(runs):
            continue
        differ = [n for n, v in runs[0].items()
                  if isinstance(v, torch.Tensor) and not _same_bits(v, runs[number][n])]
        if differ:
            ok = False
            _fail(where, f"{label}: {differ} differ bitwise from the first run")
    print(f"  {'ok  ' if ok else 'BAD '} {where} grid {grid} ({time.time() - t0:.1f}s)",
          flush=True)
    return ok


# ------------------------------------------------------------------------------ cases

def _cfg(name, warps, stages, **blocks):
    return llama_spec._config(name, warps, stages, **blocks)


# Compact configs for the interpreter, one per code path (the spec's, larger, run on the
# GPU): the GEMV (BLOCK_M 1), the products of a few rows kept per k (BLOCK_M 2-15) or a
# GEMV per row, tl.dot.
CPU_PROJ = {
    "gemv": dict(BLOCK_M=1, BLOCK_N=16, BLOCK_K=256),
    "gemv_k64": dict(BLOCK_M=1, BLOCK_N=8, BLOCK_K=64),
    # The LM head streaming its rows tile by tile (_lm_head_stream): K in one tile (the
    # pipelined loop) and in two.
    "stream": dict(BLOCK_M=1, BLOCK_N=64, BLOCK_K=256),
    "stream_k128": dict(BLOCK_M=1, BLOCK_N=128, BLOCK_K=128),
    "rows4": dict(BLOCK_M=4, BLOCK_N=16, BLOCK_K=128),
    "rows2_whole": dict(BLOCK_M=2, BLOCK_N=16, BLOCK_K=512),  # K in the first tile
    # A GEMV per row (tiles of _ROWS_GEMV_K columns or more; K in the first tile).
    "rows4_gemv": dict(BLOCK_M=4, BLOCK_N=4, BLOCK_K=2048),
    "rows8": dict(BLOCK_M=8, BLOCK_N=16, BLOCK_K=64),
    "dot16": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128),
    "dot64": dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128),
    # tl.dot as w · xᵀ (SWAP): K in one tile and in a loop.
    "dot16_t": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, SWAP=1),
    "dot64_t": dict(BLOCK_M=64, BLOCK_N=16, BLOCK_K=64, SWAP=1),
    # The o and down projections' K split over programs (llama_proj_residual's SPLIT):
    # runs of one and two K tiles, and (K = 256 in 3) one split with none.
    "split4": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, SPLIT=4),
    "split3_64": dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=64, SPLIT=3),
    "split4_t": dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, SPLIT=4, SWAP=1),
    # The LM head above one row, a program's rows in tl.dot tiles of _LM_TILE // BLOCK_K:
    # 8 tiles of 32 (K in one tile), 2 of 128 (a K loop).
    "tiles16": dict(BLOCK_M=16, BLOCK_N=256, BLOCK_K=256),
    "tiles64_k64": dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64),
    "tiles16_t": dict(BLOCK_M=16, BLOCK_N=256, BLOCK_K=256, SWAP=1),
    # The same as one flattened loop (FLAT, _lm_head_flat).
    "tiles16_f": dict(BLOCK_M=16, BLOCK_N=256, BLOCK_K=256, FLAT=1),
    "tiles64_k64_f": dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, FLAT=1),
    "tiles16_t_f": dict(BLOCK_M=16, BLOCK_N=256, BLOCK_K=256, SWAP=1, FLAT=1),
}
SPLIT_KERNELS = ("llama_o_proj", "llama_down_proj")


def _proj_cfg(kernel, path):
    blocks = dict(CPU_PROJ[path])
    if kernel == "llama_qkv_rope":
        blocks["BLOCK_J"] = blocks.pop("BLOCK_N")
    if kernel in SPLIT_KERNELS:
        blocks.setdefault("SPLIT", 1)
    else:
        assert "SPLIT" not in blocks, (kernel, path)
    if kernel == "llama_lm_head":
        blocks.setdefault("FLAT", 0)
    else:
        assert "FLAT" not in blocks, (kernel, path)
    return _cfg(f"p_{path}", 4, 2, **blocks)


def _tie_row(xn_row):
    """A weight row whose logit with the normalized row xn_row is one product: 8 (signed)
    at xn_row's largest entry, zeros elsewhere. Far ahead of the random rows, and the same
    bits in every summation order, so the rows that share it tie exactly wherever they
    sit in a tile (a row of 0.05 · xn did not: the interpreter's tl.dot, numpy's matmul,
    summed identical rows at two places of one tile differently)."""
    j = int(xn_row.abs().argmax())
    w = torch.zeros_like(xn_row, dtype=lt.BF16)
    w[j] = 8.0 if xn_row[j] > 0 else -8.0
    return w


def _lm_ties(args):
    """Exact ties: row 0's winner at 260 and 261 (one tile), 300 (a later tile of the same
    streaming program) and V - 3 (another program); row 1's in the next column (same
    program), so the smallest index must win."""
    v, m = args["V"], args["M"]
    xn = lt.rmsnorm(args["h"], args["norm_w"], args["eps"]).float()
    w = args["w"]
    w[300] = _tie_row(xn[0])
    w[v - 3] = w[300]
    w[260] = w[300]
    w[261] = w[300]
    if m > 1:
        w[500] = _tie_row(xn[1])
        w[501] = w[500]


def cases(device):
    """(kernel, shape, config, padded, tweak) to check."""
    tiny = dict(lt.TINY)
    gqa4 = dict(tiny, NH=8, NKV=2)
    odd = dict(tiny, H=255, I=517, V=999)
    out = []
    cpu = device == "cpu"
    proj_kernels = ("llama_qkv_rope", "llama_o_proj", "llama_gate_up", "llama_down_proj",
                    "llama_lm_head")
    for m in (1, 3, 17, 70):
        out.append(("llama_embed", dict(tiny, M=m), SPECS["llama_embed"].config("b512_w1"),
                    m in (3, 17), None))
    # llama_rmsnorm: a row in one tile, and in a loop over narrower ones (odd H too).
    for m in (1, 3, 17):
        for shape in (dict(tiny, M=m), dict(odd, M=m)):
            for config in (SPECS["llama_rmsnorm"].config("b512_w2"), _cfg("b128", 4, 1,
                                                                           BLOCK=128)):
                out.append(("llama_rmsnorm", shape, config, m in (3, 17), None))
    if cpu:
        # The GEMV with its whole K in the first tile (loaded before gdc_wait) and with
        # more tiles after it (the K loop and, under RMSNorm, the rest of the row).
        plan = {1: ("gemv", "gemv_k64", "rows4"),
                3: ("rows4", "rows2_whole", "rows4_gemv", "dot16", "dot16_t"),
                17: ("gemv", "rows8", "dot16"), 70: ("dot64", "dot64_t")}
        for kernel in proj_kernels:
            for m, paths in plan.items():
                for path in paths:
                    shape = dict(tiny, M=m, CAP=128)
                    out.append((kernel, shape, _proj_cfg(kernel, path),
                                m in (3, 17) and path != "gemv" or m == 1, None))
            # Sizes that are no multiples of 16 (rows that start off 16-byte boundaries).
            out.append((kernel, dict(odd, M=1, CAP=128), _proj_cfg(kernel, "gemv_k64"), True,
                        None))
            out.append((kernel, dict(odd, M=3, CAP=128), _proj_cfg(kernel, "rows4"), True,
                        None))
            if kernel in SPLIT_KERNELS:
                for shape, path in ((dict(tiny, M=3), "split4"), (dict(tiny, M=17), "split4"),
                                    (dict(odd, M=17), "split3_64"),
                                    (dict(odd, M=17), "split4_t"),
                                    (dict(tiny, M=70), "split3_64")):
                    out.append((kernel, dict(shape, CAP=128), _proj_cfg(kernel, path), True,
                                None))
        for path in ("stream", "stream_k128"):
            for shape in (dict(tiny, M=1, CAP=128), dict(odd, M=1, CAP=128)):
                out.append(("llama_lm_head", shape, _proj_cfg("llama_lm_head", path), True,
                            None))
        for path, shape in (("tiles16", dict(tiny, M=3)), ("tiles16", dict(odd, M=17)),
                            ("tiles16_t", dict(odd, M=17)),
                            ("tiles64_k64", dict(tiny, M=70)),
                            ("tiles16_f", dict(tiny, M=3)), ("tiles16_f", dict(odd, M=17)),
                            ("tiles16_t_f", dict(odd, M=17)),
                            ("tiles64_k64_f", dict(tiny, M=70))):
            out.append(("llama_lm_head", dict(shape, CAP=128), _proj_cfg("llama_lm_head", path),
                        True, None))
        # keep_logits 0: the same tokens, the logits untouched, in every form of the head
        for path, m in (("gemv", 1), ("stream", 1), ("stream_k128", 1), ("rows4", 3),
                        ("tiles16", 17), ("tiles16_f", 17), ("tiles64_k64_f", 70)):
            out.append(("llama_lm_head", dict(odd, M=m, CAP=128, keep_logits=0),
                        _proj_cfg("llama_lm_head", path), True, None))
    else:  # every bucket's default config and the committed pack's (the tuner checks
        # every candidate at scale, at its bucket's representative shape only)
        for kernel in proj_kernels:
            spec = SPECS[kernel]
            configs = {c.name: c for i in range(len(spec.representatives))
                       for c in (spec.default_config(i), _chosen(kernel, i))}
            # and the LM head's flattened candidates, tuned or not (llama_spec.LM_FLAT)
            configs.update({c.name: c for c in spec.configs if c.constexprs.get("FLAT")})
            for config in configs.values():
                small = config.constexprs["BLOCK_M"] < 16
                for m in ((1, 3) if small else (3, 17, 70)):
                    out.append((kernel, dict(tiny, M=m, CAP=128), config, True, None))
                # Rows off 16-byte boundaries: the L2 prefetch's span rounding.
                out.append((kernel, dict(odd, M=1 if small else 17, CAP=128), config, True,
                            None))
                if kernel == "llama_lm_head":  # the logits untouched, the same tokens
                    out.append((kernel, dict(odd, M=1 if small else 17, CAP=128,
                                             keep_logits=0), config, True, None))
    # KV append at positions near and at CAP (the row at CAP is dropped), prefill rows.
    qkv = _proj_cfg("llama_qkv_rope", "rows4") if cpu else SPECS["llama_qkv_rope"].config(
        "p4_4_k256_w4_s3")

    def near_cap(args):
        args["pos"][:] = torch.tensor([127, 126, 128], dtype=torch.int32)[:args["M"]]
    out.append(("llama_qkv_rope", dict(tiny, M=3, CAP=128), qkv, True, near_cap))
    out.append(("llama_qkv_rope", dict(gqa4, M=17, CAP=128, prefill=True), qkv, True, None))
    lms = ([_proj_cfg("llama_lm_head", p) for p in ("gemv", "stream")] if cpu else
           [SPECS["llama_lm_head"].config(n) for n in ("p1_16_k512_w4_s3", "p1_64_k2048_w4_s4")])
    lm4 = _proj_cfg("llama_lm_head", "rows4") if cpu else SPECS["llama_lm_head"].config(
        "p4_4_k256_w4_s3")
    for lm in lms:
        out.append(("llama_lm_head", dict(tiny, M=1, clear_winner=False), lm, False, _lm_ties))
    out.append(("llama_lm_head", dict(tiny, M=3, clear_winner=False), lm4, False, _lm_ties))
    if cpu:  # ties across the tiles of one program (260 and 261 in one, 300 in the next)
        for path in ("tiles16", "tiles16_f"):
            out.append(("llama_lm_head", dict(tiny, M=3, clear_winner=False),
                        _proj_cfg("llama_lm_head", path), False, _lm_ties))
    # Decode attention: GQA groups 2 and 4; contexts of a few KV tiles (split 0 alone
    # writes out) and longer ones (partials and the combine: every split with work, some
    # idle, S odd, S = 1), rows of both kinds in one launch, S above the number of tiles.
    # And a config of two tiles switching at 128 positions (SHORT_CTX): the contexts
    # below on both sides of it, in one launch too (mixed).
    dec_cfgs = [SPECS["llama_attn_decode"].config(n) for n in
                (("n32_w4_s3",) if cpu else [c.name for c in SPECS["llama_attn_decode"].configs])]
    dec_cfgs.append(llama_spec._attn_decode_config(32, 4, 3, (128, 16, 2)) if cpu else
                    llama_spec._attn_decode_config(128, 4, 2, (128, 64, 3)))

    def mixed(args):  # one row of one tile, one at the direct limit, one split
        args["pos"][:] = torch.tensor([20, 127, 290], dtype=torch.int32)[:args["M"]]
    for config in dec_cfgs:
        for shape, tweak in ((dict(tiny, M=1, CAP=128, ctx=128), None),
                             (dict(tiny, M=3, CAP=128, ctx=100), None),
                             (dict(gqa4, M=2, CAP=128, ctx=128, S=1), None),
                             (dict(gqa4, M=3, CAP=128, ctx=77, S=3), None),
                             (dict(tiny, M=1, CAP=128, ctx=5, S=32), None),
                             (dict(gqa4, M=17, CAP=64, ctx=64), None),
                             (dict(tiny, M=1, CAP=640, ctx=640), None),
                             (dict(gqa4, M=2, CAP=320, ctx=300, S=5), None),
                             (dict(tiny, M=3, CAP=320, ctx=300, S=7), mixed),
                             (dict(gqa4, M=2, CAP=512, ctx=500, S=1), None),
                             # 8 q heads per kv head (two combine chunks of heads), more
                             # splits than one combine chunk reads (S above S_MAX).
                             (dict(tiny, NH=16, NKV=2, M=1, CAP=1200, ctx=1200, S=40),
                              None)):
            out.append(("llama_attn_decode", shape, config, True, tweak))
    pre_cfgs = [SPECS["llama_attn_prefill"].config(n) for n in
                (("m16_n32_w4_s3", "m64_n64_w4_s3") if cpu else
                 [c.name for c in SPECS["llama_attn_prefill"].configs])]
    for config in pre_cfgs:
        for shape in (dict(tiny, M=1, CAP=128, ctx=128), dict(tiny, M=17, CAP=128, ctx=40),
                      dict(gqa4, M=3, CAP=128, ctx=3), dict(gqa4, M=70, CAP=128, ctx=100)):
            out.append(("llama_attn_prefill", shape, config, shape["M"] != 70 or cpu is False,
                        None))
    return out


def spec_cases(buckets):
    """Every spec candidate of the projection kernels' M buckets `buckets`, at the tiny
    shapes with M at each bucket's lowest and highest value (the open last: its lowest)."""
    edges = llama_spec.M_EDGES
    out = []
    for name in ("llama_qkv_rope", "llama_o_proj", "llama_gate_up", "llama_down_proj",
                 "llama_lm_head"):
        spec = SPECS[name]
        for b in buckets:
            lo = edges[b - 1] + 1 if b > 0 else 1
            ms = sorted({lo, edges[b] if b < len(edges) else lo})
            for config in spec.configs:
                if spec.allowed(spec.representatives[b], config):
                    out += [(name, dict(lt.TINY, M=m, CAP=128), config, True, None) for m in ms]
    return out


def big_cases():
    """The Llama-3.2-1B representative of every bucket with the bucket's default config."""
    out = []
    for name, spec in SPECS.items():
        for number, shape in enumerate(spec.representatives):
            out.append((name, dict(shape), spec.default_config(number), number < 4, None))
    return out


# ----------------------------------------------------------------------------- timing

def _time_graph(fn, reps):
    """GPU µs per call of `fn` (launching one kernel) replayed from a CUDA graph of
    `reps` calls (the per-kernel cost inside a step graph)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(reps):
                fn(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / reps)
    return sorted(samples)[len(samples) // 2]


def copy_bandwidth():
    """Device-to-device copy bandwidth (read + write bytes per second), 1 GiB."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = None
    for _ in range(10):
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        t = start.elapsed_time(end) / 1000.0
        best = t if best is None else min(best, t)
    return 2 * n / best


@functools.cache
def _committed_choices():
    """{kernel: the chosen config name of each bucket} of the committed pack's tuning.json
    (half a megabyte: read once), empty without one."""
    path = REPO / "kernels" / "llamapack" / "tuning.json"
    if not path.is_file():
        return {}
    return {k["name"]: [b["chosen"] for b in k["buckets"]]
            for k in json.loads(path.read_text())["kernels"]}


def _chosen(name, bucket):
    """The config the committed pack uses for `bucket` (tuning.json), else the default."""
    spec = SPECS[name]
    choices = _committed_choices().get(name)
    return spec.config(choices[bucket]) if choices else spec.default_config(bucket)


def _rotations(nbytes):
    """How many copies of an `nbytes` operand one timing graph cycles through, so that
    what it reads comes from memory, not L2 (50 MB): at least 256 MB in all."""
    return min(512, max(2, -(-(256 << 20) // max(nbytes, 1))))


def copy_us(nbytes):
    """µs per device-to-device copy moving `nbytes` in all (nbytes / 2 read, as many
    written), timed as the kernels are: back-to-back in a CUDA graph, source and
    destination rotated beyond L2. A small copy does not reach the 1 GiB copy's
    bandwidth either: this is what moving that many bytes costs in a graph."""
    half = max(16, nbytes // 2 // 16 * 16)
    copies = _rotations(half)
    src = torch.empty(copies * half, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def run(i=0):
        j = i % copies
        dst[j * half:(j + 1) * half].copy_(src[j * half:(j + 1) * half])
    us = _time_graph(run, 2 * copies)
    del src, dst
    return us


def _proj_bytes(name, model, m=1):
    """(weight bytes, all bytes moved) of a projection at M rows: weights plus the
    activations read and written."""
    h, nh, nkv, d, inter, v = (model[k] for k in ("H", "NH", "NKV", "D", "I", "V"))
    weights = {"llama_qkv_rope": (nh + 2 * nkv) * d * h * 2, "llama_o_proj": h * nh * d * 2,
               "llama_gate_up": 2 * inter * h * 2, "llama_down_proj": h * inter * 2,
               "llama_lm_head": v * h * 2}[name]
    activations = {"llama_qkv_rope": 4 * h + 2 * (nh + 2 * nkv) * d,
                   "llama_o_proj": 2 * nh * d + 8 * h, "llama_gate_up": 4 * h + 2 * inter,
                   "llama_down_proj": 2 * inter + 8 * h, "llama_lm_head": 4 * h + 4 * v}[name]
    return weights, weights + m * activations


def bench(pdl, out_json=None, chosen_only=False, batch_sizes=(1,)):
    model = dict(lt.LLAMA_1B)
    bw = copy_bandwidth()
    print(f"\ndevice-to-device copy: {bw / 1e12:.3f} TB/s (read + write, 1 GiB)")
    rows, attn_rows = [], []
    for m in batch_sizes:
        _bench_projections(model, m, bw, pdl, chosen_only or m > 1, rows)
    _bench_attention(model, bw, pdl, attn_rows)
    if out_json:
        Path(out_json).write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "copy_bytes_per_s": bw, "pdl": pdl,
             "projections": rows, "attn_decode": attn_rows}, indent=2) + "\n")


def _bench_projections(model, m, bw, pdl, chosen_only, rows):
    """Time each projection at `m` rows (the bucket's committed config; every candidate
    of the bucket unless `chosen_only`); append the rows to `rows`."""
    bucket = llama_spec._bucket(m)
    print(f"\nprojections at M = {m} (Llama-3.2-1B): µs per kernel inside a CUDA graph of "
          f"back-to-back launches{' with PDL' if pdl else ''}, weights rotated over copies "
          f"larger than L2; GB/s and % of the 1 GiB copy for the bytes moved (weights and "
          f"activations); 'copy µs': a device-to-device copy moving as many bytes in the "
          f"same kind of graph, '% cp' the kernel's speed relative to it (the reachable "
          f"ceiling at this size); 'L2-hot µs': the same weights every launch (what is left "
          f"when they come from L2: latency and the kernel boundary)")
    print(f"{'kernel':18} {'config':20} {'MB':>7} {'µs':>8} {'GB/s':>7} {'% copy':>7} "
          f"{'copy µs':>8} {'% cp':>6} {'L2-hot µs':>10}")
    same_copy = {}
    for name in ("llama_qkv_rope", "llama_o_proj", "llama_gate_up", "llama_down_proj",
                 "llama_lm_head"):
        spec = SPECS[name]
        nbytes, moved = _proj_bytes(name, model, m)
        same_copy[name] = copy_us(moved)
        shape = dict(model, M=m, CAP=4096)
        base = lt.make_inputs(name, shape, "cuda")
        copies = _rotations(nbytes)
        weights = [base["w"]] + [base["w"].clone() for _ in range(copies - 1)]
        chosen = _chosen(name, bucket)
        others = [] if chosen_only else [c for c in spec.configs if spec.allowed(
            shape, c) and c.name != chosen.name]
        for config in [chosen] + others:
            grid = spec.grid_for(base, config)

            def run(i=0, config=config, grid=grid):
                launch(name, {**base, "w": weights[i % copies]}, config, grid, pdl)

            def hot(i=0, config=config, grid=grid):
                launch(name, base, config, grid, pdl)
            try:
                us = _time_graph(run, 2 * copies)
                hot_us = _time_graph(hot, 2 * copies)
            except Exception as err:  # noqa: BLE001 - report and go on
                print(f"{name:18} {config.name:20} failed: {type(err).__name__}: {err}")
                continue
            gbs = moved / us / 1e3
            rows.append({"M": m, "kernel": name, "config": config.name, "us": us, "GB/s": gbs,
                         "pct_copy": 100 * gbs * 1e9 / bw, "bytes": moved,
                         "copy_us": same_copy[name],
                         "pct_same_copy": 100 * same_copy[name] / us, "l2_hot_us": hot_us})
            print(f"{name:18} {config.name:20} {nbytes / 1e6:7.1f} {us:8.2f} {gbs:7.0f} "
                  f"{100 * gbs * 1e9 / bw:6.1f}% {same_copy[name]:8.2f} "
                  f"{100 * same_copy[name] / us:5.1f}% {hot_us:10.2f}", flush=True)
        del weights, base


def _bench_attention(model, bw, pdl, attn_rows):
    """Time decode attention at the grid's batch sizes and contexts into `attn_rows`."""
    print("\ndecode attention (Llama-3.2-1B heads): bytes = K and V read; the caches rotated "
          "over copies larger than L2 ('L2-hot µs': one cache); 'copy µs' and '% cp' as above")
    print(f"{'M':>3} {'ctx':>6} {'S':>3} {'config':12} {'µs':>8} {'GB/s':>7} {'% copy':>7} "
          f"{'copy µs':>8} {'% cp':>6} {'L2-hot µs':>10}")
    spec = SPECS["llama_attn_decode"]
    for m in (1, 4, 16, 64):
        for ctx in (128, 512, 1024, 4096, 8192):
            shape = dict(model, M=m, CAP=ctx, ctx=ctx)
            args = lt.make_inputs("llama_attn_decode", shape, "cuda")
            args["pos"][:] = ctx - 1
            moved = m * model["NKV"] * ctx * 64 * 2 * 2
            copies = _rotations(moved)
            caches = [(args["k_cache"], args["v_cache"])] + [
                (args["k_cache"].clone(), args["v_cache"].clone()) for _ in range(copies - 1)]
            config = _chosen("llama_attn_decode", llama_spec._bucket(m))
            grid = spec.grid_for(args, config)

            def run(i=0, config=config, grid=grid):
                k, v = caches[i % copies]
                launch("llama_attn_decode", {**args, "k_cache": k, "v_cache": v}, config,
                       grid, pdl)
            try:
                us = _time_graph(run, max(20, copies))
                hot_us = _time_graph(
                    lambda i=0: launch("llama_attn_decode", args, config, grid, pdl), 20)
                cp_us = copy_us(moved)
            except Exception as err:  # noqa: BLE001 - report and go on
                print(f"{m:3} {ctx:6} failed: {type(err).__name__}: {err}")
                continue
            gbs = moved / us / 1e3
            attn_rows.append({"M": m, "ctx": ctx, "S": args["S"], "config": config.name,
                              "us": us, "GB/s": gbs, "pct_copy": 100 * gbs * 1e9 / bw,
                              "copy_us": cp_us, "pct_same_copy": 100 * cp_us / us,
                              "l2_hot_us": hot_us})
            print(f"{m:3} {ctx:6} {args['S']:3} {config.name:12} {us:8.2f} {gbs:7.0f} "
                  f"{100 * gbs * 1e9 / bw:6.1f}% {cp_us:8.2f} {100 * cp_us / us:5.1f}% "
                  f"{hot_us:10.2f}", flush=True)
            del args, caches


def main():
    args = ARGS
    pdl = args.device == "cuda" and not args.no_pdl
    if args.device == "cpu":
        interpreter_fixes()
    elif not torch.cuda.is_available():
        unavailable("--device cuda needs a CUDA GPU; torch sees none")
    only = set(filter(None, args.only.split(",")))
    t0 = time.time()
    if not args.bench_only:
        buckets = [int(b) for b in args.spec_buckets.split(",") if b]
        todo = (cases(args.device) + (big_cases() if args.device == "cuda" else [])
                + spec_cases(buckets))
        todo = [c for c in todo if not only or c[0] in only]
        print(f"{len(todo)} cases on {args.device}" + (" (interpreter)" if args.device == "cpu" else ""))
        for name, shape, config, padded, tweak in todo:
            try:
                check_case(name, shape, config, args.device, pdl, padded, tweak)
            except Exception as err:  # noqa: BLE001 - one broken case must not hide the rest
                _fail(f"{name} {config.name} {shape}", f"{type(err).__name__}: {err}")
        print(f"\n{len(todo) - len(FAILURES)} of {len(todo)} cases passed "
              f"({time.time() - t0:.0f}s)")
    if args.device == "cuda" and not args.no_bench:
        bench(pdl, args.json, args.bench_chosen,
              [int(m) for m in args.bench_m.split(",") if m])
    if FAILURES:
        print("\nFAILURES:\n" + "\n".join(FAILURES))
        sys.exit(1)


if __name__ == "__main__":
    main()
