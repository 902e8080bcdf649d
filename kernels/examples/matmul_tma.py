"""Example: a persistent ``C = A @ B`` on Hopper's TMA, through host tensor descriptors.

``A`` is ``[M, K]``, ``B`` is ``[K, N]``, ``C`` is ``[M, N]``, all fp16 and
row-major, fp32 accumulation: ``C[m, n] = fp16(sum_k A[m, k] * B[k, n])``.
The kernel takes the three matrices as ``tensordesc`` parameters (Triton's
``TensorDescriptor``, kpack's ``kpack::TensorDesc``): every tile moves between
global and shared memory by TMA, which fills out-of-bounds reads with zeros
and drops out-of-bounds writes, so any ``M, N, K >= 1`` works without masks
(TMA needs 16-byte aligned row strides: ``N`` and ``K`` multiples of 8).

Persistent: the grid is ``min(NUM_SMS, tiles)`` programs, each walking the
output tiles ``start, start + NUM_SMS, ...`` in grouped order (``GROUP_M``
rows of tiles per group, for L2 reuse of ``B``). ``NUM_SMS`` is a call
parameter (the device's multiprocessor count), so one pack serves any GPU of
the architecture.

``M`` is bucketed (``<= 64`` and above): the small-``M`` config has a
64-row tile, the large one 128 rows, so the descriptors of ``A`` and ``C``
have a different block shape in each bucket's variants (the manifest's
``types`` override), while a caller passes the same ``TensorDesc`` to both:
the block shape is the variant's. ``aligned`` is the specialization Triton's
JIT compiles for ``M``, ``N``, ``K`` multiples of 16.
"""

import triton
import triton.language as tl

from kpack_tools.spec import Bucket, Config, KernelSpec, Specialization


@triton.jit
def _tile_coords(tile, tiles_n, num_tiles_m, GROUP_M: tl.constexpr):
    # Tiles go by groups of GROUP_M tile rows, column by column within a group.
    per_group = GROUP_M * tiles_n
    group = tile // per_group
    first_m = group * GROUP_M
    rows = min(num_tiles_m - first_m, GROUP_M)
    tile_m = first_m + (tile % per_group) % rows
    tile_n = (tile % per_group) // rows
    return tile_m, tile_n


@triton.jit
def matmul_tma_persistent(a_desc, b_desc, c_desc, M, N, K, NUM_SMS,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_SMS):
        tile_m, tile_n = _tile_coords(tile, tiles_n, tiles_m, GROUP_M)
        row = tile_m * BLOCK_M
        col = tile_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(k_steps):
            a = a_desc.load([row, step * BLOCK_K])
            b = b_desc.load([step * BLOCK_K, col])
            acc = tl.dot(a, b, acc)
        c_desc.store([row, col], acc.to(tl.float16))


CONFIGS = [
    Config("m64_n128_k64_w4_s4", {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
           num_warps=4, num_stages=4),
    Config("m128_n128_k64_w8_s3", {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64,
                                   "GROUP_M": 8}, num_warps=8, num_stages=3),
    Config("m128_n256_k64_w8_s3", {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64,
                                   "GROUP_M": 8}, num_warps=8, num_stages=3),
]


def num_sms(device) -> int:
    import torch
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # an H100/H200 SXM


def make_inputs(shape, device):
    import torch
    m, n, k = shape["M"], shape["N"], shape["K"]
    gen = torch.Generator(device=device).manual_seed(9)
    a = torch.randn(m, k, device=device, generator=gen).to(torch.float16)
    b = torch.randn(k, n, device=device, generator=gen).to(torch.float16)
    c = torch.empty(m, n, device=device, dtype=torch.float16)
    # The descriptors cover the whole tensors (TensorDescriptor.from_tensor); the builder
    # gives them each config's block shape.
    return {"a_desc": a, "b_desc": b, "c_desc": c, "M": m, "N": n, "K": k,
            "NUM_SMS": num_sms(device)}


def reference(args):
    return {"c_desc": (args["a_desc"].double() @ args["b_desc"].double()).to(
        args["c_desc"].dtype)}


KPACK_KERNELS = [KernelSpec(
    name="matmul_tma",
    fn=matmul_tma_persistent,
    params=[("a_desc", "tensordesc<fp16[BLOCK_M, BLOCK_K]>"),
            ("b_desc", "tensordesc<fp16[BLOCK_K, BLOCK_N]>"),
            ("c_desc", "tensordesc<fp16[BLOCK_M, BLOCK_N]>"),
            ("M", "i32"), ("N", "i32"), ("K", "i32"), ("NUM_SMS", "i32"),
            ("BLOCK_M", "constexpr"), ("BLOCK_N", "constexpr"), ("BLOCK_K", "constexpr"),
            ("GROUP_M", "constexpr")],
    configs=CONFIGS,
    buckets=[Bucket("M", [64])],
    default=["m64_n128_k64_w4_s4", "m128_n128_k64_w8_s3"],
    grid=["min(NUM_SMS, cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N))"],
    representatives=[{"M": 64, "N": 4096, "K": 4096}, {"M": 4096, "N": 4096, "K": 4096}],
    specializations=[Specialization("aligned", div16=["M", "N", "K"])],
    make_inputs=make_inputs,
    outputs=["c_desc"],
    reference=reference,
    # fp32 accumulation order + fp16 output rounding
    tolerance=(2e-3, 1e-2),
)]
