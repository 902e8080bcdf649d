"""Build kpack's scalar pack: one fill kernel taking fp16, bf16, fp32 and fp64 scalars.

``fill`` writes each scalar, unconverted, into its own output array (``torch.full``
for four dtypes at once), so the bits a launcher packed for each scalar land in
memory.  ``tests/gpu/scalar_bits_check.py`` launches it through kpack and through
Triton's JIT (which imports ``fill_kernel`` from here) with the same Python floats
and compares the bits: values are chosen where rounding through float32 first, or
rounding bf16 instead of truncating it, would give other bits.  The parameters are
annotated with their types so that the JIT compiles the same signature as the pack
(a bare Python float would be typed fp32).

Compiling needs no GPU.  Run with ``tools/`` on ``PYTHONPATH``::

    python3 -m kpack_tools.build_scalar_pack --out kernels/scalarpack [--target 90]
"""

from typing import Callable

import triton
import triton.language as tl

from kpack_tools import fixed_pack
from kpack_tools.fixed_pack import FixedKernel

BLOCK = 128


@triton.jit
def fill_kernel(h_ptr, b_ptr, f_ptr, d_ptr, n, h: tl.float16, b: tl.bfloat16, f: tl.float32,
                d: tl.float64, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(h_ptr + offs, h, mask=mask)  # a scalar broadcasts to the block, unconverted
    tl.store(b_ptr + offs, b, mask=mask)
    tl.store(f_ptr + offs, f, mask=mask)
    tl.store(d_ptr + offs, d, mask=mask)


FILL = FixedKernel(
    name="fill", fn=fill_kernel,
    params=(("h_ptr", "*fp16"), ("b_ptr", "*bf16"), ("f_ptr", "*fp32"), ("d_ptr", "*fp64"),
            ("n", "i32"), ("h", "fp16"), ("b", "bf16"), ("f", "fp32"), ("d", "fp64"),
            ("BLOCK", "constexpr")),
    constexprs={"BLOCK": BLOCK}, options={"num_warps": 4})


def build(out_dir, target: int = 90, log: Callable[[str], None] = print):
    """Compile the fill kernel and write the pack; return its manifest."""
    kernel = FILL.kernel(fixed_pack.compile_kernel(FILL, target))
    return fixed_pack.write(out_dir, [kernel], "kpack_tools.build_scalar_pack", log)


def main(argv=None):
    fixed_pack.main(__doc__, build, argv)


if __name__ == "__main__":
    main()
