"""Build spec of the Llama decode engine's pack (``kernels/llamapack``; docs/llama.md).

::

    PYTHONPATH=tools python3 -m kpack_tools.build kernels/llama/llama_spec.py \\
        --out kernels/llamapack [--no-tune]

Every kernel is bucketed on ``M`` (the rows of a step: the batch in decode, the prompt
length in prefill) with edges ``[1, 4, 16, 64, 256]``, tuned per bucket at the
Llama-3.2-1B shapes from a short candidate list per bucket (each candidate costs a JIT
compile on the tuning GPU), checked against the torch math of the contract
(``llama_torch.py``). Every kernel masks all it touches by its size arguments, so all are
``grid_tolerant`` (proven on the GPU at build). Each has the generic variant and one
``aligned`` variant (pointers and the sizes that are multiples of 16 in the real model).
All are compiled with ``USE_PDL`` on and Triton's ``launch_pdl``: kpack launches them
with programmatic stream serialization; without it they are equally correct.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import llama_kernels as lk  # noqa: E402
from kpack_tools.spec import Bucket, Config, KernelSpec, Specialization  # noqa: E402

M_EDGES = [1, 4, 16, 64, 256]
HEAD_DIM = 64
MODEL = {"H": 2048, "NH": 32, "NKV": 8, "D": HEAD_DIM, "I": 8192, "V": 128256}
# One M per bucket: 1, 2-4, 5-16, 17-64, 65-256, 257+.
BUCKET_M = [1, 4, 16, 64, 256, 1024]
PDL = {"constants": {"USE_PDL": True}, "options": {"launch_pdl": True}}


def _bucket(m):
    return next((i for i, edge in enumerate(M_EDGES) if m <= edge), len(M_EDGES))


def _config(name, warps, stages, **blocks):
    """A config; the projection kernels' K loop takes its pipelining depth as the
    constexpr STAGES (Triton pipelines a loop without tl.dot only when told), and their
    tl.dot's operand order as SWAP (0 unless given: x · wᵀ)."""
    if name.startswith("p"):
        blocks["STAGES"] = stages
        blocks.setdefault("SWAP", 0)
    return Config(name, blocks, num_warps=warps, num_stages=stages)


def _proj_configs(n_name, split=False):
    """Projection candidates, BLOCK_N named `n_name` (BLOCK_J for the QKV pairs). Names:
    p<M>_<n>_k<K>_w<warps>_s<stages>; BLOCK_M 1 and < 16 multiply-add without tl.dot.
    With `split` (the o and down projections), every config sets SPLIT: 1, and the
    SPLIT_K configs split K over SPLIT programs (names ending _x<SPLIT>). The SWAPPED
    (and, with `split`, SWAPPED_SPLIT_K) tiles compute tl.dot as w · xᵀ (SWAP: 1, names
    ending _t)."""
    table = [  # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
        # M = 1: whole 2048-wide rows in one tile (loaded before gdc_wait, no K loop) ...
        (1, 1, 8192, 4, 1), (1, 2, 2048, 4, 1), (1, 4, 2048, 4, 1), (1, 4, 2048, 8, 1),
        (1, 8, 2048, 4, 1), (1, 8, 2048, 8, 1), (1, 16, 2048, 8, 1),
        # ... or a first tile and a pipelined K loop
        (1, 2, 2048, 4, 2), (1, 2, 4096, 4, 2), (1, 4, 1024, 4, 2), (1, 8, 1024, 8, 2),
        (1, 4, 2048, 4, 3),
        (1, 16, 1024, 4, 2), (1, 4, 512, 4, 3), (1, 8, 256, 4, 4), (1, 8, 512, 8, 3),
        (1, 16, 512, 4, 3),
        # ... or other widths and warp counts per program (those timed inside the step
        # graph: bench/llama_results/variant_sweeps_s5.md)
        (1, 1, 2048, 4, 1), (1, 1, 2048, 2, 1), (1, 2, 2048, 2, 1), (1, 4, 2048, 2, 1),
        (1, 1, 8192, 8, 1), (1, 2, 8192, 8, 1), (1, 1, 8192, 16, 1), (1, 2, 8192, 16, 1),
        (1, 1, 8192, 32, 1),
        (1, 1, 2048, 8, 1), (1, 2, 2048, 8, 1),
        # the LM head streaming 4-row tiles of 2048 through a pipelined loop
        (1, 32, 2048, 4, 4), (1, 64, 2048, 4, 4), (1, 128, 2048, 4, 4),
        (1, 256, 2048, 4, 4), (1, 128, 2048, 8, 4), (1, 256, 2048, 8, 4),
        (1, 128, 2048, 8, 3), (1, 64, 2048, 8, 4), (1, 512, 2048, 8, 4),
        (1, 256, 2048, 16, 4),
        # 2-15 rows: the products kept per k ([BLOCK_M, BLOCK_N, BLOCK_K]), whole rows or
        # a K loop
        (4, 2, 2048, 4, 1), (4, 4, 2048, 4, 1), (4, 4, 2048, 8, 1), (4, 8, 2048, 8, 1),
        (4, 1, 8192, 4, 1), (4, 2, 4096, 4, 2),
        (4, 4, 256, 4, 3), (4, 8, 128, 4, 3), (4, 4, 512, 8, 2), (8, 4, 256, 8, 3),
        (16, 16, 128, 4, 4), (16, 32, 128, 4, 4), (16, 64, 64, 4, 4),
        (32, 32, 128, 4, 3), (64, 32, 128, 4, 3), (64, 64, 64, 4, 4),
        # plain GEMMs over llama_rmsnorm's rows (QKV, gate/up, LM head above one row)
        (16, 16, 256, 4, 3), (16, 32, 256, 4, 3), (16, 64, 128, 4, 3), (64, 16, 128, 4, 3),
        (64, 128, 64, 4, 4),
        (64, 64, 64, 8, 3), (128, 64, 64, 8, 3), (64, 128, 64, 8, 3),
        # the LM head above one row: a program's vocabulary rows in tl.dot tiles of
        # _LM_TILE elements (64 rows at BLOCK_K 128, 128 at 64)
        (16, 512, 128, 4, 4), (16, 256, 128, 4, 4), (64, 512, 64, 4, 4), (64, 256, 64, 4, 4),
        # deeper K pipelines (and wider K tiles) of the tuned tiles above one row, timed
        # inside the step graph on the H200 (session 18, bench/llama_results/stages_s18.md;
        # the pins below)
        (4, 4, 256, 4, 4), (4, 4, 256, 4, 5), (16, 32, 256, 4, 4), (16, 32, 128, 4, 6),
        (64, 16, 128, 4, 4), (64, 16, 128, 4, 6), (64, 16, 256, 4, 3), (64, 16, 128, 8, 4),
        (64, 16, 64, 4, 6), (64, 64, 64, 4, 6), (64, 64, 128, 4, 3),
        (64, 512, 64, 4, 6), (64, 512, 128, 4, 4), (64, 256, 64, 4, 6), (64, 512, 64, 8, 4),
    ]
    configs = [_config(f"p{m}_{n}_k{k}_w{w}_s{s}", w, s, BLOCK_M=m, **{n_name: n}, BLOCK_K=k,
                       **({"SPLIT": 1} if split else {}))
               for m, n, k, w, s in table]
    configs += [_config(f"p{m}_{n}_k{k}_w{w}_s{s}_t", w, s, BLOCK_M=m, **{n_name: n},
                        BLOCK_K=k, SWAP=1, **({"SPLIT": 1} if split else {}))
                for m, n, k, w, s in SWAPPED]
    if split:
        configs += [_config(f"p{m}_{n}_k{k}_w{w}_s{s}_x{x}{'_t' * t}", w, s, BLOCK_M=m,
                            **{n_name: n}, BLOCK_K=k, SPLIT=x, SWAP=t)
                    for t, table in ((0, SPLIT_K), (1, SWAPPED_SPLIT_K))
                    for m, n, k, w, s, x in table]
    return configs


# The o and down projections' K split over SPLIT programs above one row (a 2048-wide output
# in 16- to 64-wide tiles is 32-128 programs for 132 SMs; split, each program streams a
# part of K and the last one of a tile adds the parts: llama_proj_residual). (BLOCK_M,
# BLOCK_N, BLOCK_K, warps, stages, SPLIT): the fastest of a probe of split-K GEMMs at 4, 16
# and 64 rows on the H200 (2026-12-02, bench/llama_results/split_k_probe_s8.md; down at 16
# rows: 13.7 µs split in 4, 20.2 unsplit), used at M <= SPLIT_MAX_ROWS only (the engines
# size the partials buffer for that: docs/llama.md).
SPLIT_K = [(16, 64, 128, 4, 4, 4), (16, 32, 128, 4, 4, 4), (16, 64, 128, 4, 6, 4),
           (16, 32, 128, 4, 6, 2), (64, 32, 128, 4, 3, 2), (64, 32, 128, 4, 3, 4),
           (64, 64, 128, 4, 6, 4), (64, 64, 128, 4, 4, 4), (64, 64, 128, 4, 6, 2),
           (64, 64, 128, 4, 4, 8),
           # deeper, or over more warps, at 17-64 rows: timed inside the step graph
           # (session 19; the pins below)
           (64, 32, 128, 4, 6, 2), (64, 64, 128, 8, 4, 4)]
# tl.dot as w · xᵀ ("swap AB": the weight rows are the MMA's M side, 64 or more of them
# the H100/H200 warpgroup MMA's, and the 4-64 rows of x its narrow N side, instead of x's
# rows padded to an M of 16 or 64). Session 8's probe of plain GEMMs at these shapes
# (bench/llama_results/split_k_probe_s8.md) had it fastest unsplit at 4 and 16 rows for
# QKV, o, gate/up and the LM head, and split for down. (BLOCK_M, BLOCK_N, BLOCK_K, warps,
# stages); the LM head's BLOCK_N 256-512 are programs of _LM_TILE-element tiles.
SWAPPED = [(16, 16, 128, 4, 4), (16, 32, 128, 4, 4), (16, 32, 128, 4, 6), (16, 64, 128, 4, 4),
           (16, 64, 128, 4, 6), (16, 64, 64, 4, 4), (16, 512, 128, 4, 4),
           (16, 256, 128, 4, 4), (32, 32, 128, 4, 4), (32, 64, 128, 4, 4),
           (64, 32, 128, 4, 4), (64, 64, 64, 4, 4), (64, 512, 64, 4, 4),
           (64, 512, 128, 4, 4), (64, 16, 128, 4, 4), (16, 512, 128, 4, 6)]
SWAPPED_SPLIT_K = [(16, 64, 256, 4, 3, 4), (16, 64, 128, 4, 4, 4), (16, 32, 128, 4, 4, 4),
                   (64, 64, 128, 4, 4, 4), (32, 64, 128, 4, 4, 2), (32, 64, 128, 4, 4, 4),
                   (16, 64, 128, 4, 6, 4)]
SPLIT_MAX = 8
SPLIT_MAX_ROWS = 64
# The engines' counters: one per (rows, columns) tile at M <= SPLIT_MAX_ROWS, tiles of at
# least 16 rows and 32 columns.
assert all(x <= SPLIT_MAX and m >= 16 and n >= 32
           for m, n, k, w, s, x in SPLIT_K + SWAPPED_SPLIT_K)


def _candidate_cap():
    """LLAMA_SPEC_CANDIDATES=N tunes only the first N candidates of each bucket's list
    (the lists run from the most promising down; each candidate costs a JIT compile and
    its timing on the tuning GPU); unset, all of them."""
    text = os.environ.get("LLAMA_SPEC_CANDIDATES", "")
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"LLAMA_SPEC_CANDIDATES must be a positive integer, not {text!r}")
    return int(text)


def _candidates(per_bucket):
    """(default per bucket, config_allowed) from one list of candidate names per bucket,
    the first being the bucket's default; LLAMA_SPEC_CANDIDATES keeps each list's head."""
    cap = _candidate_cap()
    if cap is not None:
        per_bucket = [names[:cap] for names in per_bucket]

    def allowed(shape, config):
        return config.name in per_bucket[_bucket(shape["M"])]
    return [names[0] for names in per_bucket], allowed


# M = 1 (a GEMV per kernel, each with its own list): the first K tile of a program's rows
# is loaded into registers before gdc_wait, so whole 2048-wide rows (one tile, 128-256
# bytes per thread in flight at once) let a kernel's weights stream while the kernel
# before it ends; the K loop's configs of the first tuning stay as the baseline. Defaults
# at Llama-3.2-1B shapes (registers from the sm_90a SASS): QKV 4 pairs x 2 halves = 8 rows,
# 384 programs, 182 registers: 2 per SM, 1.45 waves (so are the other QKV tiles); o 4
# rows, 512 programs, 92 registers: 5 per SM, one wave; gate/up 4 + 4 rows, 2048 programs,
# 168 registers: 3 per SM. Down's and the LM head's bucket is pinned (_PINS below).
_M1 = {  # each list: the default, the first H200 tuning's winner, then the others
    "llama_qkv_rope": ["p1_4_k2048_w4_s1", "p1_8_k256_w4_s4", "p1_2_k2048_w4_s1",
                       "p1_4_k2048_w8_s1", "p1_4_k1024_w4_s2"],
    "llama_o_proj": ["p1_4_k2048_w4_s1", "p1_8_k256_w4_s4", "p1_2_k2048_w4_s1",
                     "p1_8_k2048_w8_s1", "p1_4_k512_w4_s3"],
    "llama_gate_up": ["p1_4_k2048_w4_s1", "p1_8_k256_w4_s4", "p1_2_k2048_w4_s1",
                      "p1_4_k2048_w8_s1", "p1_8_k1024_w8_s2"],
    "llama_down_proj": ["p1_4_k2048_w4_s3", "p1_4_k512_w4_s3", "p1_2_k4096_w4_s2",
                        "p1_1_k8192_w4_s1", "p1_8_k512_w8_s3"],
    "llama_lm_head": ["p1_64_k2048_w4_s4", "p1_16_k512_w4_s3", "p1_32_k2048_w4_s4",
                      "p1_128_k2048_w4_s4", "p1_8_k2048_w4_s1"],
}
# M = 2-4 of the o and down projections (QKV, gate/up and the LM head: _XN below): BLOCK_M
# 4 multiplies and adds elementwise on [4, BLOCK_N, BLOCK_K] tiles (one reduction over K
# at the end), BLOCK_M 16 is tl.dot with 12 of its rows masked. Each list: the first
# tuning's winner, the tl.dot tile that won 5-16, then the others (o's bucket is pinned:
# _PINS below). Split K (_SPLIT_FIRST) and the swapped tiles
# (_SWAP_CANDIDATES) join both lists, and the H200 tuning of 2026-12-03 chose from all of
# them (_TUNED). A GEMV per row (each row's tile times a weight tile shared by the
# rows) lost to both, twice: 2026-12-01, and 2026-12-02 without spills
# (bench/llama_results/m4_rows_gemv_s7.md); o over whole rows that way (BLOCK_K 2048)
# won inside the step graph in 2026-12-04, with decode attention triggering it early
# (_PINS).
_M4 = {
    "llama_o_proj": ["p4_8_k128_w4_s3", "p16_16_k128_w4_s4", "p4_4_k2048_w4_s1",
                     "p4_4_k256_w4_s3", "p16_32_k128_w4_s4", "p4_2_k2048_w4_s1"],
    "llama_down_proj": ["p4_4_k256_w4_s3", "p16_16_k128_w4_s4", "p4_1_k8192_w4_s1",
                        "p4_4_k512_w8_s2", "p4_8_k128_w4_s3", "p16_32_k128_w4_s4"],
}
# Buckets 2-4, 5-16 and 17-64 of the kernels that read llama_rmsnorm's bf16 rows above one
# row (QKV, gate/up, the LM head: plain GEMMs there since 2026-12-02). Each list held first
# the config of the fastest plain GEMM of the kernel's weight shape timed on the H200
# (bench/llama_results/prenorm_probe_s7.md; QKV's BLOCK_J and gate/up's BLOCK_N are half
# the GEMM's BLOCK_N: a program owns row pairs, or gate and up rows), then the runners-up
# and the earlier normalizing kernels' winners; the H200 tuning's winners (_TUNED)
# lead now. The LM head's programs of 512 vocabulary rows take them in tiles of the
# probe's fastest width (session 8: 251 programs, not 4008, reduce their argmax partials;
# bench/llama_results/split_k_probe_s8.md). Normalizing inside these kernels at 2-4 rows
# instead (no llama_rmsnorm launches: the rows' rstd scaling the products at the end) was
# 110 µs per batch-4 step slower on the H200 (2026-12-02,
# bench/llama_results/norm_rows_s10.md); with the rows times the norm weight and their
# sums of squares written by the kernel before (the K loops unchanged), 4 µs faster at
# batch 4 and 3-34 slower at 16 and 64 (2026-12-04, bench/llama_results/norm_fold_s22.md).
_XN = {
    "llama_qkv_rope": [
        ["p16_16_k128_w4_s4", "p4_4_k256_w4_s3", "p16_32_k128_w4_s4", "p16_16_k256_w4_s3"],
        ["p16_16_k256_w4_s3", "p16_16_k128_w4_s4", "p16_32_k128_w4_s4", "p16_32_k256_w4_s3"],
        ["p64_16_k128_w4_s3", "p64_32_k128_w4_s3", "p16_16_k128_w4_s4", "p16_32_k128_w4_s4"],
    ],
    "llama_gate_up": [
        ["p16_16_k128_w4_s4", "p16_32_k128_w4_s4", "p16_64_k64_w4_s4", "p16_16_k256_w4_s3"],
        ["p16_32_k128_w4_s4", "p16_16_k128_w4_s4", "p16_64_k64_w4_s4", "p16_16_k256_w4_s3"],
        ["p64_64_k64_w4_s4", "p64_16_k128_w4_s3", "p64_32_k128_w4_s3", "p64_64_k64_w8_s3"],
    ],
    "llama_lm_head": [  # led by programs of 512 rows in tiles (session 8, not tuned)
        ["p16_512_k128_w4_s4", "p16_256_k128_w4_s4", "p16_32_k128_w4_s4", "p16_64_k64_w4_s4",
         "p16_64_k128_w4_s3"],
        ["p16_512_k128_w4_s4", "p16_256_k128_w4_s4", "p16_64_k128_w4_s3", "p16_32_k128_w4_s4",
         "p16_64_k64_w4_s4", "p16_32_k256_w4_s3"],
        ["p64_512_k64_w4_s4", "p64_256_k64_w4_s4", "p64_128_k64_w8_s3", "p64_64_k64_w4_s4",
         "p64_128_k64_w4_s4"],
    ],
}
# M > 4: tl.dot tiles growing with M, with narrow ones among them so that the 2048-row
# projections (o, down, QKV's 1536 pairs) still spread over all 132 SMs.
PROJ_BUCKETS = [
    ["p16_16_k128_w4_s4", "p8_4_k256_w8_s3", "p16_32_k128_w4_s4", "p16_64_k64_w4_s4"],
    ["p64_32_k128_w4_s3", "p16_32_k128_w4_s4", "p16_16_k128_w4_s4", "p32_32_k128_w4_s3",
     "p64_64_k64_w4_s4"],
    ["p64_64_k64_w4_s4", "p64_64_k64_w8_s3", "p128_64_k64_w8_s3", "p64_32_k128_w4_s3"],
    ["p128_64_k64_w8_s3", "p64_64_k64_w8_s3", "p64_64_k64_w4_s4"],
]
# o/down and the LM head read one row set: BLOCK_N up to 128 in the prefill buckets.
PROJ1_BUCKETS = PROJ_BUCKETS[:2] + [PROJ_BUCKETS[2] + ["p64_128_k64_w8_s3"],
                                    PROJ_BUCKETS[3] + ["p64_128_k64_w8_s3"]]


def _winner_first(lists, winners):
    """Each bucket's candidate list with that bucket's winner moved to the front."""
    out = []
    for names, winner in zip(lists, winners):
        assert winner in names, (winner, names)
        out.append([winner] + [n for n in names if n != winner])
    return out


# Buckets 2-4, 5-16 and 17-64 of the o and down projections: split K first (the probe's
# fastest at 4, 16 and 64 rows, then its runner-up), the unsplit lists after them.
_SPLIT_FIRST = {
    "llama_o_proj": [["p16_64_k128_w4_s4_x4", "p16_64_k128_w4_s6_x4"],
                     ["p16_64_k128_w4_s4_x4", "p16_64_k128_w4_s6_x4"],
                     ["p64_32_k128_w4_s3_x2", "p64_32_k128_w4_s3_x4"]],
    "llama_down_proj": [["p16_32_k128_w4_s4_x4", "p16_64_k128_w4_s4_x4"],
                        ["p16_64_k128_w4_s6_x4", "p16_32_k128_w4_s4_x4"],
                        ["p64_64_k128_w4_s6_x4", "p64_64_k128_w4_s4_x4"]],
}


# Buckets 2-4, 5-16 and 17-64: the swapped tiles (SWAPPED) each projection's tuning tries
# besides the lists above.
_SWAP_CANDIDATES = {
    "llama_qkv_rope": [["p16_32_k128_w4_s6_t", "p16_16_k128_w4_s4_t", "p16_64_k64_w4_s4_t"],
                       ["p16_32_k128_w4_s6_t", "p16_16_k128_w4_s4_t", "p16_64_k64_w4_s4_t"],
                       ["p32_32_k128_w4_s4_t", "p64_32_k128_w4_s4_t", "p16_32_k128_w4_s4_t"]],
    "llama_o_proj": [["p16_64_k256_w4_s3_x4_t", "p16_64_k128_w4_s6_t", "p16_64_k128_w4_s4_x4_t"],
                     ["p16_64_k256_w4_s3_x4_t", "p16_64_k128_w4_s6_t", "p16_64_k128_w4_s4_x4_t"],
                     ["p64_64_k128_w4_s4_x4_t", "p32_64_k128_w4_s4_x2_t", "p32_64_k128_w4_s4_t"]],
    "llama_gate_up": [["p16_32_k128_w4_s4_t", "p16_64_k128_w4_s4_t", "p16_64_k64_w4_s4_t"],
                      ["p16_32_k128_w4_s4_t", "p16_64_k128_w4_s4_t", "p16_64_k64_w4_s4_t"],
                      ["p64_64_k64_w4_s4_t", "p32_64_k128_w4_s4_t", "p64_32_k128_w4_s4_t"]],
    "llama_down_proj": [["p16_64_k256_w4_s3_x4_t", "p16_64_k128_w4_s4_x4_t",
                         "p16_32_k128_w4_s4_x4_t"],
                        ["p16_64_k256_w4_s3_x4_t", "p16_64_k128_w4_s4_x4_t",
                         "p16_32_k128_w4_s4_x4_t"],
                        ["p64_64_k128_w4_s4_x4_t", "p32_64_k128_w4_s4_x4_t",
                         "p32_64_k128_w4_s4_x2_t"]],
    "llama_lm_head": [["p16_512_k128_w4_s4_t", "p16_256_k128_w4_s4_t"],
                      ["p16_512_k128_w4_s4_t", "p16_256_k128_w4_s4_t"],
                      ["p64_512_k64_w4_s4_t", "p64_512_k128_w4_s4_t"]],
}


# H200 tunings' winners of buckets 2-4, 5-16, 17-64, 65-256 and 257+: each bucket's
# default, so that a build without tuning starts from them (what a pack runs is its
# tuning.json's choice). Buckets 65-256 and 257+: the first tuning's (the committed pack's
# but for QKV's, retuned since); 2-4, 5-16 and 17-64: the first tuning of those buckets,
# with the swapped tiles among the candidates (2026-12-03, session 13; before it they were
# built from each list's head, untuned: batch 4's step 9% faster, 16's 4%,
# bench/RESULTS.md), the committed pack's.
_TUNED = {
    "llama_qkv_rope": ["p4_4_k256_w4_s3", "p16_32_k256_w4_s3", "p64_16_k128_w4_s3",
                       "p64_32_k128_w4_s3", "p64_64_k64_w8_s3"],
    "llama_o_proj": ["p16_64_k128_w4_s4_x4_t", "p16_64_k128_w4_s4_x4", "p64_32_k128_w4_s3_x2",
                     "p64_64_k64_w8_s3", "p128_64_k64_w8_s3"],
    "llama_gate_up": ["p16_64_k128_w4_s4_t", "p16_64_k128_w4_s4_t", "p64_64_k64_w4_s4",
                      "p128_64_k64_w8_s3", "p128_64_k64_w8_s3"],
    "llama_down_proj": ["p16_64_k128_w4_s4_x4_t", "p16_64_k128_w4_s4_x4_t",
                        "p64_64_k128_w4_s4_x4", "p64_32_k128_w4_s3", "p128_64_k64_w8_s3"],
    "llama_lm_head": ["p16_512_k128_w4_s4_t", "p16_512_k128_w4_s4_t", "p64_512_k64_w4_s4",
                      "p64_128_k64_w8_s3", "p64_128_k64_w8_s3"],
}


# Buckets pinned to one config, {kernel: {bucket: config}}: chosen by the step time of the
# whole decode step graph (bench/llama_variant_sweep.py: the committed pack with one
# kernel's variant swapped in, the Llama protocol timed on the H200, every variant twice
# against the unswapped pack in one process), which a tuner timing one kernel alone cannot
# see (how a kernel's programs overlap the one before it under PDL). A pin replaces its
# bucket's whole list, so a later tuning keeps it; the lists above stay the record of what
# the tuner chose from. µs per step against the pack of the day:
# - 2026-12-02 (bench/RESULTS.md): down at M = 1, one 8192-wide row per program over 16
#   warps (the tuner's pick had 4), -7.2; the LM head at M = 1, 256 rows per program over
#   8 warps (the tuner's: 128 over 4), -5.6; both -13.3; o at M = 2-4 (batch 4), the
#   [4, 4, 256] multiply-add tile (the tuner's: tl.dot over 16 rows), -11.9. The other
#   variants timed (every kernel at M = 1, the five projections at 2-4) were slower, or
#   within 1 µs (the LM head's 512 rows).
# - 2026-12-03 (session 14, bench/llama_results/sweep_s14.md): o at M = 2-4 kept (session
#   13's tuning had chosen the swapped split-K tile, 6.8 µs alone against 7.5, but 3.6 µs
#   per batch-4 step slower in the graph); decode attention at M = 5-16, 64 positions per
#   tile (the tuner's pick at context 1024 had 128), -8.1 per batch-16 step.
# - 2026-12-04 (session 17, bench/llama_results/rows_gemv_s17.md): o at M = 2-4 as a GEMV
#   per row over whole 2048-wide weight rows (p4_4_k2048_w4_s1: _project_rows), read
#   before gdc_wait while decode attention, now triggering early where a row's context is
#   one split, runs: -33.8 per batch-4 step (the protocol), -34.7 at context 128; the
#   [4, 4, 256] multiply-add tile it replaces had been -11.9 (2026-12-02, above).
# - 2026-12-04 (session 18, bench/llama_results/stages_s18.md): the tuned tiles with deeper
#   K pipelines (the tuner had no such candidates): at M = 17-64 QKV's 6 stages (3 before)
#   -46.1, gate/up's 6 (4) -11.5, the LM head's 6 (4) -12.2 per batch-64 step, together
#   -41 to -71 in the batch-64 grid cells (128 to 8K, paired); QKV at M = 2-4 4 stages (3)
#   -5.4 per batch-4 step, at M = 5-16 4 stages (3) -5.9 per batch-16 step.
# - 2026-12-04 (session 19, bench/llama_results/down_warps_s19.md): at M = 17-64 o's
#   split-K tile with 6 stages (3) -26.7 (session 18's sweep) and down's over 8 warps (4)
#   -37.0 per batch-64 step (-36.9 in a second sweep on another machine).
# - 2026-12-04 (session 20, bench/llama_results/attn_tiles_s20.md): decode attention at
#   M = 17-64 in 64-position tiles up to 3072 positions and 128 beyond, chosen in the
#   kernel by the row's context (the tuner's n128 at every context before): -16.7 per
#   batch-64 step at context 128, -23.2 at 1K, within 3.1 at 4K and 8K (paired).
# - 2026-12-04 (session 21, bench/llama_results/probes_s21.md): decode attention at M =
#   5-16 over 2 warps (4 before): -6.9, -16.9, -13.7 and -14.8 per batch-16 step at
#   contexts 128, 1K, 4K and 8K. 2 warps at 2-4 rows (+1.3 to +6.5 but at 1K) and at
#   17-64 (+8.6 to +40.7 but at 8K) were not taken, nor 32-position tiles (mixed).
_PINS = {
    "llama_down_proj": {0: "p1_1_k8192_w16_s1", 3: "p64_64_k128_w8_s4_x4"},
    "llama_lm_head": {0: "p1_256_k2048_w8_s4", 3: "p64_512_k64_w4_s6"},
    "llama_o_proj": {1: "p4_4_k2048_w4_s1", 3: "p64_32_k128_w4_s6_x2"},
    "llama_attn_decode": {2: "n64_w2_s3", 3: "n128_w4_s2_le3072_n64_s3"},
    "llama_qkv_rope": {1: "p4_4_k256_w4_s4", 2: "p16_32_k256_w4_s4", 3: "p64_16_k128_w4_s6"},
    "llama_gate_up": {3: "p64_64_k64_w4_s6"},
}


def _pinned(name, lists):
    """`lists` with the buckets _PINS names for kernel `name` reduced to their pin."""
    lists = list(lists)
    for bucket, config in _PINS.get(name, {}).items():
        lists[bucket] = [config]
    return lists


def _proj_buckets(name, later):
    """Bucket lists of a projection: its M = 1 list, then its M = 2-4 list and `later`
    (buckets 5-16 on); the o and down projections' split-K configs and every projection's
    swapped tiles in buckets 2-4 to 17-64 only; buckets 2-4 on each led by its H200
    winner (_TUNED)."""
    if name in _XN:
        lists = [_M1[name]] + _XN[name] + later[2:]
    else:
        lists = [_M1[name], _M4[name]] + later
        for bucket, first in enumerate(_SPLIT_FIRST.get(name, []), start=1):
            lists[bucket] = (first + lists[bucket])[:6]  # a tuning costs each a compile
    for bucket, names in enumerate(_SWAP_CANDIDATES[name], start=1):
        lists[bucket] = lists[bucket] + names
    lists[1:] = _winner_first(lists[1:], _TUNED[name])
    lists = _pinned(name, lists)
    if name in _XN:
        # These read llama_rmsnorm's rows exactly when BLOCK_M > 1; the engines write them
        # at M > 1 only, so bucket 0 (M <= 1) must offer BLOCK_M 1 alone, the others none.
        for bucket, names in enumerate(lists):
            assert all(n.startswith("p1_") == (bucket == 0) for n in names), (name, bucket)
    for bucket, names in enumerate(lists):
        split = [n for n in names if "_x" in n]
        assert not split or (1 <= bucket and BUCKET_M[bucket] <= SPLIT_MAX_ROWS), (name, bucket)
    return lists


def _shape(m, **extra):
    return {"M": m, **MODEL, **extra}


def _inputs(name, **extra):
    def make_inputs(shape, device):
        import llama_torch
        return llama_torch.make_inputs(name, {**shape, **extra}, device)
    return make_inputs


def _reference(name):
    def reference(args):
        import llama_torch
        return llama_torch.reference(name, args, HEAD_DIM)
    return reference


BF16_TOL = (1e-2, 1e-3)
M_BUCKETS = [Bucket("M", M_EDGES)]


def _spec(name, fn, params, configs, per_bucket, grid, outputs, readonly, aligned,
          representatives, tolerance, constants=None, make_inputs=None):
    default, allowed = _candidates(per_bucket)
    return KernelSpec(
        name=name, fn=fn, params=params, configs=configs, default=default,
        grid=grid, buckets=M_BUCKETS, representatives=representatives,
        specializations=[Specialization("aligned", div16=aligned)],
        constants={**PDL["constants"], **(constants or {})}, options=PDL["options"],
        make_inputs=make_inputs or _inputs(name), outputs=outputs,
        reference=_reference(name), tolerance=tolerance, config_allowed=allowed,
        readonly=readonly, grid_tolerant=True)


def _p(names, kind):
    return [(n, kind) for n in names.split()]


EMBED = _spec(
    "llama_embed", lk.llama_embed,
    _p("tokens", "*i32") + _p("table", "*bf16") + _p("h", "*fp32") + _p("M H", "i32")
    + _p("BLOCK USE_PDL", "constexpr"),
    [Config(f"b{b}_w{w}", {"BLOCK": b}, num_warps=w, num_stages=1)
     for b, w in ((512, 1), (1024, 2), (2048, 4), (256, 1))],
    _winner_first([["b1024_w2", "b512_w1", "b2048_w4"]] * 3
                  + [["b2048_w4", "b1024_w2", "b256_w1"]] * 3,
                  ["b512_w1"] * 3 + ["b1024_w2", "b2048_w4", "b2048_w4"]),
    ["M", "cdiv(H, BLOCK)"], ["h"], ["tokens", "table"], ["tokens", "table", "h", "H"],
    [_shape(m) for m in BUCKET_M], (0.0, 0.0))

# The activations of the projections of more than one row (docs/llama.md): one program per
# row, its 2048 fp32 values in one tile or a loop over narrower ones.
RMSNORM = _spec(
    "llama_rmsnorm", lk.llama_rmsnorm,
    _p("h", "*fp32") + _p("norm_w xn", "*bf16") + _p("M H", "i32") + _p("eps", "fp32")
    + _p("BLOCK USE_PDL", "constexpr"),
    [Config(f"b{b}_w{w}", {"BLOCK": b}, num_warps=w, num_stages=1)
     for b, w in ((2048, 4), (1024, 4), (2048, 8), (512, 2), (1024, 2))],
    [["b2048_w4", "b1024_w4", "b2048_w8", "b512_w2", "b1024_w2"]] * 6,
    ["M"], ["xn"], ["h", "norm_w"], ["h", "norm_w", "xn", "H"],
    [_shape(m) for m in BUCKET_M], BF16_TOL)

QKV = _spec(
    "llama_qkv_rope", lk.llama_qkv_rope,
    _p("h", "*fp32") + _p("xn norm_w w", "*bf16") + _p("inv_freq", "*fp32")
    + _p("pos seq", "*i32") + _p("q k_cache v_cache", "*bf16")
    + _p("M H NH NKV CAP", "i32") + _p("eps", "fp32")
    + _p("HEAD_DIM BLOCK_M BLOCK_J BLOCK_K STAGES SWAP USE_PDL", "constexpr"),
    _proj_configs("BLOCK_J"), _proj_buckets("llama_qkv_rope", PROJ_BUCKETS),
    ["cdiv((NH + 2 * NKV) * HEAD_DIM / 2, BLOCK_J)", "cdiv(M, BLOCK_M)"],
    ["q", "k_cache", "v_cache"], ["h", "xn", "norm_w", "w", "inv_freq", "pos", "seq"],
    ["h", "xn", "norm_w", "w", "inv_freq", "q", "k_cache", "v_cache", "H", "CAP"],
    [_shape(m, CAP=4096, prefill=m > 64) for m in BUCKET_M], BF16_TOL,
    constants={"HEAD_DIM": HEAD_DIM})


def _attn_decode_config(n, w, s, short=None):
    """A decode attention config: tiles of n positions over w warps, the KV loop s stages
    deep; with short = (ctx, sn, ss), contexts of at most ctx positions in tiles of sn,
    ss stages deep (llama_attn_decode's SHORT_CTX)."""
    ctx, sn, ss = short or (0, n, s)
    name = f"n{n}_w{w}_s{s}" + (f"_le{ctx}_n{sn}_s{ss}" if short else "")
    return Config(name, {"GROUP_BLOCK": 16, "BLOCK_N": n, "SHORT_CTX": ctx, "SHORT_N": sn,
                         "SHORT_STAGES": ss}, num_warps=w, num_stages=s)


_ATTN_DECODE_CONFIGS = [
    _attn_decode_config(n, w, s)
    for n, w, s in ((64, 4, 3), (32, 4, 3), (128, 4, 2), (64, 8, 3), (128, 8, 3), (64, 4, 4),
                    (64, 2, 3), (32, 2, 3))
] + [_attn_decode_config(128, w, 2, (3072, 64, 3)) for w in (4, 2)]
ATTN_DECODE = _spec(
    "llama_attn_decode", lk.llama_attn_decode,
    _p("q k_cache v_cache", "*bf16") + _p("pos seq", "*i32") + _p("o_part ml_part", "*fp32")
    + _p("counters", "*i32") + _p("out", "*bf16") + _p("M NH NKV CAP S", "i32")
    + _p("sm_scale", "fp32")
    + _p("HEAD_DIM GROUP_BLOCK BLOCK_N SHORT_CTX SHORT_N SHORT_STAGES USE_PDL", "constexpr"),
    _ATTN_DECODE_CONFIGS,
    # Small batches: contexts up to 4 tiles in one program per kv head (n128: 512
    # positions), its tiles' loads in flight together (s4: 3 tiles ahead).
    _pinned("llama_attn_decode", _winner_first(
        [["n64_w4_s3", "n128_w4_s2", "n64_w4_s4", "n128_w8_s3", "n32_w4_s3"]] * 3
        + [["n64_w4_s3", "n128_w4_s2", "n64_w8_s3", "n128_w8_s3"]] * 3,
        ["n64_w4_s3", "n128_w4_s2", "n128_w4_s2", "n64_w4_s3", "n128_w4_s2", "n64_w4_s3"])),
    ["S", "NKV", "M"], ["out", "counters"], ["q", "k_cache", "v_cache", "pos", "seq"],
    ["q", "k_cache", "v_cache", "o_part", "ml_part", "out", "CAP"],
    [_shape(m, CAP=1024, ctx=1024) for m in BUCKET_M[:-1]] + [_shape(512, CAP=1024, ctx=1024)],
    {"out": BF16_TOL, "counters": (0.0, 0.0)}, constants={"HEAD_DIM": HEAD_DIM})

_ATTN_PREFILL_CONFIGS = [
    Config(f"m{m}_n{n}_w{w}_s{s}", {"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
    for m, n, w, s in ((16, 64, 4, 3), (16, 32, 4, 3), (32, 64, 4, 3), (64, 64, 4, 3),
                       (64, 32, 4, 3), (128, 64, 8, 3), (64, 64, 8, 2))]
ATTN_PREFILL = _spec(
    "llama_attn_prefill", lk.llama_attn_prefill,
    _p("q k_cache v_cache", "*bf16") + _p("pos seq", "*i32") + _p("out", "*bf16")
    + _p("M NH NKV CAP", "i32") + _p("sm_scale", "fp32")
    + _p("HEAD_DIM BLOCK_M BLOCK_N USE_PDL", "constexpr"),
    _ATTN_PREFILL_CONFIGS,
    _winner_first(
        [["m16_n64_w4_s3", "m16_n32_w4_s3"]] * 2
        + [["m16_n64_w4_s3", "m16_n32_w4_s3", "m32_n64_w4_s3"]]
        + [["m32_n64_w4_s3", "m16_n64_w4_s3", "m64_n64_w4_s3", "m64_n32_w4_s3"]]
        + [["m64_n64_w4_s3", "m128_n64_w8_s3", "m64_n64_w8_s2", "m64_n32_w4_s3"]] * 2,
        ["m16_n64_w4_s3"] * 4 + ["m64_n64_w4_s3", "m64_n32_w4_s3"]),
    ["cdiv(M, BLOCK_M)", "NH"], ["out"], ["q", "k_cache", "v_cache", "pos", "seq"],
    ["q", "k_cache", "v_cache", "out", "CAP"],
    [_shape(m, CAP=m + 512, ctx=m + 500) for m in BUCKET_M], BF16_TOL,
    constants={"HEAD_DIM": HEAD_DIM})


def _proj_residual(name):
    """o (K = NH * D) and down (K = I): one function, tuned at each one's shape."""
    return _spec(
        name, lk.llama_proj_residual,
        _p("x w", "*bf16") + _p("h part", "*fp32") + _p("counters", "*i32")
        + _p("M N K", "i32")
        + _p("BLOCK_M BLOCK_N BLOCK_K SPLIT STAGES SWAP USE_PDL", "constexpr"),
        _proj_configs("BLOCK_N", split=True), _proj_buckets(name, PROJ1_BUCKETS),
        ["cdiv(N, BLOCK_N)", "cdiv(M, BLOCK_M)", "SPLIT"], ["h", "counters"], ["x", "w"],
        ["x", "w", "h", "part", "N", "K"], [_shape(m) for m in BUCKET_M],
        {"h": (2e-4, 2e-4), "counters": (0.0, 0.0)})


O_PROJ = _proj_residual("llama_o_proj")
DOWN_PROJ = _proj_residual("llama_down_proj")

GATE_UP = _spec(
    "llama_gate_up", lk.llama_gate_up,
    _p("h", "*fp32") + _p("xn norm_w w out", "*bf16") + _p("M H I", "i32")
    + _p("eps", "fp32")
    + _p("BLOCK_M BLOCK_N BLOCK_K STAGES SWAP USE_PDL", "constexpr"),
    _proj_configs("BLOCK_N"), _proj_buckets("llama_gate_up", PROJ_BUCKETS),
    ["cdiv(I, BLOCK_N)", "cdiv(M, BLOCK_M)"], ["out"], ["h", "xn", "norm_w", "w"],
    ["h", "xn", "norm_w", "w", "out", "H", "I"], [_shape(m) for m in BUCKET_M], BF16_TOL)

# The LM head above one row with its tiles' K loops flattened into one pipelined loop
# (FLAT: llama_kernels._lm_head_flat; names ending _f): the 17-64 pin and the 2-16 tuned
# tile, and programs of twice the rows (126 programs for 132 SMs, one wave). Not tuned
# nor pinned: candidates for bench/llama_variant_sweep.py and llama_proj_probe.py, checked
# by check_kernels.py (session 24's Llama tier on the H200) and timed on an H100 (session
# 26, bench/llama_results/flat_lm_head_h100_s26.md).
LM_FLAT = [(64, 512, 64, 4, 6, 0), (64, 1024, 64, 4, 6, 0), (64, 512, 64, 4, 4, 0),
           (64, 1024, 128, 4, 4, 0), (16, 512, 128, 4, 4, 1), (16, 1024, 128, 4, 4, 1)]


def _lm_head_configs():
    """The projections' candidates (FLAT 0) and LM_FLAT's."""
    return [Config(c.name, {**c.constexprs, "FLAT": 0}, num_warps=c.num_warps,
                   num_stages=c.num_stages) for c in _proj_configs("BLOCK_N")] + [
        _config(f"p{m}_{n}_k{k}_w{w}_s{s}{'_t' * t}_f", w, s, BLOCK_M=m, BLOCK_N=n,
                BLOCK_K=k, SWAP=t, FLAT=1)
        for m, n, k, w, s, t in LM_FLAT]


LM_HEAD = _spec(
    "llama_lm_head", lk.llama_lm_head,
    _p("h", "*fp32") + _p("xn norm_w w", "*bf16") + _p("logits part_max", "*fp32")
    + _p("part_idx counters tokens pos", "*i32") + _p("M V H", "i32") + _p("eps", "fp32")
    + _p("advance keep_logits", "i32")
    + _p("BLOCK_M BLOCK_N BLOCK_K STAGES SWAP FLAT USE_PDL", "constexpr"),
    _lm_head_configs(), _proj_buckets("llama_lm_head", PROJ1_BUCKETS),
    ["cdiv(V, BLOCK_N)", "cdiv(M, BLOCK_M)"], ["logits", "tokens", "pos", "counters"],
    ["h", "xn", "norm_w", "w"],
    ["h", "xn", "norm_w", "w", "logits", "part_max", "part_idx", "V", "H"],
    [_shape(m) for m in BUCKET_M[:-1]] + [_shape(512)],
    # logits: the fp32 order of the RMSNorm's sum of squares depends on the config; its
    # last bit can flip a few bf16 roundings of the normalized row (about 2e-4 each).
    {"logits": (1e-3, 3e-3), "tokens": (0.0, 0.0), "pos": (0.0, 0.0),
     "counters": (0.0, 0.0)})

ALL_KERNELS = [EMBED, RMSNORM, QKV, ATTN_DECODE, ATTN_PREFILL, O_PROJ, GATE_UP, DOWN_PROJ,
               LM_HEAD]


def _selected(kernels):
    """LLAMA_SPEC_KERNELS=name,name,... builds only those (tuning in steps that each fit a
    time limit: every step passes --reuse-tuning the previous step's tuning.json and names
    one more kernel); unset, all of them."""
    names = [n for n in os.environ.get("LLAMA_SPEC_KERNELS", "").split(",") if n]
    unknown = sorted(set(names) - {k.name for k in kernels})
    if unknown:
        raise ValueError(f"LLAMA_SPEC_KERNELS names unknown kernels {unknown}")
    return [k for k in kernels if not names or k.name in names]


KPACK_KERNELS = _selected(ALL_KERNELS)
