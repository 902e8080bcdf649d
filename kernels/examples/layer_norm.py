"""Example: fp16 layer norm over rows, fp32 statistics, an fp32 ``eps``.

For each row ``r < M`` of ``N`` columns (row stride ``stride`` for ``x`` and
``y``)::

    mean = sum(x) / N;  var = sum((x - mean)^2) / N;  rstd = 1 / sqrt(var + eps)
    y = fp16((x - mean) * rstd * w + b)

in fp32.  ``eps`` is an fp32 scalar: a launcher that passes it as a double
(Triton's AOT stubs do) reads garbage.  One program per row; the row is walked
in ``BLOCK`` chunks, so every config is correct for every ``N``.  One bucket:
the config is tuned on ``M = N = 4096``.
"""

import triton
import triton.language as tl

from kpack_tools.spec import Config, KernelSpec, Specialization


@triton.jit
def layer_norm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, stride, M, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride
    y_row = y_ptr + row * stride
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
        d = tl.where(cols < N, x - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask).to(tl.float32)
        tl.store(y_row + cols, ((x - mean) * rstd * w + b).to(tl.float16), mask=mask)


def make_inputs(shape, device):
    import torch
    m, n = shape["M"], shape["N"]
    gen = torch.Generator(device=device).manual_seed(3)
    x = (torch.randn(m, n, device=device, generator=gen) * 2 + 0.5).half()
    return {"x_ptr": x, "y_ptr": torch.empty_like(x),
            "w_ptr": torch.randn(n, device=device, generator=gen).half(),
            "b_ptr": torch.randn(n, device=device, generator=gen).half(),
            "stride": n, "M": m, "N": n, "eps": 1e-5}


def reference(args):
    import torch
    m, n, stride = args["M"], args["N"], args["stride"]
    x = args["x_ptr"].flatten()[: m * stride].view(m, stride)[:, :n].float()
    y = torch.nn.functional.layer_norm(x, (n,), args["w_ptr"][:n].float(),
                                       args["b_ptr"][:n].float(), args["eps"])
    return {"y_ptr": y.half()}


KPACK_KERNELS = [
    KernelSpec(
        name="layer_norm",
        fn=layer_norm_kernel,
        params=[("x_ptr", "*fp16"), ("y_ptr", "*fp16"), ("w_ptr", "*fp16"), ("b_ptr", "*fp16"),
                ("stride", "i32"), ("M", "i32"), ("N", "i32"), ("eps", "fp32"),
                ("BLOCK", "constexpr")],
        configs=[Config("b512_w2", {"BLOCK": 512}, num_warps=2),
                 Config("b1024_w4", {"BLOCK": 1024}, num_warps=4),
                 Config("b2048_w8", {"BLOCK": 2048}, num_warps=8)],
        default="b1024_w4",
        grid=["M"],
        representatives=[{"M": 4096, "N": 4096}],
        specializations=[Specialization(
            "div16", div16=["x_ptr", "y_ptr", "w_ptr", "b_ptr", "stride", "N"])],
        make_inputs=make_inputs,
        outputs=["y_ptr"],
        reference=reference,
        tolerance=(2e-3, 1e-3),  # fp16 output: within one fp16 ulp of the fp32 result
        readonly=["x_ptr", "w_ptr", "b_ptr"],
    ),
]
