"""Build kpack's test pack: small Triton kernels, one per launch feature.

Each kernel exercises something a launcher can get wrong: argument packing
(``add``, ``scalars``), more than 48 KiB of dynamic shared memory (``matmul``),
clusters (``cluster``), programmatic dependent launch (``pdl``), global
scratch (``scratch``) and a few bytes of dynamic shared memory for a
cross-warp reduction, one program per row of a caller-chosen grid
(``softmax``).  The kernels' math is specified in ``tools/README.md``; the
GPU tests compute host references from it.

Compiling needs no GPU.  Run with ``tools/`` on ``PYTHONPATH``::

    python3 -m kpack_tools.build_test_pack --out kernels/testpack [--target 90]
"""

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Tuple

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kpack_tools.cli import run_build
from kpack_tools.pack import Kernel, Variant, pack_bytes, write_pack

GENERATOR = f"kpack_tools.build_test_pack (triton {triton.__version__})"
VARIANT = "default"


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def scalars_kernel(x_ptr, out_ptr, n, alpha, beta, gamma, flag, big, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    # 2**40 needs all 64 bits of `big`: a launcher passing only 32 of them fails.
    extra = tl.where(flag, (big - 1099511627776).to(tl.float32), -1.0)
    y = x * alpha + beta.to(tl.float32) + gamma.to(tl.float32) + extra
    tl.store(out_ptr + offs, y, mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(tl.float16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def cluster_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * 3.0 + 1.0, mask=mask)


@triton.jit
def pdl_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # Wait for the previous grid's writes before reading, then let the next grid
    # start its prologue while this one finishes.
    tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + offs, x * 2.0, mask=mask)


@triton.jit
def scratch_kernel(x_ptr, out_ptr, M, N, stride_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # A device-side TMA descriptor lives in global scratch, which the launcher
    # must allocate.  TMA needs a 16-byte aligned base and row stride.
    desc = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[stride_m, 1],
                                     block_shape=[BLOCK_M, BLOCK_N])
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    tile = desc.load([pid_m * BLOCK_M, pid_n * BLOCK_N])
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + offs_m[:, None] * stride_m + offs_n[None, :], tile * 2.0, mask=mask)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    # One program per row; the row count is not a parameter, so the caller
    # chooses the grid.  Masked columns load -inf: exp(-inf - max) = 0.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf"))
    z = x - tl.max(x, axis=0)
    num = tl.exp(z)
    y = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, y, mask=mask)


@dataclass(frozen=True)
class TestKernel:
    """How to compile one test kernel, and what its metadata must show.

    ``requirement`` is ``(description, predicate on the metadata)``: the
    feature the kernel exists to test, checked so that a Triton change that
    silently drops it fails the build instead of weakening the tests.
    """

    name: str
    fn: Any
    params: Tuple[Tuple[str, str], ...]
    constexprs: Mapping[str, Any]
    options: Mapping[str, Any]
    requirement: Optional[Tuple[str, Callable[[Any], bool]]] = None


_ELEMENTWISE = (("x_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"), ("BLOCK", "constexpr"))

TEST_KERNELS = (
    TestKernel(
        name="add", fn=add_kernel,
        params=(("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"),
                ("BLOCK", "constexpr")),
        constexprs={"BLOCK": 1024}, options={"num_warps": 4}),
    TestKernel(
        name="scalars", fn=scalars_kernel,
        params=(("x_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"), ("alpha", "fp32"),
                ("beta", "bf16"), ("gamma", "fp16"), ("flag", "i1"), ("big", "i64"),
                ("BLOCK", "constexpr")),
        # No FMA contraction: every operation rounds on its own, so a float32
        # host reference evaluated left to right matches bit for bit.
        constexprs={"BLOCK": 256}, options={"num_warps": 4, "enable_fp_fusion": False}),
    TestKernel(
        name="matmul", fn=matmul_kernel,
        params=(("a_ptr", "*fp16"), ("b_ptr", "*fp16"), ("c_ptr", "*fp16"),
                ("M", "i32"), ("N", "i32"), ("K", "i32"),
                ("stride_am", "i32"), ("stride_ak", "i32"), ("stride_bk", "i32"),
                ("stride_bn", "i32"), ("stride_cm", "i32"), ("stride_cn", "i32"),
                ("BLOCK_M", "constexpr"), ("BLOCK_N", "constexpr"), ("BLOCK_K", "constexpr")),
        # Without divisibility hints the fp16 loads cannot be vectorized to the
        # 4+ bytes cp.async needs, so the loop is not software-pipelined and
        # shared memory holds just one A and one B tile: BLOCK_K=64 gives
        # exactly 32 KiB; BLOCK_K=128 gives the 64 KiB this kernel must have.
        constexprs={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128},
        options={"num_warps": 8, "num_stages": 3},
        requirement=("shared > 48 KiB", lambda m: m.shared > 49152)),
    TestKernel(
        name="cluster", fn=cluster_kernel, params=_ELEMENTWISE, constexprs={"BLOCK": 1024},
        options={"num_warps": 4, "num_ctas": 2},
        requirement=("num_ctas == 2", lambda m: m.num_ctas == 2)),
    TestKernel(
        name="pdl", fn=pdl_kernel, params=_ELEMENTWISE, constexprs={"BLOCK": 1024},
        options={"num_warps": 4, "launch_pdl": True},
        requirement=("launch_pdl", lambda m: m.launch_pdl is True)),
    TestKernel(
        name="scratch", fn=scratch_kernel,
        params=(("x_ptr", "*fp32"), ("out_ptr", "*fp32"), ("M", "i32"), ("N", "i32"),
                ("stride_m", "i32"), ("BLOCK_M", "constexpr"), ("BLOCK_N", "constexpr")),
        constexprs={"BLOCK_M": 32, "BLOCK_N": 32}, options={"num_warps": 4},
        requirement=("global_scratch_size > 0", lambda m: m.global_scratch_size > 0)),
    TestKernel(
        name="softmax", fn=softmax_kernel,
        params=(("out_ptr", "*fp32"), ("in_ptr", "*fp32"), ("in_row_stride", "i32"),
                ("out_row_stride", "i32"), ("n_cols", "i32"), ("BLOCK", "constexpr")),
        # The cross-warp max and sum go through Triton's dynamic shared
        # memory, so the launch must request `shared` bytes (16).
        constexprs={"BLOCK": 1024}, options={"num_warps": 4},
        requirement=("0 < shared <= 48 KiB", lambda m: 0 < m.shared <= 49152)),
)


@contextlib.contextmanager
def _line_info_disabled():
    """Compile without line info, restoring the environment afterwards.

    Line info embeds the absolute path of this file in every cubin, so cubins
    would differ between checkouts; without it they are byte-identical
    wherever they are built, and half the size.  Triton reads the variable at
    compile time and includes it in its cache key.
    """
    old = os.environ.get("TRITON_DISABLE_LINE_INFO")
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_DISABLE_LINE_INFO"]
        else:
            os.environ["TRITON_DISABLE_LINE_INFO"] = old


def compile_test_kernel(spec: TestKernel, target: int):
    """Compile one test kernel for ``sm_<target>`` and check its requirement.

    No divisibility attributes are passed: the variant must be correct for any
    pointer alignment and integer value a caller passes.
    """
    signature = dict(spec.params)
    if list(signature) != spec.fn.arg_names:
        raise ValueError(f"{spec.name}: params {list(signature)} do not match "
                         f"the function's {spec.fn.arg_names}")
    src = ASTSource(fn=spec.fn, signature=signature, constexprs=dict(spec.constexprs), attrs={})
    with _line_info_disabled():
        compiled = triton.compile(src, target=GPUTarget("cuda", target, 32),
                                  options=dict(spec.options))
    if spec.requirement is not None:
        description, holds = spec.requirement
        if not holds(compiled.metadata):
            raise RuntimeError(f"{spec.name}: compiled kernel does not satisfy {description}")
    return compiled


def build(out_dir, target: int = 90, log: Callable[[str], None] = print):
    """Compile every test kernel and write the pack; return its manifest."""
    kernels = []
    log(f"{'kernel':8} {'warps':>5} {'ctas':>4} {'shared':>7} {'scratch':>7} pdl")
    for spec in TEST_KERNELS:
        compiled = compile_test_kernel(spec, target)
        meta = compiled.metadata
        log(f"{spec.name:8} {meta.num_warps:5} {meta.num_ctas:4} {meta.shared:7} "
            f"{meta.global_scratch_size:7} {meta.launch_pdl}")
        variant = Variant.from_compiled(VARIANT, compiled, spec.constexprs)
        kernels.append(Kernel(name=spec.name, params=spec.params, variants=[variant]))
    manifest = write_pack(out_dir, kernels, generator=GENERATOR)
    total = pack_bytes(out_dir)
    log(f"wrote {out_dir}: {len(kernels)} kernels, {total} bytes")
    return manifest


def main(argv=None):
    run_build(__doc__, build, argv)


if __name__ == "__main__":
    main()
