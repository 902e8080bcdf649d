"""Example: an autotuned fp16 matmul as Triton programs write it (the Triton tutorial's
``matmul_kernel``: grouped program order for L2 reuse, ``triton.autotune`` over tile
configs keyed on ``M``, ``N``, ``K``), ``C = A @ B`` with fp32 accumulation.

A program calls ``matmul(a, b)``; the autotuner times the configs once per new
``(M, N, K)`` and launches the fastest.  Recording such a program (``docs/record.md``)
exports one pack kernel ``matmul_autotuned_kernel`` whose buckets over ``M``, ``N`` and
``K`` select, for every key value the program used, the config the autotuner chose
(``tests/gpu/record_program.py`` does this on the GPU; ``tools/tests/test_record.py``
with a stand-in driver).

The same function as a build spec (``KPACK_KERNELS``): the autotuner's configs become
the candidates, tuned per bucket of ``M`` by ``kpack_tools.build`` instead of at run time.
"""

import triton
import triton.language as tl

from kpack_tools.spec import Bucket, Config, KernelSpec, Specialization

AUTOTUNE_CONFIGS = [
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8},
                  num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8},
                  num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8},
                  num_warps=8, num_stages=3),
]


@triton.autotune(configs=AUTOTUNE_CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul_autotuned_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                            stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = accumulator.to(tl.float16)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def matmul(a, b):
    """``a @ b`` for 2-D fp16 tensors, the way a program calls the autotuned kernel."""
    import torch
    M, K = a.shape
    K2, N = b.shape
    assert K == K2, "incompatible dimensions"
    c = torch.empty((M, N), device=a.device, dtype=torch.float16)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    matmul_autotuned_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                                  b.stride(1), c.stride(0), c.stride(1))
    return c


def make_inputs(shape, device):
    import torch
    m, n, k = shape["M"], shape["N"], shape["K"]
    gen = torch.Generator(device=device).manual_seed(7)
    a = torch.randn(m, k, device=device, generator=gen).half()
    b = torch.randn(k, n, device=device, generator=gen).half()
    return {"a_ptr": a, "b_ptr": b, "c_ptr": torch.empty(m, n, device=device).half(),
            "M": m, "N": n, "K": k, "stride_am": k, "stride_ak": 1, "stride_bk": n,
            "stride_bn": 1, "stride_cm": n, "stride_cn": 1}


def reference(args):
    m, n, k = args["M"], args["N"], args["K"]
    a = args["a_ptr"].flatten()[: m * k].view(m, k).double()
    b = args["b_ptr"].flatten()[: k * n].view(k, n).double()
    return {"c_ptr": (a @ b).half()}


PARAMS = [("a_ptr", "*fp16"), ("b_ptr", "*fp16"), ("c_ptr", "*fp16")] + \
    [(name, "i32") for name in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk",
                                "stride_bn", "stride_cm", "stride_cn")] + \
    [(name, "constexpr") for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")]
CONFIGS = [Config(f"m{c.kwargs['BLOCK_M']}_n{c.kwargs['BLOCK_N']}_w{c.num_warps}", c.kwargs,
                  num_warps=c.num_warps, num_stages=c.num_stages) for c in AUTOTUNE_CONFIGS]

KPACK_KERNELS = [
    KernelSpec(
        name="matmul_autotuned",
        fn=matmul_autotuned_kernel.fn,
        params=PARAMS,
        configs=CONFIGS,
        buckets=[Bucket("M", [64, 256])],
        default=[c.name for c in CONFIGS],
        grid=["cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)"],
        representatives=[{"M": m, "N": 4096, "K": 4096} for m in (64, 256, 4096)],
        specializations=[Specialization(
            "contig", div16=["a_ptr", "b_ptr", "c_ptr", "N", "K", "stride_am", "stride_bk",
                             "stride_cm"],
            eq1=["stride_ak", "stride_bn", "stride_cn"])],
        make_inputs=make_inputs,
        outputs=["c_ptr"],
        reference=reference,
        tolerance=(2e-3, 1e-2),
        readonly=["a_ptr", "b_ptr"],
    ),
]
