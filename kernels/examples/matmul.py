"""Example: ``C = A @ B`` in fp16 and bf16 (fp32 accumulation), ``M`` bucketed.

``C[m, n] = dtype(sum_k float32(A[m, k]) * float32(B[k, n]))`` for ``m < M``,
``n < N``; strides in elements, any ``M, N, K >= 0``.  ``M`` (the batch of
tokens in a serving engine) changes every call, so it is bucketed with edges
``[16, 64, 256]`` -- M in 1-16, 17-64, 65-256, 257+ -- and the tile config is
autotuned per bucket.  Two pack kernels from one Triton function:
``matmul_fp16`` and ``matmul_bf16``.  The ``contig`` specialization is what
Triton's JIT compiles for contiguous row-major operands with 16-aligned sizes:
``div16`` on the pointers, ``N``, ``K`` and the row strides, ``eq1`` on the
unit column strides.
"""

import triton
import triton.language as tl

from kpack_tools.spec import Bucket, Config, KernelSpec, Specialization


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = (c_ptr + offs_m[:, None].to(tl.int64) * stride_cm
              + offs_n[None, :].to(tl.int64) * stride_cn)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


PARAMS = ("a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_ak", "stride_bk",
          "stride_bn", "stride_cm", "stride_cn")
# BLOCK_K 32 keeps the generic (unvectorized) cubins small; the pack is committed.
CONFIGS = [
    Config("m16_n64_k32_w4_s4", {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32},
           num_warps=4, num_stages=4),
    Config("m32_n64_k32_w4_s3", {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32},
           num_warps=4, num_stages=3),
    Config("m64_n64_k32_w4_s3", {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32},
           num_warps=4, num_stages=3),
    Config("m128_n128_k32_w8_s3", {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32},
           num_warps=8, num_stages=3),
]


def _make_inputs(dtype_name):
    def make_inputs(shape, device):
        import torch
        dtype = getattr(torch, dtype_name)
        m, n, k = shape["M"], shape["N"], shape["K"]
        gen = torch.Generator(device=device).manual_seed(4)
        a = torch.randn(m, k, device=device, generator=gen).to(dtype)
        b = torch.randn(k, n, device=device, generator=gen).to(dtype)
        c = torch.empty(m, n, device=device, dtype=dtype)
        return {"a_ptr": a, "b_ptr": b, "c_ptr": c, "M": m, "N": n, "K": k,
                "stride_am": k, "stride_ak": 1, "stride_bk": n, "stride_bn": 1,
                "stride_cm": n, "stride_cn": 1}
    return make_inputs


def reference(args):
    import torch
    m, n, k = args["M"], args["N"], args["K"]
    a = torch.as_strided(args["a_ptr"], (m, k), (args["stride_am"], args["stride_ak"]))
    b = torch.as_strided(args["b_ptr"], (k, n), (args["stride_bk"], args["stride_bn"]))
    return {"c_ptr": (a.double() @ b.double()).to(args["c_ptr"].dtype)}


def _spec(dtype, dtype_name):
    return KernelSpec(
        name=f"matmul_{dtype}",
        fn=matmul_kernel,
        params=[("a_ptr", f"*{dtype}"), ("b_ptr", f"*{dtype}"), ("c_ptr", f"*{dtype}")]
        + [(name, "i32") for name in PARAMS[3:]]
        + [("BLOCK_M", "constexpr"), ("BLOCK_N", "constexpr"), ("BLOCK_K", "constexpr")],
        configs=CONFIGS,
        buckets=[Bucket("M", [16, 64, 256])],
        default=["m16_n64_k32_w4_s4", "m32_n64_k32_w4_s3", "m64_n64_k32_w4_s3",
                 "m128_n128_k32_w8_s3"],
        grid=["cdiv(M, BLOCK_M)", "cdiv(N, BLOCK_N)"],
        representatives=[{"M": m, "N": 4096, "K": 4096} for m in (16, 64, 256, 4096)],
        specializations=[Specialization(
            "contig", div16=["a_ptr", "b_ptr", "c_ptr", "N", "K", "stride_am", "stride_bk",
                             "stride_cm"],
            eq1=["stride_ak", "stride_bn", "stride_cn"])],
        make_inputs=_make_inputs(dtype_name),
        outputs=["c_ptr"],
        reference=reference,
        # fp32 accumulation order + fp16/bf16 output rounding
        tolerance=(2e-3, 1e-2) if dtype == "fp16" else (1.6e-2, 5e-2),
        readonly=["a_ptr", "b_ptr"],
    )


KPACK_KERNELS = [_spec("fp16", "float16"), _spec("bf16", "bfloat16")]
