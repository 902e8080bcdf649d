"""Example: fp32 vector add, ``out[i] = x[i] + y[i]`` for ``0 <= i < n``.

One bucket (no bucket dims), three candidate configs, and a ``div16``
specialization for aligned pointers and ``n`` a multiple of 16.  One fp32 add
per element: bit-exact against any correct implementation.
"""

import triton
import triton.language as tl

from kpack_tools.spec import Config, KernelSpec, Specialization


@triton.jit
def vector_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def make_inputs(shape, device):
    import torch
    n = shape["n"]
    gen = torch.Generator(device=device).manual_seed(1)
    return {"x_ptr": torch.randn(n, device=device, generator=gen),
            "y_ptr": torch.randn(n, device=device, generator=gen),
            "out_ptr": torch.empty(n, device=device), "n": n}


def reference(args):
    return {"out_ptr": args["x_ptr"] + args["y_ptr"]}


KPACK_KERNELS = [
    KernelSpec(
        name="vector_add",
        fn=vector_add_kernel,
        params=[("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"),
                ("BLOCK", "constexpr")],
        configs=[Config("b1024_w4", {"BLOCK": 1024}, num_warps=4),
                 Config("b2048_w8", {"BLOCK": 2048}, num_warps=8),
                 Config("b4096_w8", {"BLOCK": 4096}, num_warps=8)],
        default="b1024_w4",
        grid=["cdiv(n, BLOCK)"],
        representatives=[{"n": 1 << 22}],
        specializations=[Specialization("div16", div16=["x_ptr", "y_ptr", "out_ptr", "n"])],
        make_inputs=make_inputs,
        outputs=["out_ptr"],
        reference=reference,
        tolerance=(0.0, 0.0),  # one fp32 add: exact
        readonly=["x_ptr", "y_ptr"],
    ),
]
