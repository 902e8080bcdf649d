"""Example: fused attention forward (flash attention) on Hopper's TMA, through host
tensor descriptors.

``Q, K, V, O`` are ``[Z, H, N_CTX, 64]`` fp16 tensors passed as rank-4
``tensordesc`` parameters; per batch ``z`` and head ``h``:
``O = softmax(sm_scale * Q K^T (+ causal mask)) V`` in one pass over ``K``/``V``
(online softmax, fp32 statistics, exp2 with ``log2(e)`` folded into the
scale), and ``L[z, h, i] = log2(sum_j exp2(s_ij))`` in base-2 units (with
``s = sm_scale * log2(e) * Q K^T``), the row statistic a backward pass needs,
through a plain pointer.

One program per ``BLOCK_M`` query rows of one head: grid
``(cdiv(N_CTX, BLOCK_M), Z * H)``. The descriptors' blocks are
``[1, 1, BLOCK_M or BLOCK_N, 64]`` -- one head's rows -- so TMA clips every
tile to its own head: any ``N_CTX >= 1`` works, rows past ``N_CTX`` load as
zeros (their scores are masked to a large negative value) and are never
stored. Two pack kernels, each its own entry point around one body:
``attention_fwd`` and ``attention_fwd_causal``.
``aligned`` is what Triton's JIT compiles for ``N_CTX`` a multiple of 16 and
a 16-byte aligned ``L``.
"""

import triton
import triton.language as tl

from kpack_tools.spec import Config, KernelSpec, Specialization


@triton.jit
def _attention(sm_scale, L_ptr, Z, H, q_desc, k_desc, v_desc, o_desc, N_CTX,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    zh = tl.program_id(1)
    z = zh // H
    h = zh % H
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    scale = sm_scale * 1.4426950408889634  # exp(x) = exp2(x * log2(e))
    q = q_desc.load([z, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Causal: keys past this block's last query row contribute nothing.
    end_n = tl.minimum(N_CTX, start_m + BLOCK_M) if CAUSAL else N_CTX
    for start_n in range(0, end_n, BLOCK_N):
        k = k_desc.load([z, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        s = tl.dot(q, k.T) * scale
        keep = (start_n + cols)[None, :] < N_CTX
        if CAUSAL:
            keep = keep & (rows[:, None] >= (start_n + cols)[None, :])
        s = tl.where(keep, s, -1.0e6)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([z, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(L_ptr + zh.to(tl.int64) * N_CTX + rows, m_i + tl.math.log2(l_i), mask=rows < N_CTX)
    o_desc.store([z, h, start_m, 0], acc.to(tl.float16).reshape(1, 1, BLOCK_M, HEAD_DIM))


# Two entry points, so that each kernel has its own symbol (profilers, the CPU tests'
# emulators): the causal mask is compiled in.
@triton.jit
def attention_fwd(sm_scale, L_ptr, Z, H, q_desc, k_desc, v_desc, o_desc, N_CTX,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _attention(sm_scale, L_ptr, Z, H, q_desc, k_desc, v_desc, o_desc, N_CTX, HEAD_DIM,
               BLOCK_M, BLOCK_N, False)


@triton.jit
def attention_fwd_causal(sm_scale, L_ptr, Z, H, q_desc, k_desc, v_desc, o_desc, N_CTX,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    _attention(sm_scale, L_ptr, Z, H, q_desc, k_desc, v_desc, o_desc, N_CTX, HEAD_DIM,
               BLOCK_M, BLOCK_N, True)


CONFIGS = [
    Config("m64_n64_w4_s3", {"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    Config("m128_n64_w8_s3", {"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    Config("m128_n128_w8_s2", {"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=2),
]


def make_inputs(shape, device):
    import torch
    z, h, n = shape["Z"], shape["H"], shape["N_CTX"]
    gen = torch.Generator(device=device).manual_seed(6)
    q, k, v = (torch.randn(z, h, n, 64, device=device, generator=gen).to(torch.float16)
               for _ in range(3))
    return {"sm_scale": 0.125, "L_ptr": torch.empty(z * h * n, device=device),
            "Z": z, "H": h, "q_desc": q, "k_desc": k, "v_desc": v,
            "o_desc": torch.empty_like(q), "N_CTX": n}


def _reference(causal):
    def reference(args):
        import math

        import torch
        q, k, v = (args[name].double() for name in ("q_desc", "k_desc", "v_desc"))
        s = (q @ k.transpose(-1, -2)) * args["sm_scale"]
        if causal:
            n = s.shape[-1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1),
                              float("-inf"))
        return {"o_desc": (torch.softmax(s, -1) @ v).to(torch.float16),
                "L_ptr": (torch.logsumexp(s, -1) / math.log(2)).reshape(-1).float()}
    return reference


def _spec(name, fn, causal):
    return KernelSpec(
        name=name,
        fn=fn,
        params=[("sm_scale", "fp32"), ("L_ptr", "*fp32"), ("Z", "i32"), ("H", "i32"),
                ("q_desc", "tensordesc<fp16[1, 1, BLOCK_M, HEAD_DIM]>"),
                ("k_desc", "tensordesc<fp16[1, 1, BLOCK_N, HEAD_DIM]>"),
                ("v_desc", "tensordesc<fp16[1, 1, BLOCK_N, HEAD_DIM]>"),
                ("o_desc", "tensordesc<fp16[1, 1, BLOCK_M, HEAD_DIM]>"),
                ("N_CTX", "i32"), ("HEAD_DIM", "constexpr"), ("BLOCK_M", "constexpr"),
                ("BLOCK_N", "constexpr")],
        configs=CONFIGS,
        constants={"HEAD_DIM": 64},
        default="m128_n64_w8_s3",
        grid=["cdiv(N_CTX, BLOCK_M)", "Z * H"],
        representatives=[{"Z": 4, "H": 16, "N_CTX": 2048}],
        specializations=[Specialization("aligned", div16=["L_ptr", "N_CTX"])],
        make_inputs=make_inputs,
        outputs=["o_desc", "L_ptr"],
        reference=_reference(causal),
        # fp16 P and output rounding; exp2/log2 approximations in the statistic
        tolerance={"o_desc": (2e-2, 2e-2), "L_ptr": (1e-3, 5e-3)},
    )


KPACK_KERNELS = [_spec("attention_fwd", attention_fwd, False),
                 _spec("attention_fwd_causal", attention_fwd_causal, True)]
