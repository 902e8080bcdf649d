"""Example: layer norm for training, forward and backward, written the way public Triton
norm kernels are (the Triton tutorial's ``_layer_norm_fwd_fused``, flash-attention's
``_layer_norm_bwd_kernel``): capitalized pointer parameters, one row stride per tensor,
fp16 activations and weights, fp32 statistics and weight gradients.

``layer_norm_fwd`` (one program per row; the row count is not a parameter, so the grid
``n_rows`` is a launch value: callers pass the grid)::

    mean = sum(x) / N;  rstd = 1 / sqrt(sum((x - mean)^2) / N + eps)
    Y = fp16((x - mean) * rstd * W + B);  Mean[row] = mean;  Rstd[row] = rstd

``layer_norm_bwd`` (``BLOCK_M`` = 16 rows per program, grid ``cdiv(M, BLOCK_M)``), from
the forward's ``Mean``/``Rstd`` and the output gradient ``DY``::

    xhat = (x - mean) * rstd;  wdy = W * dy
    DX = fp16((wdy - (xhat * mean(xhat * wdy) + mean(wdy))) * rstd)
    DW[p, :] = sum over the program's rows of dy * xhat;  DB[p, :] = sum of dy

``DW``/``DB`` hold one fp32 partial row per program (``stride_dw_row`` apart); the caller
sums them (``DW.sum(0)``), so the result does not depend on the order in which programs
run: the kernel is deterministic, bit for bit.  Both kernels walk the row in ``BLOCK_N``
chunks, so every config is correct for every ``N``.

The backward kernel has 8 pointers and 4 row strides: Triton's JIT specializes all of
them and ``N`` (div16) for contiguous fp16 tensors with ``N`` a multiple of 16 -- 13
argument properties, which the ``contig`` specialization reproduces.
"""

import triton
import triton.language as tl

from kpack_tools.spec import Bucket, Config, KernelSpec, Specialization


@triton.jit
def layer_norm_fwd_kernel(X, Y, W, B, Mean, Rstd, stride_x_row, stride_y_row, N, eps,
                          BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_x_row
    Y += row * stride_y_row
    _sum = tl.zeros([BLOCK_N], dtype=tl.float32)
    for off in range(0, N, BLOCK_N):
        cols = off + tl.arange(0, BLOCK_N)
        _sum += tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
    mean = tl.sum(_sum, axis=0) / N
    _var = tl.zeros([BLOCK_N], dtype=tl.float32)
    for off in range(0, N, BLOCK_N):
        cols = off + tl.arange(0, BLOCK_N)
        x = tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
        x = tl.where(cols < N, x - mean, 0.0)
        _var += x * x
    rstd = 1 / tl.sqrt(tl.sum(_var, axis=0) / N + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    for off in range(0, N, BLOCK_N):
        cols = off + tl.arange(0, BLOCK_N)
        mask = cols < N
        w = tl.load(W + cols, mask=mask).to(tl.float32)
        b = tl.load(B + cols, mask=mask).to(tl.float32)
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_tile(X, W, DY, rows64, row_mask, mean, rstd, stride_x_row, stride_dy_row, off, N,
              BLOCK_N: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile: its columns, mask, dy, xhat and W * dy (fp32)."""
    cols = off + tl.arange(0, BLOCK_N)
    mask = row_mask[:, None] & (cols < N)[None, :]
    x = tl.load(X + rows64[:, None] * stride_x_row + cols[None, :], mask=mask,
                other=0.0).to(tl.float32)
    dy = tl.load(DY + rows64[:, None] * stride_dy_row + cols[None, :], mask=mask,
                 other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
    xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    return cols, mask, dy, xhat, w[None, :] * dy


@triton.jit
def layer_norm_bwd_kernel(X, W, DY, DX, DW, DB, Mean, Rstd,
                          stride_x_row, stride_dy_row, stride_dx_row, stride_dw_row, M, N,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    rows64 = rows.to(tl.int64)
    mean = tl.load(Mean + rows, mask=row_mask, other=0.0)
    rstd = tl.load(Rstd + rows, mask=row_mask, other=0.0)
    # Pass 1: the two row sums the input gradient needs.
    c1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    c2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    for off in range(0, N, BLOCK_N):
        cols, mask, dy, xhat, wdy = _bwd_tile(X, W, DY, rows64, row_mask, mean, rstd,
                                              stride_x_row, stride_dy_row, off, N, BLOCK_N)
        c1 += tl.sum(xhat * wdy, axis=1)
        c2 += tl.sum(wdy, axis=1)
    c1 = c1 / N
    c2 = c2 / N
    # Pass 2: DX, and this program's partial DW/DB rows.
    for off in range(0, N, BLOCK_N):
        cols, mask, dy, xhat, wdy = _bwd_tile(X, W, DY, rows64, row_mask, mean, rstd,
                                              stride_x_row, stride_dy_row, off, N, BLOCK_N)
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(DX + rows64[:, None] * stride_dx_row + cols[None, :],
                 dx.to(DX.dtype.element_ty), mask=mask)
        dw_row = pid.to(tl.int64) * stride_dw_row + cols
        tl.store(DW + dw_row, tl.sum(dy * xhat, axis=0), mask=cols < N)
        tl.store(DB + dw_row, tl.sum(dy, axis=0), mask=cols < N)


BLOCK_M = 16


def make_fwd_inputs(shape, device):
    import torch
    m, n = shape["n_rows"], shape["N"]
    gen = torch.Generator(device=device).manual_seed(5)
    x = (torch.randn(m, n, device=device, generator=gen) * 2 + 0.5).half()
    return {"X": x, "Y": torch.empty_like(x),
            "W": torch.randn(n, device=device, generator=gen).half(),
            "B": torch.randn(n, device=device, generator=gen).half(),
            "Mean": torch.empty(m, device=device), "Rstd": torch.empty(m, device=device),
            "stride_x_row": n, "stride_y_row": n, "N": n, "eps": 1e-5, "n_rows": m}


def fwd_reference(args):
    import torch
    m, n = args["n_rows"], args["N"]
    x = torch.as_strided(args["X"], (m, n), (args["stride_x_row"], 1)).double()
    mean = x.mean(dim=1)
    rstd = 1 / torch.sqrt(((x - mean[:, None]) ** 2).mean(dim=1) + args["eps"])
    y = (x - mean[:, None]) * rstd[:, None] * args["W"][:n].double() + args["B"][:n].double()
    return {"Y": y.half(), "Mean": mean.float(), "Rstd": rstd.float()}


def make_bwd_inputs(shape, device):
    import torch
    m, n = shape["M"], shape["N"]
    gen = torch.Generator(device=device).manual_seed(6)
    x = (torch.randn(m, n, device=device, generator=gen) * 2 + 0.5).half()
    xf = x.float()
    mean = xf.mean(dim=1)
    rstd = 1 / torch.sqrt(xf.var(dim=1, unbiased=False) + 1e-5)
    programs = triton.cdiv(m, BLOCK_M)
    return {"X": x, "W": torch.randn(n, device=device, generator=gen).half(),
            "DY": torch.randn(m, n, device=device, generator=gen).half(),
            "DX": torch.empty_like(x),
            "DW": torch.empty(programs, n, device=device),
            "DB": torch.empty(programs, n, device=device),
            "Mean": mean, "Rstd": rstd,
            "stride_x_row": n, "stride_dy_row": n, "stride_dx_row": n, "stride_dw_row": n,
            "M": m, "N": n}


def bwd_reference(args):
    import torch
    m, n = args["M"], args["N"]
    x = torch.as_strided(args["X"], (m, n), (args["stride_x_row"], 1)).double()
    dy = torch.as_strided(args["DY"], (m, n), (args["stride_dy_row"], 1)).double()
    w = args["W"][:n].double()
    mean, rstd = args["Mean"][:m].double(), args["Rstd"][:m].double()
    xhat = (x - mean[:, None]) * rstd[:, None]
    wdy = w * dy
    c1 = (xhat * wdy).mean(dim=1, keepdim=True)
    c2 = wdy.mean(dim=1, keepdim=True)
    dx = (wdy - (xhat * c1 + c2)) * rstd[:, None]
    programs = triton.cdiv(m, BLOCK_M)
    pad = programs * BLOCK_M - m
    dw = torch.nn.functional.pad(dy * xhat, (0, 0, 0, pad)).view(programs, BLOCK_M, n).sum(1)
    db = torch.nn.functional.pad(dy, (0, 0, 0, pad)).view(programs, BLOCK_M, n).sum(1)
    return {"DX": dx.half(), "DW": dw.float(), "DB": db.float()}


FWD_CONFIGS = [Config("n512_w2", {"BLOCK_N": 512}, num_warps=2),
               Config("n1024_w4", {"BLOCK_N": 1024}, num_warps=4),
               Config("n2048_w8", {"BLOCK_N": 2048}, num_warps=8)]
BWD_CONFIGS = [Config("n128_w4", {"BLOCK_N": 128}, num_warps=4),
               Config("n256_w4", {"BLOCK_N": 256}, num_warps=4),
               Config("n512_w8", {"BLOCK_N": 512}, num_warps=8)]

KPACK_KERNELS = [
    KernelSpec(
        name="layer_norm_fwd",
        fn=layer_norm_fwd_kernel,
        params=[("X", "*fp16"), ("Y", "*fp16"), ("W", "*fp16"), ("B", "*fp16"),
                ("Mean", "*fp32"), ("Rstd", "*fp32"), ("stride_x_row", "i32"),
                ("stride_y_row", "i32"), ("N", "i32"), ("eps", "fp32"),
                ("BLOCK_N", "constexpr")],
        configs=FWD_CONFIGS,
        default="n1024_w4",
        # One program per row: the row count is X.shape[0], not a kernel parameter.
        grid=["n_rows"],
        launch_values=["n_rows"],
        representatives=[{"n_rows": 4096, "N": 4096}],
        specializations=[Specialization(
            "contig", div16=["X", "Y", "W", "B", "Mean", "Rstd", "stride_x_row",
                             "stride_y_row", "N"])],
        make_inputs=make_fwd_inputs,
        outputs=["Y", "Mean", "Rstd"],
        reference=fwd_reference,
        tolerance={"Y": (2e-3, 1e-3), "Mean": (1e-4, 1e-5), "Rstd": (1e-4, 1e-5)},
        readonly=["X", "W", "B"],
    ),
    KernelSpec(
        name="layer_norm_bwd",
        fn=layer_norm_bwd_kernel,
        params=[("X", "*fp16"), ("W", "*fp16"), ("DY", "*fp16"), ("DX", "*fp16"),
                ("DW", "*fp32"), ("DB", "*fp32"), ("Mean", "*fp32"), ("Rstd", "*fp32"),
                ("stride_x_row", "i32"), ("stride_dy_row", "i32"), ("stride_dx_row", "i32"),
                ("stride_dw_row", "i32"), ("M", "i32"), ("N", "i32"),
                ("BLOCK_M", "constexpr"), ("BLOCK_N", "constexpr")],
        configs=BWD_CONFIGS,
        constants={"BLOCK_M": BLOCK_M},
        # N <= 1024, 1025..4096, > 4096
        buckets=[Bucket("N", [1024, 4096])],
        default=["n128_w4", "n256_w4", "n512_w8"],
        grid=["cdiv(M, BLOCK_M)"],
        representatives=[{"M": 4096, "N": 512}, {"M": 4096, "N": 2048},
                         {"M": 2048, "N": 8192}],
        specializations=[Specialization(
            "contig", div16=["X", "W", "DY", "DX", "DW", "DB", "Mean", "Rstd",
                             "stride_x_row", "stride_dy_row", "stride_dx_row",
                             "stride_dw_row", "N"])],
        make_inputs=make_bwd_inputs,
        outputs=["DX", "DW", "DB"],
        reference=bwd_reference,
        # DX: fp16 output of a difference of fp32 sums; DW/DB: 16-row fp32 sums
        tolerance={"DX": (5e-3, 5e-3), "DW": (1e-4, 1e-4), "DB": (1e-4, 1e-4)},
        readonly=["X", "W", "DY", "Mean", "Rstd"],
    ),
]
