"""Build kpack's benchmark pack: the same tiny kernel with 4, 14 and 32 arguments.

Host launch cost grows with the number of kernel arguments (each one is packed
and copied by every launcher), so the benchmark suite (``bench/``) times the
three kernels below on every launch path: raw ``cuLaunchKernelEx``, kpack, and
Triton's own launchers (``bench/triton_launch_bench.py`` JIT-compiles these same
functions, imported from this module).  The kernels' math is deliberately
trivial: ``out[i] = sum_j in_j[i] + sum_j s_j`` for ``i < n``, fp32 data and
i32 scalars -- no fp32 scalar, since Triton's AOT C stub would pass it as a
``double`` (``include/kpack/arg.h``) and the comparison must run the same
kernel correctly on every path.

Compiling needs no GPU.  Run with ``tools/`` on ``PYTHONPATH``::

    python3 -m kpack_tools.build_bench_pack --out kernels/benchpack [--target 90]
"""

from typing import Callable

import triton
import triton.language as tl

from kpack_tools import fixed_pack
from kpack_tools.fixed_pack import FixedKernel

BLOCK = 128


@triton.jit
def args4_kernel(x_ptr, out_ptr, n, s0, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + s0.to(tl.float32), mask=mask)


@triton.jit
def args14_kernel(p0, p1, p2, p3, p4, p5, out_ptr, n, s0, s1, s2, s3, s4, s5,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(p0 + offs, mask=mask) + tl.load(p1 + offs, mask=mask)
    acc += tl.load(p2 + offs, mask=mask) + tl.load(p3 + offs, mask=mask)
    acc += tl.load(p4 + offs, mask=mask) + tl.load(p5 + offs, mask=mask)
    s = s0 + s1 + s2 + s3 + s4 + s5
    tl.store(out_ptr + offs, acc + s.to(tl.float32), mask=mask)


@triton.jit
def args32_kernel(p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14,
                  out_ptr, n,
                  s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(p0 + offs, mask=mask) + tl.load(p1 + offs, mask=mask)
    acc += tl.load(p2 + offs, mask=mask) + tl.load(p3 + offs, mask=mask)
    acc += tl.load(p4 + offs, mask=mask) + tl.load(p5 + offs, mask=mask)
    acc += tl.load(p6 + offs, mask=mask) + tl.load(p7 + offs, mask=mask)
    acc += tl.load(p8 + offs, mask=mask) + tl.load(p9 + offs, mask=mask)
    acc += tl.load(p10 + offs, mask=mask) + tl.load(p11 + offs, mask=mask)
    acc += tl.load(p12 + offs, mask=mask) + tl.load(p13 + offs, mask=mask)
    acc += tl.load(p14 + offs, mask=mask)
    s = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7 + s8 + s9 + s10 + s11 + s12 + s13 + s14
    tl.store(out_ptr + offs, acc + s.to(tl.float32), mask=mask)


def bench_params(num_inputs: int):
    """The parameter list of a kernel with ``num_inputs`` input pointers:
    inputs, ``out_ptr``, ``n``, one i32 scalar per input, ``BLOCK``."""
    return (tuple((f"p{i}" if num_inputs > 1 else "x_ptr", "*fp32") for i in range(num_inputs))
            + (("out_ptr", "*fp32"), ("n", "i32"))
            + tuple((f"s{i}", "i32") for i in range(num_inputs))
            + (("BLOCK", "constexpr"),))


# name -> (function, number of input pointers); 2 * inputs + 2 call arguments.
FUNCTIONS = {"args4": (args4_kernel, 1), "args14": (args14_kernel, 6),
             "args32": (args32_kernel, 15)}

BENCH_KERNELS = tuple(
    FixedKernel(name=name, fn=fn, params=bench_params(inputs), constexprs={"BLOCK": BLOCK},
                options={"num_warps": 4}, grid=("cdiv(n, BLOCK)",))
    for name, (fn, inputs) in FUNCTIONS.items())


def build(out_dir, target: int = 90, log: Callable[[str], None] = print):
    """Compile the three benchmark kernels and write the pack; return its manifest."""
    kernels = []
    for spec in BENCH_KERNELS:
        compiled = fixed_pack.compile_kernel(spec, target)
        arity = sum(1 for _, t in spec.params if t != "constexpr")
        log(f"{spec.name:7} {arity:2} arguments, {compiled.metadata.num_warps} warps")
        kernels.append(spec.kernel(compiled))
    return fixed_pack.write(out_dir, kernels, "kpack_tools.build_bench_pack", log)


def main(argv=None):
    fixed_pack.main(__doc__, build, argv)


if __name__ == "__main__":
    main()
