"""Triton kernels of the Llama decode engine (the contract: ``docs/llama.md``).

Eight pack kernels from seven functions: ``llama_embed``, ``llama_qkv_rope`` (RMSNorm in
the prologue, RoPE and the KV-cache append in the epilogue), ``llama_attn_decode``
(split-KV GQA decode attention, the last split combining), ``llama_attn_prefill``
(causal GQA attention), ``llama_proj_residual`` (``llama_o_proj`` and ``llama_down_proj``:
projection plus the residual add), ``llama_gate_up`` (RMSNorm prologue, SwiGLU
epilogue) and ``llama_lm_head`` (final RMSNorm, logits and the greedy argmax, the last
program reducing).

How they are written:

- Every count comes from the size arguments, never from ``tl.num_programs``; a program
  past them touches no memory (a padded grid gives the same bits). Offsets into tensors
  are int64.
- Projections accumulate in fp32 over bf16 operands. ``BLOCK_M == 1`` (batch 1: a GEMV)
  and ``BLOCK_M < 16`` (small batches) multiply and add elementwise on a
  ``[BLOCK_N, BLOCK_K]`` (or ``[BLOCK_M, BLOCK_N, BLOCK_K]``) tile and reduce over K once
  at the end; ``BLOCK_M >= 16`` uses ``tl.dot``. The K loop is software-pipelined
  (``tl.range(num_stages=STAGES)``: Triton pipelines loops without a dot only when asked).
- No float atomics: the two cross-program reductions (decode-attention splits, the LM
  head's argmax) write partials and the program that brings an int32 counter to its
  target (acq_rel, after a CTA barrier) reduces them in a fixed order and resets the
  counter, so results are the same bits on every run whichever program comes last.
- Programmatic dependent launch behind the constexpr ``USE_PDL`` (off in the
  interpreter, which cannot run inline PTX): a program may prefetch its weights into L2
  (weights are never written), then ``gdc_wait()`` before touching anything a previous
  kernel may write, and ``gdc_launch_dependents()`` once its dependent reads are issued.
  Both are no-ops when the launch has no PDL attribute, so the kernels are correct either
  way. Every program calls ``gdc_wait()`` (also the ones that then return), so no kernel
  can complete before the one it follows.
"""

import triton
import triton.language as tl

# Bytes of its weight rows a projection program prefetches into L2 before gdc_wait.
_PREFETCH_BYTES = tl.constexpr(16384)
# Elements of argmax partials the LM head's last program reads per row and iteration.
_ARGMAX_CHUNK = tl.constexpr(4096)
# Elements of attention partials ([heads, splits, HEAD_DIM]) the combine reads at once.
_COMBINE_CHUNK = tl.constexpr(8192)
_INT32_MAX = tl.constexpr(2147483647)
# Elements of the fp32 residual stream the RMSNorm prologue reads per iteration.
_RSTD_CHUNK = tl.constexpr(4096)


@triton.jit
def _prefetch_l2(ptrs):
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_rows(w, rows, rows_ok, K, BLOCK_N: tl.constexpr, BYTES: tl.constexpr):
    """Prefetch into L2 the first BYTES // BLOCK_N bytes of each of the BLOCK_N weight
    rows (bf16, row length K), one 128-byte line per element."""
    LINES: tl.constexpr = BYTES // (BLOCK_N * 128)
    tl.static_assert(LINES >= 1, "prefetch: BLOCK_N * 128 must not exceed BYTES")
    cols = tl.arange(0, LINES) * 64
    ok = rows_ok[:, None] & (cols[None, :] < K)
    _prefetch_l2(w + tl.where(ok, rows.to(tl.int64)[:, None] * K + cols[None, :], 0))


@triton.jit
def _pdl_wait(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def _pdl_launch(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _rstd(h, rows, rows_ok, H, eps, BLOCK_M: tl.constexpr, STAGES: tl.constexpr):
    """1 / sqrt(mean(h[m]^2) + eps) per row of the fp32 residual stream: 16 KB of h per
    iteration, the loads pipelined (this pass is on every program's critical path)."""
    CHUNK: tl.constexpr = _RSTD_CHUNK // BLOCK_M
    acc = tl.zeros([BLOCK_M, CHUNK], tl.float32)
    base = rows.to(tl.int64)[:, None] * H
    for k0 in tl.range(0, H, CHUNK, num_stages=STAGES):
        cols = k0 + tl.arange(0, CHUNK)
        x = tl.load(h + base + cols[None, :], mask=rows_ok[:, None] & (cols < H)[None, :],
                    other=0.0)
        acc += x * x
    mean = tl.div_rn(tl.sum(acc, 1), H.to(tl.float32))
    return tl.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), tl.sqrt_rn(mean + eps))


@triton.jit
def _acc_zeros(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    if BLOCK_M >= 16:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    elif BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    return acc


@triton.jit
def _acc_mac(acc, x, w, BLOCK_M: tl.constexpr):
    """acc += x · wᵀ for x [BLOCK_M, BLOCK_K] bf16, w [BLOCK_N, BLOCK_K] bf16: tl.dot from
    16 rows; below, elementwise products kept per k (reduced once, in _acc_sum)."""
    if BLOCK_M >= 16:
        acc = tl.dot(x, tl.trans(w), acc)
    elif BLOCK_M == 1:
        acc += x.to(tl.float32) * w.to(tl.float32)
    else:
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _acc_sum(acc, BLOCK_M: tl.constexpr):
    """The [BLOCK_M, BLOCK_N] fp32 result of an accumulator."""
    if BLOCK_M >= 16:
        out = acc
    elif BLOCK_M == 1:
        out = tl.sum(acc, 1)[None, :]
    else:
        out = tl.sum(acc, 2)
    return out


@triton.jit
def _project(xsrc, rows, rows_ok, r, norm_w, w, wrows_a, wrows_b, wrows_ok, K,
             NORM: tl.constexpr, TWO: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """(x · w[wrows_a]ᵀ, x · w[wrows_b]ᵀ) as [BLOCK_M, BLOCK_N] fp32 for the rows of x:
    x = rmsnorm(xsrc, norm_w) with rstd r when NORM (xsrc the fp32 residual stream), else
    xsrc itself (bf16). Without TWO only the first is computed (returned twice)."""
    offs_k = tl.arange(0, BLOCK_K)
    x_base = rows.to(tl.int64)[:, None] * K
    wa = w + wrows_a.to(tl.int64)[:, None] * K + offs_k[None, :]
    wb = w + wrows_b.to(tl.int64)[:, None] * K + offs_k[None, :]
    acc_a = _acc_zeros(BLOCK_M, BLOCK_N, BLOCK_K)
    acc_b = _acc_zeros(BLOCK_M, BLOCK_N, BLOCK_K)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        cols = k0 + offs_k
        cols_ok = cols < K
        x_ok = rows_ok[:, None] & cols_ok[None, :]
        if NORM:
            xf = tl.load(xsrc + x_base + cols[None, :], mask=x_ok, other=0.0)
            g = tl.load(norm_w + cols, mask=cols_ok, other=0.0).to(tl.float32)
            x = ((xf * r[:, None]).to(tl.bfloat16).to(tl.float32) * g[None, :]).to(tl.bfloat16)
        else:
            x = tl.load(xsrc + x_base + cols[None, :], mask=x_ok, other=0.0)
        w_ok = wrows_ok[:, None] & cols_ok[None, :]
        acc_a = _acc_mac(acc_a, x, tl.load(wa + k0, mask=w_ok, other=0.0), BLOCK_M)
        if TWO:
            acc_b = _acc_mac(acc_b, x, tl.load(wb + k0, mask=w_ok, other=0.0), BLOCK_M)
    out_a = _acc_sum(acc_a, BLOCK_M)
    if TWO:
        out_b = _acc_sum(acc_b, BLOCK_M)
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
def llama_qkv_rope(h, norm_w, w, inv_freq, pos, seq, q, k_cache, v_cache,
                   M, H, NH, NKV, CAP, eps,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr,
                   BLOCK_K: tl.constexpr, STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """rmsnorm -> the q, k, v projections -> RoPE on q and k -> q, and k, v appended to
    the cache at [seq[m], kv head, pos[m]]. A program owns BLOCK_J row pairs (j, j + D/2)
    of the heads, so it rotates what it computed."""
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
    if USE_PDL:
        _prefetch_rows(w, row_a, pairs_ok, H, BLOCK_J, _PREFETCH_BYTES // 2)
        _prefetch_rows(w, row_b, pairs_ok, H, BLOCK_J, _PREFETCH_BYTES // 2)
    _pdl_wait(USE_PDL)
    if live:
        r = _rstd(h, rows, rows_ok, H, eps, BLOCK_M, STAGES)
        p = tl.load(pos + rows, mask=rows_ok, other=0)
        s = tl.load(seq + rows, mask=rows_ok, other=0)
        _pdl_launch(USE_PDL)
        a, b = _project(h, rows, rows_ok, r, norm_w, w, row_a, row_b, pairs_ok, H,
                        True, True, BLOCK_M, BLOCK_J, BLOCK_K, STAGES)
        freq = tl.load(inv_freq + j, mask=pairs_ok, other=0.0)
        angle = p.to(tl.float32)[:, None] * freq[None, :]
        c = tl.cos(angle)
        sn = tl.sin(angle)
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
def llama_attn_decode(q, k_cache, v_cache, pos, seq, o_part, ml_part, counters, out,
                      M, NH, NKV, CAP, S, sm_scale,
                      HEAD_DIM: tl.constexpr, GROUP_BLOCK: tl.constexpr,
                      BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr):
    """Split s of S of row m's attention for the q heads of kv head g, each K/V tile read
    once for all of them; the last split to finish combines (S == 1: no partials)."""
    split = tl.program_id(0)
    g = tl.program_id(1)
    m = tl.program_id(2)
    _pdl_wait(USE_PDL)
    if (split < S) & (g < NKV) & (m < M):
        group = NH // NKV
        i = tl.arange(0, GROUP_BLOCK)
        heads = g * group + i
        heads_ok = i < group
        d = tl.arange(0, HEAD_DIM)
        length = tl.load(pos + m) + 1
        sq = tl.load(seq + m)
        q_off = (m.to(tl.int64) * NH + heads[:, None]) * HEAD_DIM + d[None, :]
        qt = tl.load(q + q_off, mask=heads_ok[:, None], other=0.0)
        _pdl_launch(USE_PDL)
        chunk = tl.cdiv(tl.cdiv(length, S), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(lo + chunk, tl.minimum(length, CAP))
        kv = k_cache + (sq.to(tl.int64) * NKV + g) * CAP * HEAD_DIM
        vv = v_cache + (sq.to(tl.int64) * NKV + g) * CAP * HEAD_DIM
        m_i = tl.full([GROUP_BLOCK], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_BLOCK], tl.float32)
        acc = tl.zeros([GROUP_BLOCK, HEAD_DIM], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            n_ok = n < hi
            kv_off = n.to(tl.int64)[:, None] * HEAD_DIM + d[None, :]
            kt = tl.load(kv + kv_off, mask=n_ok[:, None], other=0.0)
            s = tl.dot(qt, tl.trans(kt)) * sm_scale
            s = tl.where(n_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            pr = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(pr, 1)
            vt = tl.load(vv + kv_off, mask=n_ok[:, None], other=0.0)
            acc = _pv(acc * alpha[:, None], pr, vt)
            m_i = m_new
        o_off = (m.to(tl.int64) * NH + heads[:, None]) * HEAD_DIM + d[None, :]
        if S == 1:
            o = acc / l_i[:, None]
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
            if done == S - 1:
                _attn_combine(o_part, ml_part, out, m, heads, heads_ok, NH, S, o_off,
                              HEAD_DIM, GROUP_BLOCK)
                tl.store(counter, 0)


@triton.jit
def _attn_combine(o_part, ml_part, out, m, heads, heads_ok, NH, S, o_off,
                  HEAD_DIM: tl.constexpr, GROUP_BLOCK: tl.constexpr):
    """out = Σ_s o_s e^(m_s - M) / Σ_s l_s e^(m_s - M) over the S splits' partials (read
    through L2: other programs wrote them), in a fixed order."""
    SPLITS: tl.constexpr = _COMBINE_CHUNK // (GROUP_BLOCK * HEAD_DIM)
    base = (m.to(tl.int64) * NH + heads) * S
    d = tl.arange(0, HEAD_DIM)
    top = tl.full([GROUP_BLOCK], float("-inf"), tl.float32)
    for s0 in range(0, S, 32):
        sp = s0 + tl.arange(0, 32)
        ok = heads_ok[:, None] & (sp < S)[None, :]
        mx = tl.load(ml_part + (base[:, None] + sp[None, :]) * 2, mask=ok,
                     other=float("-inf"), cache_modifier=".cg")
        top = tl.maximum(top, tl.max(mx, 1))
    top = tl.where(heads_ok, top, 0.0)
    den = tl.zeros([GROUP_BLOCK], tl.float32)
    num = tl.zeros([GROUP_BLOCK, HEAD_DIM], tl.float32)
    for s0 in range(0, S, SPLITS):
        sp = s0 + tl.arange(0, SPLITS)
        ok = heads_ok[:, None] & (sp < S)[None, :]
        idx = base[:, None] + sp[None, :]
        mx = tl.load(ml_part + idx * 2, mask=ok, other=float("-inf"), cache_modifier=".cg")
        sm = tl.load(ml_part + idx * 2 + 1, mask=ok, other=0.0, cache_modifier=".cg")
        wt = tl.where(mx > float("-inf"), tl.exp(mx - top[:, None]), 0.0)
        den += tl.sum(wt * sm, 1)
        o = tl.load(o_part + idx[:, :, None] * HEAD_DIM + d[None, None, :],
                    mask=ok[:, :, None], other=0.0, cache_modifier=".cg")
        num += tl.sum(wt[:, :, None] * o, 1)
    den = tl.where(heads_ok, den, 1.0)
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
            n_ok = n < hi
            kv_off = n.to(tl.int64)[:, None] * HEAD_DIM + d[None, :]
            kt = tl.load(kv + kv_off, mask=n_ok[:, None], other=0.0)
            s = tl.dot(qt, tl.trans(kt)) * sm_scale
            s = tl.where(n[None, :] <= p[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            pr = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(pr, 1)
            vt = tl.load(vv + kv_off, mask=n_ok[:, None], other=0.0)
            acc = _pv(acc * alpha[:, None], pr, vt)
            m_i = m_new
        l_i = tl.where(rows_ok, l_i, 1.0)
        o_off = (rows.to(tl.int64)[:, None] * NH + head) * HEAD_DIM + d[None, :]
        tl.store(out + o_off, (acc / l_i[:, None]).to(tl.bfloat16), mask=rows_ok[:, None])


@triton.jit
def llama_proj_residual(x, w, h, M, N, K,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """h[m, n] += Σ_k x[m, k] · w[n, k] (the o and down projections with the residual
    add; each (m, n) is one program's, so the read-modify-write needs no atomics)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    live = (pid_m * BLOCK_M < M) & (pid_n * BLOCK_N < N)
    cols_ok = (cols < N) & live
    if USE_PDL:
        _prefetch_rows(w, cols, cols_ok, K, BLOCK_N, _PREFETCH_BYTES)
    _pdl_wait(USE_PDL)
    if live:
        _pdl_launch(USE_PDL)
        acc, _ = _project(x, rows, rows_ok, 0.0, x, w, cols, cols, cols_ok, K,
                          False, False, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
        ok = rows_ok[:, None] & cols_ok[None, :]
        h_ptrs = h + rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(h_ptrs, tl.load(h_ptrs, mask=ok, other=0.0) + acc, mask=ok)


@triton.jit
def llama_gate_up(h, norm_w, w, out, M, H, I, eps,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """out[m, n] = bf16(silu(g) · u), g and u the gate and up projections (rows n and
    I + n of w) of rmsnorm(h[m], norm_w)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    live = (pid_m * BLOCK_M < M) & (pid_n * BLOCK_N < I)
    cols_ok = (cols < I) & live
    if USE_PDL:
        _prefetch_rows(w, cols, cols_ok, H, BLOCK_N, _PREFETCH_BYTES // 2)
        _prefetch_rows(w, cols + I, cols_ok, H, BLOCK_N, _PREFETCH_BYTES // 2)
    _pdl_wait(USE_PDL)
    if live:
        r = _rstd(h, rows, rows_ok, H, eps, BLOCK_M, STAGES)
        _pdl_launch(USE_PDL)
        gate, up = _project(h, rows, rows_ok, r, norm_w, w, cols, cols + I, cols_ok, H,
                            True, True, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
        act = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out + rows.to(tl.int64)[:, None] * I + cols[None, :], act.to(tl.bfloat16),
                 mask=rows_ok[:, None] & cols_ok[None, :])


@triton.jit
def llama_lm_head(h, norm_w, w, logits, part_max, part_idx, counters, tokens, pos,
                  M, V, H, eps, advance,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """logits = rmsnorm(h, norm_w) · wᵀ and the greedy token: each program writes its
    rows' max and first argmax; the last of the cdiv(V, BLOCK_N) programs of a block of
    rows (counted in counters[its first row]) reduces them in program order, writes
    tokens[m], adds `advance` to pos[m] and resets the counter."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    n_prog = tl.cdiv(V, BLOCK_N)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    live = (pid_m * BLOCK_M < M) & (pid_n < n_prog)
    cols_ok = (cols < V) & live
    if USE_PDL:
        _prefetch_rows(w, cols, cols_ok, H, BLOCK_N, _PREFETCH_BYTES)
    _pdl_wait(USE_PDL)
    if live:
        r = _rstd(h, rows, rows_ok, H, eps, BLOCK_M, STAGES)
        _pdl_launch(USE_PDL)
        y, _ = _project(h, rows, rows_ok, r, norm_w, w, cols, cols, cols_ok, H,
                        True, False, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
        rows64 = rows.to(tl.int64)
        tl.store(logits + rows64[:, None] * V + cols[None, :], y,
                 mask=rows_ok[:, None] & cols_ok[None, :])
        y = tl.where(cols_ok[None, :], y, float("-inf"))
        best = tl.max(y, 1)
        first = tl.min(tl.where(y == best[:, None], cols[None, :], _INT32_MAX), 1)
        tl.store(part_max + rows64 * V + pid_n, best, mask=rows_ok)
        tl.store(part_idx + rows64 * V + pid_n, first, mask=rows_ok)
        tl.debug_barrier()
        # One counter per block of rows (its first row's): the programs of a block finish
        # all its rows together; a scalar atomic is one thread's, its result the CTA's.
        counter = counters + pid_m * BLOCK_M
        done = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if done == n_prog - 1:
            _argmax_finish(part_max, part_idx, tokens, pos, rows, rows_ok, V, n_prog,
                           advance, BLOCK_M)
            tl.store(counter, 0)


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
