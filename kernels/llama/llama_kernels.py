"""Triton kernels of the Llama decode engine (the contract: ``docs/llama.md``).

Nine pack kernels from eight functions: ``llama_embed``, ``llama_rmsnorm`` (the rows
normalized once, bf16, for the projections of more than one row), ``llama_qkv_rope``
(RMSNorm in the prologue at one row, RoPE and the KV-cache append in the epilogue),
``llama_attn_decode`` (split-KV GQA decode attention, the last split combining),
``llama_attn_prefill`` (causal GQA attention), ``llama_proj_residual`` (``llama_o_proj``
and ``llama_down_proj``: projection plus the residual add), ``llama_gate_up`` (RMSNorm
prologue at one row, SwiGLU epilogue) and ``llama_lm_head`` (final RMSNorm at one row,
logits and the greedy argmax, the last program reducing). Above one row (BLOCK_M > 1)
QKV, gate/up and the LM head read llama_rmsnorm's rows ``xn`` instead of normalizing
``h`` in every program.

How they are written:

- Every count comes from the size arguments, never from ``tl.num_programs``; a program
  past them touches no memory (a padded grid gives the same bits), except one past the o
  and down projections' third axis at SPLIT == 1, which reads like the first and writes
  nothing (the check masks its store: before its first loads it slowed batch 1). Offsets
  into tensors are int64.
- Projections accumulate in fp32 over bf16 operands. ``BLOCK_M == 1`` (batch 1) is a
  GEMV: each ``[BLOCK_N, BLOCK_K]`` weight tile times the row's tile, the fp32 products
  reduced over the tile. ``1 < BLOCK_M < 16`` (small batches) multiplies and adds
  elementwise on ``[BLOCK_M, BLOCK_N, BLOCK_K]`` (each x tile read once per K tile) and
  reduces over K once at the end, or, for tiles of ``_ROWS_GEMV_K`` columns or more, is
  a GEMV per row over the shared weight tile; ``BLOCK_M >= 16`` uses ``tl.dot``, as
  x · wᵀ or, with the constexpr ``SWAP``, as w · xᵀ (transposed after the K loop). The
  first K tile of a program's weights is loaded before ``gdc_wait()``; the K loop after it
  is software-pipelined (``tl.range(num_stages=STAGES)``: Triton pipelines loops without a
  dot only when asked). Above one row the o and down projections may split K over a
  third grid axis (the constexpr ``SPLIT``): a 2048-wide output is too few programs
  for 132 SMs.
  The LM head at one row streams a wide program's vocabulary rows tile by tile.
- No float atomics: the three cross-program reductions (decode-attention splits, the o
  and down projections' K splits, the LM head's argmax) write partials and the program
  that brings an int32 counter to its target (acq_rel, after a CTA barrier) reduces them
  in a fixed order and resets the counter, so results are the same bits on every run
  whichever program comes last.
- Programmatic dependent launch behind the constexpr ``USE_PDL`` (off in the
  interpreter, which cannot run inline PTX): a program may read its weights first (its
  first K tile into registers and, at one row, more prefetched into L2: the weights,
  norm weights and ``inv_freq`` are never written by a kernel), then ``gdc_wait()``
  before touching anything the kernel right before it may write, and
  ``gdc_launch_dependents()`` once its dependent reads are issued. Both are no-ops when the launch has no PDL attribute, so
  the kernels are correct either way. Projection programs of more than one row, and
  decode attention's above one row when the row's context is split, do not call
  ``gdc_launch_dependents()`` (their dependents launch as they exit:
  ``_pdl_launch_rows``). Every program calls ``gdc_wait()`` (also the ones
  that then return), so no kernel can complete before the one it follows; and every kernel
  triggers its dependents only after its ``gdc_wait()``, so when a kernel's programs
  start, every kernel before the one it follows has completed. What only those write may
  be read before ``gdc_wait()`` too: QKV and decode attention read ``pos`` and ``seq``
  there (the LM head advances ``pos`` at a step's end, at least two launches before
  either; the host sets both).
"""

import triton
import triton.language as tl

# Bytes of its weight rows beyond the first K tile (which it loads into registers) a
# projection program of one row prefetches into L2 before gdc_wait, at most.
_PREFETCH_BYTES = tl.constexpr(32768)
# Elements of a weight tile the LM head takes at a time when a program has more vocabulary
# rows (_lm_head_stream at one row, _lm_head_block at more): 16 KB.
_LM_TILE = tl.constexpr(8192)
# Elements of argmax partials the LM head's last program reads per row and iteration.
_ARGMAX_CHUNK = tl.constexpr(4096)
_INT32_MAX = tl.constexpr(2147483647)
# Decode attention: a row whose context spans at most this many KV tiles is attended by
# split 0 alone (no partials, no counter).
_DIRECT_TILES = tl.constexpr(4)
# Decode attention's combine: heads and splits of partials read at once.
_COMBINE_HEADS = tl.constexpr(4)
_COMBINE_SPLITS = tl.constexpr(32)
# Projections of 2-15 rows: a weight tile this many K columns wide or wider is multiplied
# as a GEMV per row (_project_rows); narrower ones keep the products [BLOCK_M, BLOCK_N,
# BLOCK_K] per k (at 2048 those would not fit in registers: [4, 4, 2048] fp32 is 256 a
# thread over 4 warps).
_ROWS_GEMV_K = tl.constexpr(2048)


@triton.jit
def _prefetch_span(w, r0, r1, K, BYTES: tl.constexpr):
    """Prefetch into L2 weight rows [r0, r1) (bf16, row length K; scalar row indices),
    at most BYTES from the start of row r0: the span's 16-byte aligned interior split
    over the CTA's warps, one bulk prefetch (cp.async.bulk.prefetch.L2) by each warp's
    first lane. Nothing where the span is empty."""
    NW: tl.constexpr = tl.extra.cuda.num_warps()
    start = (w + r0.to(tl.int64) * K).to(tl.int64)
    stop = tl.minimum((w + r1.to(tl.int64) * K).to(tl.int64), start + BYTES)
    lo = (start + 15) & -16
    hi = tl.maximum(stop & -16, lo)
    per = (hi - lo + (NW * 16 - 1)) // (NW * 16) * 16
    tl.inline_asm_elementwise(
        """{
        .reg .u32 t, n;
        .reg .u64 a, e, wi;
        .reg .pred p;
        mov.u32 t, %tid.x;
        shr.u32 n, t, 5;
        cvt.u64.u32 wi, n;
        mad.lo.u64 a, wi, $3, $1;
        add.u64 e, a, $3;
        min.u64 e, e, $2;
        and.b32 t, t, 31;
        setp.eq.u32 p, t, 0;
        setp.lt.and.u64 p, a, e, p;
        sub.u64 e, e, a;
        cvt.u32.u64 n, e;
        @p cp.async.bulk.prefetch.L2.global [a], n;
        }""", "=r,l,l,l", [lo, hi, per], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _pdl_wait(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def _pdl_launch(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _pdl_launch_rows(USE_PDL: tl.constexpr, BLOCK_M: tl.constexpr):
    """_pdl_launch for a projection program of BLOCK_M rows: at one row here; at more rows
    not at all, so the kernel's dependents launch as its programs exit. On the H200
    (2026-12-02, llama_breakdown, context 128) an early trigger at more rows made eager
    steps 14-18% slower at batch 4-64, and the step graph with programmatic edges slower
    than without them by 17% at 4 and 22% at 64; triggering at exit, the graph with the
    edges is 19-22 µs per step faster than without (docs/llama.md)."""
    if BLOCK_M == 1:
        _pdl_launch(USE_PDL)


@triton.jit
def _rstd_row(xf0, h, row, row_ok, H, eps, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean(h[row]^2) + eps) for one row of the fp32 residual stream, given its
    first K tile xf0 (columns [0, BLOCK_K), already loaded for the projection); the rest
    of the row, if any, read in narrow chunks, two in flight (narrow: the registers of a
    loop that a whole-row tile never runs still count against the tile's)."""
    CHUNK: tl.constexpr = 512
    cols = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], tl.float32)
    base = row.to(tl.int64) * H
    for k0 in tl.range(BLOCK_K, H, CHUNK, num_stages=2):
        x = tl.load(h + base + k0 + cols, mask=row_ok & (k0 + cols < H), other=0.0)
        acc += x * x
    mean = tl.div_rn(tl.sum(xf0 * xf0, 0) + tl.sum(acc, 0), H.to(tl.float32))
    return tl.div_rn(1.0, tl.sqrt_rn(mean + eps))


@triton.jit
def _normed_row(xf, r, g):
    """_normed of one row: xf [BLOCK_K] fp32, r a scalar."""
    return ((xf * r).to(tl.bfloat16).to(tl.float32) * g.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _k_tile(src, rows, rows_ok, k0, K, BLOCK_K: tl.constexpr):
    """Columns [k0, k0 + BLOCK_K) of rows `rows` of a row-major matrix of row length K (a
    weight's rows, or x's): zero for rows not rows_ok and for columns past K."""
    cols = k0 + tl.arange(0, BLOCK_K)
    return tl.load(src + rows.to(tl.int64)[:, None] * K + cols[None, :],
                   mask=rows_ok[:, None] & (cols < K)[None, :], other=0.0)


@triton.jit
def _w_first(w, wrows_a, wrows_b, wrows_ok, norm_w, K, TWO: tl.constexpr,
             NORM: tl.constexpr, BLOCK_K: tl.constexpr):
    """What a projection program reads before gdc_wait (weights are never written): the
    first K tile of its weight rows (two row sets with TWO, the second returned as the
    first without) and, with NORM, the norm weight's first BLOCK_K columns (else zeros)."""
    wa0 = _k_tile(w, wrows_a, wrows_ok, 0, K, BLOCK_K)
    if TWO:
        wb0 = _k_tile(w, wrows_b, wrows_ok, 0, K, BLOCK_K)
    else:
        wb0 = wa0
    cols = tl.arange(0, BLOCK_K)
    if NORM:
        g0 = tl.load(norm_w + cols, mask=cols < K, other=0.0)
    else:
        g0 = tl.zeros([BLOCK_K], tl.bfloat16)
    return wa0, wb0, g0


@triton.jit
def _prefetch_rows(w, first, count, K, BLOCK_K: tl.constexpr, BYTES: tl.constexpr,
                   USE_PDL: tl.constexpr, BLOCK_M: tl.constexpr):
    """With PDL, before gdc_wait, in a program of one row: its `count` consecutive weight
    rows from row `first` into L2 (at most BYTES) when its first K tile does not cover
    them. Not above one row: on the H200 (2026-12-02, bench/llama_ab.sh) the prefetch made
    batch 4 37 µs per step slower (1087.3 against 1050.2), batches 16 and 64 no faster
    (within 3.3 µs), and batch 1 2.6 µs faster (bench/llama_results/pdl_s10.md)."""
    if USE_PDL:
        if BLOCK_M == 1:
            if (count > 0) & (K > BLOCK_K):
                _prefetch_span(w, first, first + count, K, BYTES)


@triton.jit
def _row_tile(xsrc, row, M, r, g, k0, K, NORM: tl.constexpr, BLOCK_K: tl.constexpr):
    """Columns [k0, k0 + BLOCK_K) of row `row` of x as bf16: rmsnorm'd with rstd r and
    the norm weight's columns g when NORM (xsrc the fp32 residual stream), else xsrc's
    own."""
    cols = k0 + tl.arange(0, BLOCK_K)
    xv = tl.load(xsrc + row.to(tl.int64) * K + cols, mask=(row < M) & (cols < K), other=0.0)
    if NORM:
        xv = _normed_row(xv, r, g)
    return xv


@triton.jit
def _row_mac(acc, ridx, mi, xv, wt):
    """Row mi of acc ([BLOCK_M, BLOCK_N]) += xv · wtᵀ (xv [BLOCK_K], wt [BLOCK_N, BLOCK_K]
    bf16; the fp32 products reduced over the tile)."""
    part = tl.sum(xv.to(tl.float32)[None, :] * wt.to(tl.float32), 1)
    return tl.where((ridx == mi)[:, None], acc + part[None, :], acc)


@triton.jit
def _project_row(xsrc, row0, M, g0, norm_w, eps, w, wrows_a, wrows_b, wrows_ok, K, wa0,
                 wb0, NORM: tl.constexpr, TWO: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """_project at one row (BLOCK_M == 1, a GEMV): each K tile of the weights (the first
    one given) times the row's tile, the fp32 products reduced over the tile; the row's
    rstd from the first tile it loads anyway."""
    ridx = tl.arange(0, 1)
    acc_a = tl.zeros([1, BLOCK_N], tl.float32)
    acc_b = tl.zeros([1, BLOCK_N], tl.float32)
    r_all = tl.zeros([1], tl.float32)
    cols = tl.arange(0, BLOCK_K)
    xv = tl.load(xsrc + row0.to(tl.int64) * K + cols, mask=(row0 < M) & (cols < K),
                 other=0.0)
    if NORM:
        r_all += _rstd_row(xv, xsrc, row0, row0 < M, K, eps, BLOCK_K)
        xv = _normed_row(xv, tl.sum(r_all, 0), g0)
    acc_a = _row_mac(acc_a, ridx, 0, xv, wa0)
    if TWO:
        acc_b = _row_mac(acc_b, ridx, 0, xv, wb0)
    for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
        wa = _k_tile(w, wrows_a, wrows_ok, k0, K, BLOCK_K)
        if TWO:
            wb = _k_tile(w, wrows_b, wrows_ok, k0, K, BLOCK_K)
        if NORM:
            cols = k0 + tl.arange(0, BLOCK_K)
            g = tl.load(norm_w + cols, mask=cols < K, other=0.0)
        else:
            g = g0
        r = tl.sum(tl.where(ridx == 0, r_all, 0.0), 0)
        xv = _row_tile(xsrc, row0, M, r, g, k0, K, NORM, BLOCK_K)
        acc_a = _row_mac(acc_a, ridx, 0, xv, wa)
        if TWO:
            acc_b = _row_mac(acc_b, ridx, 0, xv, wb)
    if not TWO:
        acc_b = acc_a
    return acc_a, acc_b


@triton.jit
def _rows_mac(acc_a, acc_b, xsrc, row0, M, k0, K, wa, wb, TWO: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Each row mi of acc_a (and of acc_b with TWO) += x row row0 + mi's columns [k0,
    k0 + BLOCK_K) · waᵀ (wbᵀ): _row_tile and _row_mac per row, those at or past M reading
    zeros."""
    ridx = tl.arange(0, BLOCK_M)
    for mi in tl.static_range(BLOCK_M):
        xv = _row_tile(xsrc, row0 + mi, M, 0.0, 0.0, k0, K, False, BLOCK_K)
        acc_a = _row_mac(acc_a, ridx, mi, xv, wa)
        if TWO:
            acc_b = _row_mac(acc_b, ridx, mi, xv, wb)
    return acc_a, acc_b


@triton.jit
def _project_rows(xsrc, row0, M, w, wrows_a, wrows_b, wrows_ok, K, wa0, wb0,
                  TWO: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """_project at 2-15 rows with wide K tiles, a GEMV per row: each K tile of the
    weights (the first one given, loaded before gdc_wait) times each row's tile, the fp32
    products reduced over the tile. At 4 rows, o's whole 2048-wide weight rows in one
    tile (p4_4_k2048_w4_s1) with decode attention triggering it early made the batch-4
    step 34 µs faster; the products kept per k at that tile spill (bench/llama_results/
    rows_gemv_s17.md). With a K loop it lost (o at [4, 4, 256]: +59 µs per step)."""
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_a, acc_b = _rows_mac(acc_a, acc_b, xsrc, row0, M, 0, K, wa0, wb0, TWO, BLOCK_M,
                             BLOCK_K)
    for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
        wa = _k_tile(w, wrows_a, wrows_ok, k0, K, BLOCK_K)
        if TWO:
            wb = _k_tile(w, wrows_b, wrows_ok, k0, K, BLOCK_K)
        else:
            wb = wa
        acc_a, acc_b = _rows_mac(acc_a, acc_b, xsrc, row0, M, k0, K, wa, wb, TWO, BLOCK_M,
                                 BLOCK_K)
    if not TWO:
        acc_b = acc_a
    return acc_a, acc_b


@triton.jit
def _acc_first(x, w, BLOCK_M: tl.constexpr, SWAP: tl.constexpr):
    """The accumulator of x · wᵀ over one K tile (x [BLOCK_M, BLOCK_K], w [BLOCK_N,
    BLOCK_K], bf16): tl.dot's [BLOCK_M, BLOCK_N] from 16 rows, or with SWAP its transpose
    w · xᵀ [BLOCK_N, BLOCK_M] (the weight rows as the MMA's M dimension: a few rows of x
    padded to 16 are then the narrow N side); below 16 rows, the fp32 products [BLOCK_M,
    BLOCK_N, BLOCK_K], kept per k until _acc_sum."""
    if BLOCK_M >= 16:
        if SWAP:
            acc = tl.dot(w, tl.trans(x))
        else:
            acc = tl.dot(x, tl.trans(w))
    else:
        tl.static_assert(not SWAP, "SWAP is for tl.dot tiles (BLOCK_M >= 16)")
        acc = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _acc_mac(acc, x, w, BLOCK_M: tl.constexpr, SWAP: tl.constexpr):
    """acc (_acc_first's) += x · wᵀ of the next K tile (w · xᵀ with SWAP)."""
    if BLOCK_M >= 16:
        if SWAP:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    else:
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _acc_sum(acc, BLOCK_M: tl.constexpr, SWAP: tl.constexpr):
    """The [BLOCK_M, BLOCK_N] fp32 result of an accumulator: with SWAP tl.dot's transposed;
    below 16 rows, the products reduced over K once."""
    if BLOCK_M >= 16:
        if SWAP:
            out = tl.trans(acc)
        else:
            out = acc
    else:
        out = tl.sum(acc, 2)
    return out


@triton.jit
def _project(xsrc, row0, M, g0, norm_w, eps, w, wrows_a, wrows_b, wrows_ok, K, wa0, wb0,
             NORM: tl.constexpr, TWO: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
             SWAP: tl.constexpr):
    """(x · w[wrows_a]ᵀ, x · w[wrows_b]ᵀ) as [BLOCK_M, BLOCK_N] fp32 for rows row0 ..
    row0 + BLOCK_M of x (those below M). Given, as loaded before gdc_wait (_w_first): wa0,
    wb0, the first K tiles of the weight rows, and g0, the norm weight's first BLOCK_K
    columns; the K loop covers the rest. Without TWO only the first is computed (returned
    twice). One row: _project_row, where x = rmsnorm(xsrc, norm_w) when NORM (xsrc the fp32
    residual stream), else xsrc itself. More rows: x is xsrc, bf16 (normalized before by
    llama_rmsnorm when it is the residual stream's: NORM is for one row only), each K tile
    loaded once and multiplied with the weight tiles (_acc_first, _acc_mac: tl.dot from 16
    rows, elementwise below; SWAP: _acc_first's), or below 16 rows with tiles of
    _ROWS_GEMV_K columns or more, _project_rows."""
    if BLOCK_M == 1:
        out_a, out_b = _project_row(xsrc, row0, M, g0, norm_w, eps, w, wrows_a, wrows_b,
                                    wrows_ok, K, wa0, wb0, NORM, TWO, BLOCK_N, BLOCK_K,
                                    STAGES)
    elif (BLOCK_M < 16) and (BLOCK_K >= _ROWS_GEMV_K):
        tl.static_assert(not NORM, "_project normalizes one row only (llama_rmsnorm)")
        out_a, out_b = _project_rows(xsrc, row0, M, w, wrows_a, wrows_b, wrows_ok, K, wa0,
                                     wb0, TWO, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
    else:
        tl.static_assert(not NORM, "_project normalizes one row only (llama_rmsnorm)")
        rows = row0 + tl.arange(0, BLOCK_M)
        rows_ok = rows < M
        x_base = rows.to(tl.int64)[:, None] * K
        cols = tl.arange(0, BLOCK_K)
        x = tl.load(xsrc + x_base + cols[None, :], mask=rows_ok[:, None] & (cols < K)[None, :],
                    other=0.0)
        acc_a = _acc_first(x, wa0, BLOCK_M, SWAP)
        if TWO:
            acc_b = _acc_first(x, wb0, BLOCK_M, SWAP)
        else:
            acc_b = acc_a
        for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
            cols = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(xsrc + x_base + cols[None, :],
                        mask=rows_ok[:, None] & (cols < K)[None, :], other=0.0)
            acc_a = _acc_mac(acc_a, x, _k_tile(w, wrows_a, wrows_ok, k0, K, BLOCK_K), BLOCK_M,
                             SWAP)
            if TWO:
                acc_b = _acc_mac(acc_b, x, _k_tile(w, wrows_b, wrows_ok, k0, K, BLOCK_K),
                                 BLOCK_M, SWAP)
        out_a = _acc_sum(acc_a, BLOCK_M, SWAP)
        if TWO:
            out_b = _acc_sum(acc_b, BLOCK_M, SWAP)
        else:
            out_b = out_a
    return out_a, out_b


@triton.jit
def llama_embed(tokens, table, h, M, H, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """h[m, :] = float(table[tokens[m], :])."""
    m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    _pdl_wait(USE_PDL)
    if m < M:
        token = tl.load(tokens + m)
        _pdl_launch(USE_PDL)
        ok = cols < H
        row = tl.load(table + token.to(tl.int64) * H + cols, mask=ok, other=0.0)
        tl.store(h + m.to(tl.int64) * H + cols, row.to(tl.float32), mask=ok)


@triton.jit
def llama_rmsnorm(h, norm_w, xn, M, H, eps, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """xn[m, :] = rmsnorm(h[m, :], norm_w) as bf16, one program per row: the activations
    that the projections of more than one row read (they do not normalize h themselves,
    so their programs can be many and narrow without repeating the norm)."""
    m = tl.program_id(0)
    _pdl_wait(USE_PDL)
    if m < M:
        _pdl_launch(USE_PDL)
        base = m.to(tl.int64) * H
        cols = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], tl.float32)
        for k0 in range(0, H, BLOCK):
            x = tl.load(h + base + k0 + cols, mask=k0 + cols < H, other=0.0)
            acc += x * x
        mean = tl.div_rn(tl.sum(acc, 0), H.to(tl.float32))
        r = tl.div_rn(1.0, tl.sqrt_rn(mean + eps))
        for k0 in range(0, H, BLOCK):
            ok = k0 + cols < H
            x = tl.load(h + base + k0 + cols, mask=ok, other=0.0)
            g = tl.load(norm_w + k0 + cols, mask=ok, other=0.0)
            tl.store(xn + base + k0 + cols, _normed_row(x, r, g), mask=ok)


@triton.jit
def _rope_cos_sin(p, freq):
    """cos and sin of the rotation angles p[m] · freq[j] ([rows, pairs], fp32)."""
    angle = p.to(tl.float32)[:, None] * freq[None, :]
    return tl.cos(angle), tl.sin(angle)


@triton.jit
def llama_qkv_rope(h, xn, norm_w, w, inv_freq, pos, seq, q, k_cache, v_cache,
                   M, H, NH, NKV, CAP, eps,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr,
                   BLOCK_K: tl.constexpr, STAGES: tl.constexpr, SWAP: tl.constexpr,
                   USE_PDL: tl.constexpr):
    """rmsnorm -> the q, k, v projections -> RoPE on q and k -> q, and k, v appended to
    the cache at [seq[m], kv head, pos[m]]. A program owns BLOCK_J row pairs (j, j + D/2)
    of the heads, so it rotates what it computed. One row normalizes h itself; more read
    xn, llama_rmsnorm's rows (NORM)."""
    NORM: tl.constexpr = BLOCK_M == 1
    HALF: tl.constexpr = HEAD_DIM // 2
    pid_j = tl.program_id(0)
    pid_m = tl.program_id(1)
    n_pairs = (NH + 2 * NKV) * HALF
    pairs = pid_j * BLOCK_J + tl.arange(0, BLOCK_J)
    head = pairs // HALF
    j = pairs % HALF
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    live = (pid_m * BLOCK_M < M) & (pid_j * BLOCK_J < n_pairs)
    pairs_ok = (pairs < n_pairs) & live
    row_a = head * HEAD_DIM + j
    row_b = row_a + HALF
    wa0, wb0, g0 = _w_first(w, row_a, row_b, pairs_ok, norm_w, H, True, NORM, BLOCK_K)
    freq = tl.load(inv_freq + j, mask=pairs_ok, other=0.0)
    p0 = pid_j * BLOCK_J
    count = tl.where(live, tl.minimum(n_pairs - p0, BLOCK_J), 0)
    first = p0 // HALF * HEAD_DIM + p0 % HALF
    if BLOCK_J >= HALF:  # whole heads: both halves of each, one span
        _prefetch_rows(w, first, 2 * count, H, BLOCK_K, _PREFETCH_BYTES, USE_PDL, BLOCK_M)
    else:  # part of one head: rows j.. and j + D/2..
        _prefetch_rows(w, first, count, H, BLOCK_K, _PREFETCH_BYTES // 2, USE_PDL,
                       BLOCK_M)
        _prefetch_rows(w, first + HALF, count, H, BLOCK_K, _PREFETCH_BYTES // 2, USE_PDL,
                       BLOCK_M)
    # The rows' positions and sequences before gdc_wait too: no kernel of the step writes
    # them before this one (the previous step's LM head advanced pos; the host sets seq).
    # At one row also the rotation's cos and sin: a few values, and at batch 1 the launch
    # overlaps the kernel before (the engines' programmatic edges). At more rows they
    # would hold registers through the K loop and, with no programmatic edge, delay the
    # first loads of h (measured at batch 4: 8.6 µs per step slower; at 1, 2.2 faster).
    p = tl.load(pos + rows, mask=rows_ok & live, other=0)
    s = tl.load(seq + rows, mask=rows_ok & live, other=0)
    if BLOCK_M == 1:
        c, sn = _rope_cos_sin(p, freq)
    _pdl_wait(USE_PDL)
    if live:
        _pdl_launch_rows(USE_PDL, BLOCK_M)
        a, b = _project(h if NORM else xn, pid_m * BLOCK_M, M, g0, norm_w, eps, w, row_a,
                        row_b, pairs_ok, H, wa0, wb0, NORM, True, BLOCK_M, BLOCK_J, BLOCK_K,
                        STAGES, SWAP)
        if BLOCK_M > 1:
            c, sn = _rope_cos_sin(p, freq)
        rotate = (head < NH + NKV)[None, :]
        out_a = tl.where(rotate, a * c - b * sn, a).to(tl.bfloat16)
        out_b = tl.where(rotate, b * c + a * sn, b).to(tl.bfloat16)
        ok = rows_ok[:, None] & pairs_ok[None, :]
        is_q = (head < NH)[None, :]
        q_off = (rows.to(tl.int64)[:, None] * NH + head[None, :]) * HEAD_DIM + j[None, :]
        tl.store(q + q_off, out_a, mask=ok & is_q)
        tl.store(q + q_off + HALF, out_b, mask=ok & is_q)
        is_k = ((head >= NH) & (head < NH + NKV))[None, :]
        is_v = (head >= NH + NKV)[None, :]
        kv_head = tl.where(head < NH + NKV, head - NH, head - NH - NKV)
        c_off = ((s.to(tl.int64)[:, None] * NKV + kv_head[None, :]) * CAP
                 + p[:, None]) * HEAD_DIM + j[None, :]
        c_ok = ok & (p < CAP)[:, None]
        tl.store(k_cache + c_off, out_a, mask=c_ok & is_k)
        tl.store(k_cache + c_off + HALF, out_b, mask=c_ok & is_k)
        tl.store(v_cache + c_off, out_a, mask=c_ok & is_v)
        tl.store(v_cache + c_off + HALF, out_b, mask=c_ok & is_v)


@triton.jit
def _pv(acc, p, v):
    """acc + p · v with p fp32 carried as two bf16 terms (hi + lo: 16 significant bits),
    so the tensor-core products keep fp32-like precision of the probabilities."""
    p_hi = p.to(tl.bfloat16)
    p_lo = (p - p_hi.to(tl.float32)).to(tl.bfloat16)
    return tl.dot(p_lo, v, tl.dot(p_hi, v, acc))


@triton.jit
def _attend_tile(qt, kv, vv, n, n_ok, keep, m_i, l_i, acc, sm_scale, HEAD_DIM: tl.constexpr):
    """One KV tile (positions n, those n_ok read) of online-softmax attention for the rows
    of qt: scores where `keep` ([rows, n]), else -inf; returns (m_i, l_i, acc) updated."""
    d = tl.arange(0, HEAD_DIM)
    kv_off = n.to(tl.int64)[:, None] * HEAD_DIM + d[None, :]
    kt = tl.load(kv + kv_off, mask=n_ok[:, None], other=0.0)
    s = tl.dot(qt, tl.trans(kt)) * sm_scale
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    pr = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(pr, 1)
    vt = tl.load(vv + kv_off, mask=n_ok[:, None], other=0.0)
    return m_new, l_i, _pv(acc * alpha[:, None], pr, vt)


@triton.jit
def llama_attn_decode(q, k_cache, v_cache, pos, seq, o_part, ml_part, counters, out,
                      M, NH, NKV, CAP, S, sm_scale,
                      HEAD_DIM: tl.constexpr, GROUP_BLOCK: tl.constexpr,
                      BLOCK_N: tl.constexpr, SHORT_CTX: tl.constexpr, SHORT_N: tl.constexpr,
                      SHORT_STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """Split s of row m's attention for the q heads of kv head g, each K/V tile read once
    for all of them. How many of the S splits carry work follows from the row's context
    (read here, so a graph's grid stays fixed as it grows): up to _DIRECT_TILES KV tiles,
    split 0 alone, writing out directly; beyond, cdiv(tiles, S) tiles per split and the
    last of the splits with work combines their partials.

    SHORT_CTX > 0: a row whose context has at most SHORT_CTX positions is attended in
    tiles of SHORT_N positions, its loop pipelined SHORT_STAGES deep (tiles, splits and
    the direct rule counted in those tiles); a longer one in BLOCK_N tiles, num_stages
    deep. The best tile depends on the context (the H200, batch 64: 64 positions are
    faster at 128-1K, 128 at 4K-8K, bench/llama_results/down_warps_s19.md), and a step
    graph serves every context of its batch with one config. SHORT_CTX = 0: BLOCK_N
    tiles at every context (SHORT_N, SHORT_STAGES unused)."""
    split = tl.program_id(0)
    g = tl.program_id(1)
    m = tl.program_id(2)
    live = (split < S) & (g < NKV) & (m < M)
    # pos and seq before gdc_wait: no kernel of the step writes them before this one
    # (the previous step's LM head advanced pos; the host sets seq).
    p = tl.load(pos + m, mask=live, other=0)
    sq = tl.load(seq + m, mask=live, other=0)
    _pdl_wait(USE_PDL)
    if live:
        length = tl.minimum(p + 1, CAP)
        tl.static_assert((SHORT_CTX == 0) | (SHORT_N <= BLOCK_N),
                         "SHORT_N is a tile for short contexts")
        # SHORT_CTX = 0: a constant false condition, the short tile's branch not compiled.
        if (SHORT_CTX > 0) & (length <= SHORT_CTX):
            _attn_decode_split(q, k_cache, v_cache, o_part, ml_part, counters, out, M, NH, NKV,
                               CAP, S, sm_scale, split, g, m, sq, length, HEAD_DIM,
                               GROUP_BLOCK, SHORT_N, SHORT_STAGES, USE_PDL)
        else:
            _attn_decode_split(q, k_cache, v_cache, o_part, ml_part, counters, out, M, NH, NKV,
                               CAP, S, sm_scale, split, g, m, sq, length, HEAD_DIM,
                               GROUP_BLOCK, BLOCK_N, 0, USE_PDL)


@triton.jit
def _attn_decode_split(q, k_cache, v_cache, o_part, ml_part, counters, out, M, NH, NKV, CAP,
                       S, sm_scale, split, g, m, sq, length, HEAD_DIM: tl.constexpr,
                       GROUP_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr,
                       STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """llama_attn_decode's work for split `split` of row m (context `length`, sequence sq)
    and kv head g in tiles of BLOCK_N positions, its KV loop pipelined STAGES deep (0: the
    kernel's num_stages)."""
    group = NH // NKV
    i = tl.arange(0, GROUP_BLOCK)
    heads = g * group + i
    heads_ok = i < group
    d = tl.arange(0, HEAD_DIM)
    q_off = (m.to(tl.int64) * NH + heads[:, None]) * HEAD_DIM + d[None, :]
    qt = tl.load(q + q_off, mask=heads_ok[:, None], other=0.0)
    # One row, a grid of one split per row (S = 1: 17 rows and more), or a row whose
    # context split 0 attends alone: the o projection launches now, its weights' loads
    # overlapping this kernel (at 2-4 rows o reads whole weight rows before gdc_wait: 34
    # µs per batch-4 step at context 128, bench/llama_results/rows_gemv_s17.md; at batch
    # 64, S = 1, 10-16 µs per step at contexts 1K-8K, bench/llama_results/
    # attn_tiles_s20.md). A split context: as this kernel's programs exit (early, o's
    # programs waited in gdc_wait on SMs the splits needed: 228 µs per step slower at
    # batch 16, context 8192, with the step graph's programmatic edges; and 35-37 µs at
    # batch 4 where its splits span 4-16 tiles, bench/llama_results/early_trigger_s16.md;
    # docs/llama.md).
    tiles = tl.cdiv(length, BLOCK_N)
    if (M == 1) | (S == 1) | (tiles <= _DIRECT_TILES):
        _pdl_launch(USE_PDL)
    per = tl.where(tiles <= _DIRECT_TILES, tiles, tl.cdiv(tiles, S))
    n_split = tl.cdiv(tiles, per)
    if split < n_split:
        lo = split * per * BLOCK_N
        hi = tl.minimum(lo + per * BLOCK_N, length)
        kv = k_cache + (sq.to(tl.int64) * NKV + g) * CAP * HEAD_DIM
        vv = v_cache + (sq.to(tl.int64) * NKV + g) * CAP * HEAD_DIM
        m_i = tl.full([GROUP_BLOCK], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_BLOCK], tl.float32)
        acc = tl.zeros([GROUP_BLOCK, HEAD_DIM], tl.float32)
        # STAGES = 0: no num_stages of the loop's own, the kernel's applies (as in range()).
        for start in tl.range(lo, hi, BLOCK_N, num_stages=STAGES if STAGES > 0 else None):
            n = start + tl.arange(0, BLOCK_N)
            m_i, l_i, acc = _attend_tile(qt, kv, vv, n, n < hi, (n < hi)[None, :], m_i, l_i,
                                         acc, sm_scale, HEAD_DIM)
        o_off = (m.to(tl.int64) * NH + heads[:, None]) * HEAD_DIM + d[None, :]
        if n_split == 1:
            o = acc / tl.where(heads_ok, l_i, 1.0)[:, None]
            tl.store(out + o_off, o.to(tl.bfloat16), mask=heads_ok[:, None])
        else:
            part = (m.to(tl.int64) * NH + heads) * S + split
            tl.store(o_part + part[:, None] * HEAD_DIM + d[None, :], acc,
                     mask=heads_ok[:, None])
            tl.store(ml_part + part * 2, m_i, mask=heads_ok)
            tl.store(ml_part + part * 2 + 1, l_i, mask=heads_ok)
            tl.debug_barrier()
            counter = counters + m * NKV + g
            done = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if done == n_split - 1:
                _attn_combine(o_part, ml_part, out, m, g * group, group, NH, S, n_split,
                              HEAD_DIM)
                tl.store(counter, 0)


@triton.jit
def _attn_combine(o_part, ml_part, out, m, head0, group, NH, S, n_split,
                  HEAD_DIM: tl.constexpr):
    """out = Σ_s o_s e^(m_s - M) / Σ_s l_s e^(m_s - M) over the n_split partials of the
    heads head0 .. head0 + group (written by other programs: read through L2), in a fixed
    order: _COMBINE_HEADS heads and _COMBINE_SPLITS splits at a time, each chunk's
    maxima, sums and partial outputs loaded together (one round trip per chunk)."""
    HC: tl.constexpr = _COMBINE_HEADS
    SC: tl.constexpr = _COMBINE_SPLITS
    d = tl.arange(0, HEAD_DIM)
    for h0 in range(0, group, HC):
        i = h0 + tl.arange(0, HC)
        heads_ok = i < group
        base = (m.to(tl.int64) * NH + head0 + i) * S
        top = tl.full([HC], float("-inf"), tl.float32)
        den = tl.zeros([HC], tl.float32)
        num = tl.zeros([HC, HEAD_DIM], tl.float32)
        for s0 in range(0, n_split, SC):
            sp = s0 + tl.arange(0, SC)
            ok = heads_ok[:, None] & (sp < n_split)[None, :]
            idx = base[:, None] + sp[None, :]
            mx = tl.load(ml_part + idx * 2, mask=ok, other=float("-inf"), cache_modifier=".cg")
            sm = tl.load(ml_part + idx * 2 + 1, mask=ok, other=0.0, cache_modifier=".cg")
            o = tl.load(o_part + idx[:, :, None] * HEAD_DIM + d[None, None, :],
                        mask=ok[:, :, None], other=0.0, cache_modifier=".cg")
            new_top = tl.where(heads_ok, tl.maximum(top, tl.max(mx, 1)), 0.0)
            keep = tl.exp(top - new_top)
            wt = tl.exp(mx - new_top[:, None])
            den = den * keep + tl.sum(wt * sm, 1)
            num = num * keep[:, None] + tl.sum(wt[:, :, None] * o, 1)
            top = new_top
        den = tl.where(heads_ok, den, 1.0)
        o_off = (m.to(tl.int64) * NH + head0 + i[:, None]) * HEAD_DIM + d[None, :]
        tl.store(out + o_off, (num / den[:, None]).to(tl.bfloat16), mask=heads_ok[:, None])


@triton.jit
def llama_attn_prefill(q, k_cache, v_cache, pos, seq, out, M, NH, NKV, CAP, sm_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       USE_PDL: tl.constexpr):
    """Causal attention of BLOCK_M rows (one q head) over positions 0..pos[m] of
    sequence seq[0] (every row of the call is of that sequence)."""
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    _pdl_wait(USE_PDL)
    if (pid_m * BLOCK_M < M) & (head < NH):
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows_ok = rows < M
        d = tl.arange(0, HEAD_DIM)
        p = tl.load(pos + rows, mask=rows_ok, other=-1)
        sq = tl.load(seq)
        q_off = (rows.to(tl.int64)[:, None] * NH + head) * HEAD_DIM + d[None, :]
        qt = tl.load(q + q_off, mask=rows_ok[:, None], other=0.0)
        _pdl_launch(USE_PDL)
        hi = tl.minimum(tl.max(p, 0) + 1, CAP)
        g = head // (NH // NKV)
        kv = k_cache + (sq.to(tl.int64) * NKV + g) * CAP * HEAD_DIM
        vv = v_cache + (sq.to(tl.int64) * NKV + g) * CAP * HEAD_DIM
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for start in range(0, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            m_i, l_i, acc = _attend_tile(qt, kv, vv, n, n < hi, n[None, :] <= p[:, None], m_i,
                                         l_i, acc, sm_scale, HEAD_DIM)
        l_i = tl.where(rows_ok, l_i, 1.0)
        o_off = (rows.to(tl.int64)[:, None] * NH + head) * HEAD_DIM + d[None, :]
        tl.store(out + o_off, (acc / l_i[:, None]).to(tl.bfloat16), mask=rows_ok[:, None])


@triton.jit
def llama_proj_residual(x, w, h, part, counters, M, N, K,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SPLIT: tl.constexpr, STAGES: tl.constexpr, SWAP: tl.constexpr,
                        USE_PDL: tl.constexpr):
    """h[m, n] += Σ_k x[m, k] · w[n, k] (the o and down projections with the residual
    add). SPLIT == 1: each (m, n) is one program's, so the read-modify-write needs no
    atomics. SPLIT > 1 (more than one row; grid axis 2): program s of a tile sums the s-th
    of K's SPLIT runs of whole K tiles into part[s] (fp32 [SPLIT, M, N]), the
    last of the tile's SPLIT programs (counted in counters[tile], acq_rel after a CTA
    barrier) adding them in split order to h and resetting the counter: the same bits
    whichever program comes last, and SPLIT times the programs of a 2048-wide output."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    if SPLIT == 1:
        live = (pid_m * BLOCK_M < M) & (pid_n * BLOCK_N < N)
        cols_ok = (cols < N) & live
        wa0, unused, g0 = _w_first(w, cols, cols, cols_ok, x, K, False, False, BLOCK_K)
        first = pid_n * BLOCK_N
        _prefetch_rows(w, first, tl.where(live, tl.minimum(N - first, BLOCK_N), 0), K,
                       BLOCK_K, _PREFETCH_BYTES, USE_PDL, BLOCK_M)
        _pdl_wait(USE_PDL)
        if live:
            ok = rows_ok[:, None] & cols_ok[None, :]
            h_ptrs = h + rows.to(tl.int64)[:, None] * N + cols[None, :]
            if BLOCK_M < 16:  # a few values: read with x, off the critical path's end
                h_old = tl.load(h_ptrs, mask=ok, other=0.0)
            _pdl_launch_rows(USE_PDL, BLOCK_M)
            acc, _ = _project(x, pid_m * BLOCK_M, M, g0, x, 0.0, w, cols, cols, cols_ok, K,
                              wa0, wa0, False, False, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, SWAP)
            if BLOCK_M >= 16:
                h_old = tl.load(h_ptrs, mask=ok, other=0.0)
            # A padded grid's third axis (the proof doubles it) must write nothing. Checked
            # here, not in `live`: there, before the weights' loads, it cost 14 µs per
            # batch-1 step on the H200 (bench/llama_results/ab_s9.md).
            tl.store(h_ptrs, h_old + acc, mask=ok & (tl.program_id(2) == 0))
    else:
        tl.static_assert(BLOCK_M > 1, "split K is for more than one row")
        pid_s = tl.program_id(2)
        live = (pid_m * BLOCK_M < M) & (pid_n * BLOCK_N < N) & (pid_s < SPLIT)
        cols_ok = (cols < N) & live
        per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT) * BLOCK_K
        lo = pid_s * per
        w0 = _k_tile(w, cols, cols_ok, lo, K, BLOCK_K)
        _pdl_wait(USE_PDL)
        if live:
            ok = rows_ok[:, None] & cols_ok[None, :]
            x_base = rows.to(tl.int64)[:, None] * K
            kk = tl.arange(0, BLOCK_K)
            xt = tl.load(x + x_base + (lo + kk)[None, :],
                         mask=rows_ok[:, None] & (lo + kk < K)[None, :], other=0.0)
            acc = _acc_first(xt, w0, BLOCK_M, SWAP)
            for k0 in tl.range(lo + BLOCK_K, tl.minimum(lo + per, K), BLOCK_K,
                               num_stages=STAGES):
                xt = tl.load(x + x_base + (k0 + kk)[None, :],
                             mask=rows_ok[:, None] & (k0 + kk < K)[None, :], other=0.0)
                acc = _acc_mac(acc, xt, _k_tile(w, cols, cols_ok, k0, K, BLOCK_K), BLOCK_M,
                               SWAP)
            out = _acc_sum(acc, BLOCK_M, SWAP)
            rows64 = rows.to(tl.int64)
            tl.store(part + (pid_s * M + rows64)[:, None] * N + cols[None, :], out, mask=ok)
            tl.debug_barrier()
            counter = counters + pid_m * tl.cdiv(N, BLOCK_N) + pid_n
            done = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if done == SPLIT - 1:
                total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for s in tl.static_range(SPLIT):
                    total += tl.load(part + (s * M + rows64)[:, None] * N + cols[None, :],
                                     mask=ok, other=0.0, cache_modifier=".cg")
                h_ptrs = h + rows64[:, None] * N + cols[None, :]
                tl.store(h_ptrs, tl.load(h_ptrs, mask=ok, other=0.0) + total, mask=ok)
                tl.store(counter, 0)


@triton.jit
def llama_gate_up(h, xn, norm_w, w, out, M, H, I, eps,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  STAGES: tl.constexpr, SWAP: tl.constexpr, USE_PDL: tl.constexpr):
    """out[m, n] = bf16(silu(g) · u), g and u the gate and up projections (rows n and
    I + n of w) of rmsnorm(h[m], norm_w): computed here at one row, read from xn
    (llama_rmsnorm's) at more."""
    NORM: tl.constexpr = BLOCK_M == 1
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    live = (pid_m * BLOCK_M < M) & (pid_n * BLOCK_N < I)
    cols_ok = (cols < I) & live
    wa0, wb0, g0 = _w_first(w, cols, cols + I, cols_ok, norm_w, H, True, NORM, BLOCK_K)
    first = pid_n * BLOCK_N
    count = tl.where(live, tl.minimum(I - first, BLOCK_N), 0)
    _prefetch_rows(w, first, count, H, BLOCK_K, _PREFETCH_BYTES // 2, USE_PDL, BLOCK_M)
    _prefetch_rows(w, first + I, count, H, BLOCK_K, _PREFETCH_BYTES // 2, USE_PDL, BLOCK_M)
    _pdl_wait(USE_PDL)
    if live:
        _pdl_launch_rows(USE_PDL, BLOCK_M)
        gate, up = _project(h if NORM else xn, pid_m * BLOCK_M, M, g0, norm_w, eps, w, cols,
                            cols + I, cols_ok, H, wa0, wb0, NORM, True, BLOCK_M, BLOCK_N,
                            BLOCK_K, STAGES, SWAP)
        act = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out + rows.to(tl.int64)[:, None] * I + cols[None, :], act.to(tl.bfloat16),
                 mask=rows_ok[:, None] & cols_ok[None, :])


@triton.jit
def llama_lm_head(h, xn, norm_w, w, logits, part_max, part_idx, counters, tokens, pos,
                  M, V, H, eps, advance, keep_logits,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  STAGES: tl.constexpr, SWAP: tl.constexpr, FLAT: tl.constexpr,
                  USE_PDL: tl.constexpr):
    """logits = rmsnorm(h, norm_w) · wᵀ and the greedy token: each program writes its
    rows' max and first argmax; the last of the cdiv(V, BLOCK_N) programs of a block of
    rows (counted in counters[its first row]) reduces them in program order, writes
    tokens[m], adds `advance` to pos[m] and resets the counter. keep_logits 0 leaves
    logits untouched (the same token: an engine that does not read the logits saves
    their M·V·4 bytes of stores); nonzero writes them. A program of more
    vocabulary rows than one _LM_TILE-element tile holds takes them tile by tile: at one
    row streamed (_lm_head_stream), at more one tl.dot tile after another
    (_lm_head_block; with FLAT, _lm_head_flat: the tiles and their K loops as one
    pipelined loop). One row normalizes h itself; more read xn (llama_rmsnorm's)."""
    TILE_N: tl.constexpr = _LM_TILE // BLOCK_K if BLOCK_K < _LM_TILE else 1
    STREAM: tl.constexpr = BLOCK_N > TILE_N if BLOCK_M == 1 else False
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    if STREAM:
        _lm_head_stream(h, norm_w, w, logits, part_max, part_idx, counters, tokens, pos,
                        M, V, H, eps, advance, keep_logits != 0, pid_n, pid_m, BLOCK_N,
                        BLOCK_K, TILE_N, STAGES, USE_PDL)
    elif FLAT:
        _lm_head_flat(xn, w, logits, part_max, part_idx, counters, tokens, pos, M, V, H,
                      advance, keep_logits != 0, pid_n, pid_m, BLOCK_M, BLOCK_N, BLOCK_K,
                      TILE_N, STAGES, SWAP, USE_PDL)
    else:
        _lm_head_block(h if BLOCK_M == 1 else xn, norm_w, w, logits, part_max, part_idx,
                       counters, tokens, pos, M, V, H, eps, advance, keep_logits != 0, pid_n,
                       pid_m, BLOCK_M, BLOCK_N, BLOCK_K, TILE_N, STAGES, SWAP, USE_PDL)


@triton.jit
def _lm_head_block(x, norm_w, w, logits, part_max, part_idx, counters, tokens, pos,
                   M, V, H, eps, advance, keep, pid_n, pid_m,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   TILE_N: tl.constexpr, STAGES: tl.constexpr, SWAP: tl.constexpr,
                   USE_PDL: tl.constexpr):
    """The LM head of rows pid_m·BLOCK_M .. + BLOCK_M over vocabulary rows pid_n·BLOCK_N
    .. + BLOCK_N (_project); x the fp32 residual stream at one row (normalized here),
    llama_rmsnorm's bf16 rows at more; logits written when keep. At one row all BLOCK_N at
    once; at more, a program of more rows than one _LM_TILE-element tile (TILE_N rows)
    holds computes them tile by tile, keeping its rows' best: fewer programs, so fewer
    partials for the last one to reduce and fewer counter increments (4008 programs at
    BLOCK_N 32 spent about 40 µs of the LM head's 178 at batch 4 on the H200, against a
    plain GEMM of its weights)."""
    NORM: tl.constexpr = BLOCK_M == 1
    TILE: tl.constexpr = TILE_N if (BLOCK_M > 1 and BLOCK_N > TILE_N) else BLOCK_N
    n_prog = tl.cdiv(V, BLOCK_N)
    row0 = pid_n * BLOCK_N
    cols = row0 + tl.arange(0, TILE)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    kept = rows_ok & keep  # the rows whose logits are written
    live = (pid_m * BLOCK_M < M) & (pid_n < n_prog)
    cols_ok = (cols < V) & live
    wa0, unused, g0 = _w_first(w, cols, cols, cols_ok, norm_w, H, False, NORM, BLOCK_K)
    _prefetch_rows(w, row0, tl.where(live, tl.minimum(V - row0, BLOCK_N), 0), H, BLOCK_K,
                   _PREFETCH_BYTES, USE_PDL, BLOCK_M)
    _pdl_wait(USE_PDL)
    if live:
        _pdl_launch_rows(USE_PDL, BLOCK_M)
        y, _ = _project(x, pid_m * BLOCK_M, M, g0, norm_w, eps, w, cols, cols, cols_ok, H, wa0,
                        wa0, NORM, False, BLOCK_M, TILE, BLOCK_K, STAGES, SWAP)
        rows64 = rows.to(tl.int64)
        tl.store(logits + rows64[:, None] * V + cols[None, :], y,
                 mask=kept[:, None] & cols_ok[None, :])
        best, first = _rows_tile_best(y, cols, cols_ok, tl.zeros([BLOCK_M], tl.float32),
                                      tl.zeros([BLOCK_M], tl.int32), True)
        if TILE < BLOCK_N:
            end = tl.minimum(row0 + BLOCK_N, V)
            for t0 in range(row0 + TILE, end, TILE):
                cols = t0 + tl.arange(0, TILE)
                ok = cols < end
                wt0 = _k_tile(w, cols, ok, 0, H, BLOCK_K)
                y, _ = _project(x, pid_m * BLOCK_M, M, g0, norm_w, eps, w, cols, cols, ok, H,
                                wt0, wt0, NORM, False, BLOCK_M, TILE, BLOCK_K, STAGES, SWAP)
                tl.store(logits + rows64[:, None] * V + cols[None, :], y,
                         mask=kept[:, None] & ok[None, :])
                best, first = _rows_tile_best(y, cols, ok, best, first, False)
        tl.store(part_max + rows64 * V + pid_n, best, mask=rows_ok)
        tl.store(part_idx + rows64 * V + pid_n, first, mask=rows_ok)
        _lm_head_count(part_max, part_idx, counters, tokens, pos, rows, rows_ok, V, n_prog,
                       advance, pid_m * BLOCK_M, BLOCK_M)


@triton.jit
def _lm_head_flat(x, w, logits, part_max, part_idx, counters, tokens, pos, M, V, H, advance,
                  keep, pid_n, pid_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, TILE_N: tl.constexpr, STAGES: tl.constexpr,
                  SWAP: tl.constexpr, USE_PDL: tl.constexpr):
    """_lm_head_block's work above one row (x llama_rmsnorm's bf16 rows), its vocabulary
    rows in tiles of TILE_N, as one loop nest that Triton flattens (tl.range's flatten):
    the tiles' K loops and their epilogues (logits, the running argmax) become one
    pipelined loop, so the weight loads of the next tile are in flight while a tile's
    epilogue runs, where _lm_head_block starts each tile's K pipeline anew. Nothing is
    read before gdc_wait (the loop's first loads belong to its pipeline). The same sums
    in the same K order as _lm_head_block (tl.dot from a zero accumulator)."""
    tl.static_assert(BLOCK_M >= 16, "FLAT is for tl.dot tiles (BLOCK_M >= 16)")
    TILE: tl.constexpr = TILE_N if BLOCK_N > TILE_N else BLOCK_N
    n_prog = tl.cdiv(V, BLOCK_N)
    row0 = pid_n * BLOCK_N
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    kept = rows_ok & keep  # the rows whose logits are written
    live = (pid_m * BLOCK_M < M) & (pid_n < n_prog)
    _pdl_wait(USE_PDL)
    if live:
        rows64 = rows.to(tl.int64)
        best = tl.full([BLOCK_M], float("-inf"), tl.float32)
        first = tl.zeros([BLOCK_M], tl.int32)
        end = tl.minimum(row0 + BLOCK_N, V)
        for t0 in tl.range(row0, end, TILE, flatten=True):
            cols = t0 + tl.arange(0, TILE)
            ok = cols < end
            if SWAP:
                acc = tl.zeros([TILE, BLOCK_M], tl.float32)
            else:
                acc = tl.zeros([BLOCK_M, TILE], tl.float32)
            for k0 in tl.range(0, H, BLOCK_K, num_stages=STAGES):
                acc = _acc_mac(acc, _k_tile(x, rows, rows_ok, k0, H, BLOCK_K),
                               _k_tile(w, cols, ok, k0, H, BLOCK_K), BLOCK_M, SWAP)
            y = _acc_sum(acc, BLOCK_M, SWAP)
            tl.store(logits + rows64[:, None] * V + cols[None, :], y,
                     mask=kept[:, None] & ok[None, :])
            best, first = _rows_tile_best(y, cols, ok, best, first, t0 == row0)
        tl.store(part_max + rows64 * V + pid_n, best, mask=rows_ok)
        tl.store(part_idx + rows64 * V + pid_n, first, mask=rows_ok)
        _lm_head_count(part_max, part_idx, counters, tokens, pos, rows, rows_ok, V, n_prog,
                       advance, pid_m * BLOCK_M, BLOCK_M)


@triton.jit
def _lm_head_count(part_max, part_idx, counters, tokens, pos, rows, rows_ok, V, n_prog,
                   advance, first_row, BLOCK_M: tl.constexpr):
    """After a program's partials: count it in counters[first_row] (acq_rel, after a CTA
    barrier); the program that brings it to n_prog reduces all partials and resets it.
    One counter per block of rows: the programs of a block finish all its rows together;
    a scalar atomic is one thread's, its result the CTA's."""
    tl.debug_barrier()
    counter = counters + first_row
    done = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if done == n_prog - 1:
        _argmax_finish(part_max, part_idx, tokens, pos, rows, rows_ok, V, n_prog, advance,
                       BLOCK_M)
        tl.store(counter, 0)


@triton.jit
def _rows_tile_best(y, cols, ok, best, first, always):
    """Each row's (best, first) after the tile y [BLOCK_M, TILE] of vocabulary rows cols
    (those ok): the tile's max and first index of it replace them when strictly larger,
    so the first index of the maximum is kept, or when `always` (a program's first tile:
    its values as they are, -inf and NaN too)."""
    y = tl.where(ok[None, :], y, float("-inf"))
    top = tl.max(y, 1)
    at = tl.min(tl.where(y == top[:, None], cols[None, :], _INT32_MAX), 1)
    take = (top > best) | always
    return tl.where(take, top, best), tl.where(take, at, first)


@triton.jit
def _tile_best(y, rows, ok, best, first):
    """(best, first) over the values y of vocabulary rows `rows` (those `ok`) after the
    previous tiles' (best, first): a later tile replaces them only when strictly larger,
    so the first index of the maximum is kept."""
    y = tl.where(ok, y, float("-inf"))
    top = tl.max(y, 0)
    at = tl.min(tl.where(y == top, rows, _INT32_MAX), 0)
    take = top > best
    return tl.where(take, top, best), tl.where(take, at, first)


@triton.jit
def _dot_rest(y, h, m, r, norm_w, w, rows, ok, H, BLOCK_K: tl.constexpr):
    """y + the columns [BLOCK_K, H) of rmsnorm(h[m]) · w[rows]ᵀ (nothing when BLOCK_K
    covers H)."""
    cols = tl.arange(0, BLOCK_K)
    for k0 in range(BLOCK_K, H, BLOCK_K):
        xv = _row_tile(h, m, m + 1, r, tl.load(norm_w + k0 + cols, mask=k0 + cols < H,
                                                other=0.0), k0, H, True, BLOCK_K)
        wt = _k_tile(w, rows, ok, k0, H, BLOCK_K)
        y += tl.sum(xv.to(tl.float32)[None, :] * wt.to(tl.float32), 1)
    return y


@triton.jit
def _lm_head_stream(h, norm_w, w, logits, part_max, part_idx, counters, tokens, pos,
                    M, V, H, eps, advance, keep, pid_n, m,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TILE_N: tl.constexpr,
                    STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """The LM head of row m over vocabulary rows pid_n·BLOCK_N .. + BLOCK_N, TILE_N rows
    at a time: the normalized row computed once and kept, the weight tiles streamed
    through a pipelined loop (STAGES deep; the first one loaded before gdc_wait, the next
    ones prefetched into L2), so one program keeps a few tiles in flight from its start to
    its end and pays the row's load, its norm and the counter once for BLOCK_N rows; the
    logits written when keep."""
    n_prog = tl.cdiv(V, BLOCK_N)
    live = (m < M) & (pid_n < n_prog)
    row0 = pid_n * BLOCK_N
    tr = tl.arange(0, TILE_N)
    cols = tl.arange(0, BLOCK_K)
    rows = row0 + tr
    ok = (rows < V) & live
    w0 = _k_tile(w, rows, ok, 0, H, BLOCK_K)
    g0 = tl.load(norm_w + cols, mask=cols < H, other=0.0)
    if USE_PDL:
        end = tl.minimum(row0 + BLOCK_N, V)
        if live & (end > row0 + TILE_N):
            _prefetch_span(w, row0 + TILE_N, end, H, _PREFETCH_BYTES)
    _pdl_wait(USE_PDL)
    if live:
        _pdl_launch(USE_PDL)
        xf = tl.load(h + m.to(tl.int64) * H + cols, mask=cols < H, other=0.0)
        r = _rstd_row(xf, h, m, True, H, eps, BLOCK_K)
        xn = _normed_row(xf, r, g0).to(tl.float32)
        y = _dot_rest(tl.sum(xn[None, :] * w0.to(tl.float32), 1), h, m, r, norm_w, w, rows,
                      ok, H, BLOCK_K)
        out = logits + m.to(tl.int64) * V
        tl.store(out + rows, y, mask=ok & keep)
        best, first = _tile_best(y, rows, ok, float("-inf"), 0)
        end = tl.minimum(row0 + BLOCK_N, V)
        if H <= BLOCK_K:  # the row in one tile: a loop with no inner loop, pipelined
            for t0 in tl.range(row0 + TILE_N, end, TILE_N, num_stages=STAGES):
                rows = t0 + tr
                ok = rows < end
                y = tl.sum(xn[None, :] * _k_tile(w, rows, ok, 0, H, BLOCK_K).to(tl.float32),
                           1)
                tl.store(out + rows, y, mask=ok & keep)
                best, first = _tile_best(y, rows, ok, best, first)
        else:
            for t0 in range(row0 + TILE_N, end, TILE_N):
                rows = t0 + tr
                ok = rows < end
                y = tl.sum(xn[None, :] * _k_tile(w, rows, ok, 0, H, BLOCK_K).to(tl.float32),
                           1)
                y = _dot_rest(y, h, m, r, norm_w, w, rows, ok, H, BLOCK_K)
                tl.store(out + rows, y, mask=ok & keep)
                best, first = _tile_best(y, rows, ok, best, first)
        one = tl.arange(0, 1)
        tl.store(part_max + m.to(tl.int64) * V + pid_n + one, tl.zeros([1], tl.float32) + best)
        tl.store(part_idx + m.to(tl.int64) * V + pid_n + one, tl.zeros([1], tl.int32) + first)
        _lm_head_count(part_max, part_idx, counters, tokens, pos, m + one, one == 0, V,
                       n_prog, advance, m, 1)


@triton.jit
def _argmax_finish(part_max, part_idx, tokens, pos, rows, last, V, n_prog, advance,
                   BLOCK_M: tl.constexpr):
    """For the rows in `last`: the max over the n_prog partials (read through L2), the
    smallest index among equal maxima; token out, position advanced."""
    CHUNK: tl.constexpr = _ARGMAX_CHUNK // BLOCK_M
    base = rows.to(tl.int64)[:, None] * V
    best = tl.full([BLOCK_M], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_M], tl.int32)
    for p0 in tl.range(0, n_prog, CHUNK, loop_unroll_factor=2):
        pp = p0 + tl.arange(0, CHUNK)
        ok = last[:, None] & (pp < n_prog)[None, :]
        vals = tl.load(part_max + base + pp[None, :], mask=ok, other=float("-inf"),
                       cache_modifier=".cg")
        idx = tl.load(part_idx + base + pp[None, :], mask=ok, other=_INT32_MAX,
                      cache_modifier=".cg")
        top = tl.max(vals, 1)
        top_idx = tl.min(tl.where(vals == top[:, None], idx, _INT32_MAX), 1)
        take = top > best
        best_idx = tl.where(take, top_idx, best_idx)
        best = tl.where(take, top, best)
    tl.store(tokens + rows, best_idx, mask=last)
    tl.store(pos + rows, tl.load(pos + rows, mask=last, other=0) + advance, mask=last)
