"""Build spec for tune_check.py: a single-pass RMS norm written the way public kernels
are, whose BLOCK_SIZE must cover the row -- a smaller one silently skips the columns past
it -- bucketed on the row length, with every BLOCK_SIZE a candidate in every bucket and
no config_allowed predicate. The fastest candidate for long rows is the short block that
does a third of the work and is wrong; the tuner must exclude it by comparing with the
reference before timing (docs/build-spec.md, "Autotuning").
"""

import triton
import triton.language as tl

from kpack_tools.spec import Bucket, Config, KernelSpec, Specialization


@triton.jit
def rms_norm_kernel(X, Y, W, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask)
    tl.store(Y + row * stride + cols, x * rstd * w, mask=mask)


def make_inputs(shape, device):
    import torch
    m, n = shape["n_rows"], shape["N"]
    gen = torch.Generator(device=device).manual_seed(11)
    return {"X": torch.randn(m, n, device=device, generator=gen),
            "Y": torch.zeros(m, n, device=device),
            "W": torch.randn(n, device=device, generator=gen),
            "stride": n, "N": n, "eps": 1e-6, "n_rows": m}


def reference(args):
    import torch
    x = args["X"].double()
    rstd = torch.rsqrt((x * x).mean(dim=1, keepdim=True) + args["eps"])
    return {"Y": (x * rstd * args["W"].double()).float()}


KPACK_KERNELS = [
    KernelSpec(
        name="rms_norm_one_pass",
        fn=rms_norm_kernel,
        params=[("X", "*fp32"), ("Y", "*fp32"), ("W", "*fp32"), ("stride", "i32"),
                ("N", "i32"), ("eps", "fp32"), ("BLOCK_SIZE", "constexpr")],
        configs=[Config("b1024_w4", {"BLOCK_SIZE": 1024}, num_warps=4),
                 Config("b4096_w8", {"BLOCK_SIZE": 4096}, num_warps=8),
                 Config("b8192_w16", {"BLOCK_SIZE": 8192}, num_warps=16)],
        # N <= 1024, 1025..4096, 4097..8192 (longer rows: no config is right)
        buckets=[Bucket("N", [1024, 4096])],
        default=["b1024_w4", "b4096_w8", "b8192_w16"],
        grid=["n_rows"],
        launch_values=["n_rows"],
        representatives=[{"n_rows": 8192, "N": 1000}, {"n_rows": 8192, "N": 3000},
                         {"n_rows": 8192, "N": 8000}],
        specializations=[Specialization("div16", div16=["X", "Y", "W", "stride"])],
        make_inputs=make_inputs,
        outputs=["Y"],
        reference=reference,
        tolerance=(1e-5, 1e-6),
        readonly=["X", "W"],
    ),
]
