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

``matmul`` is the example matmul (``kernels/examples/matmul.py``, loaded as a spec file),
compiled with the config that needs more than 48 KiB, so this builder needs a checkout.
"""

from pathlib import Path
from typing import Callable

import triton
import triton.language as tl

from kpack_tools import fixed_pack
from kpack_tools.fixed_pack import FixedKernel
from kpack_tools.spec import load_specs

EXAMPLE_MATMUL = Path(__file__).resolve().parents[2] / "kernels" / "examples" / "matmul.py"


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


def _example_matmul():
    """The ``@triton.jit`` matmul of the example spec (one function for both examples)."""
    if not EXAMPLE_MATMUL.is_file():
        raise ImportError(f"build_test_pack compiles the example matmul {EXAMPLE_MATMUL}, "
                          f"which is not there: run it from a kpack checkout")
    return next(spec.fn for spec in load_specs(EXAMPLE_MATMUL) if spec.name == "matmul_fp16")


matmul_kernel = _example_matmul()


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


_ELEMENTWISE = (("x_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"), ("BLOCK", "constexpr"))

TEST_KERNELS = (
    FixedKernel(
        name="add", fn=add_kernel,
        params=(("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"),
                ("BLOCK", "constexpr")),
        constexprs={"BLOCK": 1024}, options={"num_warps": 4}),
    FixedKernel(
        name="scalars", fn=scalars_kernel,
        params=(("x_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"), ("alpha", "fp32"),
                ("beta", "bf16"), ("gamma", "fp16"), ("flag", "i1"), ("big", "i64"),
                ("BLOCK", "constexpr")),
        # No FMA contraction: every operation rounds on its own, so a float32
        # host reference evaluated left to right matches bit for bit.
        constexprs={"BLOCK": 256}, options={"num_warps": 4, "enable_fp_fusion": False}),
    FixedKernel(
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
    FixedKernel(
        name="cluster", fn=cluster_kernel, params=_ELEMENTWISE, constexprs={"BLOCK": 1024},
        options={"num_warps": 4, "num_ctas": 2},
        requirement=("num_ctas == 2", lambda m: m.num_ctas == 2)),
    FixedKernel(
        name="pdl", fn=pdl_kernel, params=_ELEMENTWISE, constexprs={"BLOCK": 1024},
        options={"num_warps": 4, "launch_pdl": True},
        requirement=("launch_pdl", lambda m: m.launch_pdl is True)),
    FixedKernel(
        name="scratch", fn=scratch_kernel,
        params=(("x_ptr", "*fp32"), ("out_ptr", "*fp32"), ("M", "i32"), ("N", "i32"),
                ("stride_m", "i32"), ("BLOCK_M", "constexpr"), ("BLOCK_N", "constexpr")),
        constexprs={"BLOCK_M": 32, "BLOCK_N": 32}, options={"num_warps": 4},
        requirement=("global_scratch_size > 0", lambda m: m.global_scratch_size > 0)),
    FixedKernel(
        name="softmax", fn=softmax_kernel,
        params=(("out_ptr", "*fp32"), ("in_ptr", "*fp32"), ("in_row_stride", "i32"),
                ("out_row_stride", "i32"), ("n_cols", "i32"), ("BLOCK", "constexpr")),
        # The cross-warp max and sum go through Triton's dynamic shared
        # memory, so the launch must request `shared` bytes (16).
        constexprs={"BLOCK": 1024}, options={"num_warps": 4},
        requirement=("0 < shared <= 48 KiB", lambda m: 0 < m.shared <= 49152)),
)


def build(out_dir, target: int = 90, log: Callable[[str], None] = print):
    """Compile every test kernel and write the pack; return its manifest."""
    kernels = []
    log(f"{'kernel':8} {'warps':>5} {'ctas':>4} {'shared':>7} {'scratch':>7} pdl")
    for spec in TEST_KERNELS:
        compiled = fixed_pack.compile_kernel(spec, target)
        meta = compiled.metadata
        log(f"{spec.name:8} {meta.num_warps:5} {meta.num_ctas:4} {meta.shared:7} "
            f"{meta.global_scratch_size:7} {meta.launch_pdl}")
        kernels.append(spec.kernel(compiled))
    return fixed_pack.write(out_dir, kernels, "kpack_tools.build_test_pack", log)


def main(argv=None):
    fixed_pack.main(__doc__, build, argv)


if __name__ == "__main__":
    main()
