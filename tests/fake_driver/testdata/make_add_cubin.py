"""Regenerates add.cubin, the cubin fixture of the CPU tests (no GPU needed).

    TRITON_DISABLE_LINE_INFO=1 python3 make_add_cubin.py add.cubin

Triton 3.6.0, sm_90a, num_warps 4, BLOCK 1024. Line info is disabled only to keep the
fixture small; it adds debug sections the tests do not need.
"""

import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def main(path):
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                 "BLOCK": "constexpr"}
    source = ASTSource(fn=add_kernel, signature=signature, constexprs={"BLOCK": 1024})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": 4})
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])


if __name__ == "__main__":
    main(sys.argv[1])
