"""Build kpack's descriptor pack: small kernels whose parameters Triton expands, for the
CPU tests of tensor descriptors and flattened tuples (the example pack's TMA kernels
are the realistic ones).

- ``copy_tma``: ``out[i, j] = in[i, j]`` through two ``tensordesc<fp16[64, 128]>``
  parameters, compiled for sm_90a: both lowered to TMA (a CUtensorMap each; the TMA box
  is ``[64, 64]``, the 128-byte swizzle splitting the block's rows).
- ``copy_ptr`` (``--target 80``, its own pack ``kernels/descpack_sm80``, which a device
  of compute capability 9.0 cannot load): the same function compiled for sm_80, which
  has no TMA: no ``tensordesc_meta``, the descriptors passed in Triton's pointer form.
- ``copy_i16``: ``copy_tma`` for ``int16`` elements (NaN padding is refused for them).
- ``axpy_pair``: ``y = a * x + b * y`` with tuple parameters ``ptrs = (x, y)`` and
  ``coefs = (a, b)``, flattened to ``ptrs.0, ptrs.1, coefs.0, coefs.1``.

Grid for the copies: ``(cdiv(M, 64), cdiv(N, 128))``; for ``axpy_pair``:
``cdiv(n, 1024)``. Compiling needs no GPU::

    python3 -m kpack_tools.build_desc_pack --out kernels/descpack
    python3 -m kpack_tools.build_desc_pack --out kernels/descpack_sm80 --target 80
"""

from typing import Callable

import triton
import triton.language as tl

from kpack_tools import fixed_pack
from kpack_tools.fixed_pack import FixedKernel


@triton.jit
def copy_kernel(in_desc, out_desc, M, N, BM: tl.constexpr, BN: tl.constexpr):
    row = tl.program_id(0) * BM
    col = tl.program_id(1) * BN
    out_desc.store([row, col], in_desc.load([row, col]))


@triton.jit
def axpy_pair(ptrs, n, coefs, BLOCK: tl.constexpr):
    x_ptr, y_ptr = ptrs
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, coefs[0] * x + coefs[1] * y, mask=mask)


def _copy(name, dtype):
    desc = f"tensordesc<{dtype}[64, 128]>"
    return FixedKernel(name=name, fn=copy_kernel,
                       params=(("in_desc", desc), ("out_desc", desc), ("M", "i32"),
                               ("N", "i32"), ("BM", "constexpr"), ("BN", "constexpr")),
                       constexprs={"BM": 64, "BN": 128}, options={},
                       grid=("cdiv(M, BM)", "cdiv(N, BN)"))


AXPY_PAIR = FixedKernel(
    name="axpy_pair", fn=axpy_pair,
    params=(("ptrs.0", "*fp32"), ("ptrs.1", "*fp32"), ("n", "i32"), ("coefs.0", "fp32"),
            ("coefs.1", "fp32"), ("BLOCK", "constexpr")),
    signature={"ptrs": ("*fp32", "*fp32"), "n": "i32", "coefs": ("fp32", "fp32"),
               "BLOCK": "constexpr"},
    constexprs={"BLOCK": 1024}, options={}, grid=("cdiv(n, BLOCK)",))

# (kernel, the target it is built for)
KERNELS = [(_copy("copy_tma", "fp16"), 90), (_copy("copy_ptr", "fp16"), 80),
           (_copy("copy_i16", "i16"), 90), (AXPY_PAIR, 90)]


def build(out_dir, target: int = 90, log: Callable[[str], None] = print):
    """Writes the pack of the kernels for ``target`` (90 or 80)."""
    if target not in {arch for _, arch in KERNELS}:
        raise SystemExit(f"build_desc_pack: no kernels for target {target} (90 or 80)")
    kernels = []
    for spec, arch in KERNELS:
        if arch != target:
            continue
        compiled = fixed_pack.compile_kernel(spec, arch)
        kernels.append(spec.kernel(compiled))
        log(f"{spec.name}: sm_{arch}, tensordesc_meta {compiled.metadata.tensordesc_meta}, "
            f"shared {compiled.metadata.shared}")
    return fixed_pack.write(out_dir, kernels, "kpack_tools.build_desc_pack", log)


def main(argv=None):
    fixed_pack.main(__doc__, build, argv)


if __name__ == "__main__":
    main()
