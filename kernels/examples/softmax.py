"""Example: fp32 row softmax of any row length, the row length bucketed.

``out[r, c] = exp(x[r, c] - max_r) / sum_c' exp(x[r, c'] - max_r)`` for
``r < n_rows``, ``c < n_cols``; one program per row, grid ``n_rows``.  The
kernel walks the row in ``BLOCK``-wide chunks (an online max/sum pass, then a
normalizing pass), so every config is correct for every ``n_cols`` and the
bucket only chooses the fastest ``BLOCK``/``num_warps``.  Not bit-exact
against torch (``tl.exp`` is ``ex2.approx``, and the sum order differs):
compare with a tolerance; against Triton's JIT with the same config and
specialization it is bit-exact (same cubin).
"""

import triton
import triton.language as tl

from kpack_tools.spec import Bucket, Config, KernelSpec, Specialization


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    in_row = in_ptr + row * in_row_stride
    out_row = out_ptr + row * out_row_stride
    # Per lane: the running max of the columns it saw and the sum of exp(x - max).
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(in_row + cols, mask=cols < n_cols, other=-float("inf"))
        m_new = tl.maximum(m, x)
        seen = m_new > -float("inf")  # lanes that saw no column keep s = 0, not NaN
        s = tl.where(seen, s * tl.exp(m - m_new) + tl.exp(x - m_new), 0.0)
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(tl.where(m > -float("inf"), s * tl.exp(m - row_max), 0.0), axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_row + cols, mask=mask, other=-float("inf"))
        tl.store(out_row + cols, tl.exp(x - row_max) / total, mask=mask)


def make_inputs(shape, device):
    import torch
    rows, cols = shape["n_rows"], shape["n_cols"]
    gen = torch.Generator(device=device).manual_seed(2)
    x = torch.randn(rows, cols, device=device, generator=gen) * 4
    return {"out_ptr": torch.empty_like(x), "in_ptr": x, "in_row_stride": cols,
            "out_row_stride": cols, "n_rows": rows, "n_cols": cols}


def reference(args):
    import torch
    rows, cols = args["n_rows"], args["n_cols"]
    x = args["in_ptr"].flatten()[: rows * args["in_row_stride"]]
    x = x.view(rows, args["in_row_stride"])[:, :cols].double()
    return {"out_ptr": torch.softmax(x, dim=1).float()}


KPACK_KERNELS = [
    KernelSpec(
        name="softmax",
        fn=softmax_kernel,
        params=[("out_ptr", "*fp32"), ("in_ptr", "*fp32"), ("in_row_stride", "i32"),
                ("out_row_stride", "i32"), ("n_rows", "i32"), ("n_cols", "i32"),
                ("BLOCK", "constexpr")],
        configs=[Config("b256_w1", {"BLOCK": 256}, num_warps=1),
                 Config("b1024_w4", {"BLOCK": 1024}, num_warps=4),
                 Config("b4096_w8", {"BLOCK": 4096}, num_warps=8),
                 Config("b4096_w16", {"BLOCK": 4096}, num_warps=16)],
        # n_cols <= 1024, 1025..8192, > 8192
        buckets=[Bucket("n_cols", [1024, 8192])],
        default=["b1024_w4", "b4096_w8", "b4096_w16"],
        grid=["n_rows"],
        representatives=[{"n_rows": 4096, "n_cols": 512},
                         {"n_rows": 4096, "n_cols": 4096},
                         {"n_rows": 512, "n_cols": 32768}],
        specializations=[Specialization(
            "div16", div16=["out_ptr", "in_ptr", "in_row_stride", "out_row_stride", "n_cols"])],
        make_inputs=make_inputs,
        outputs=["out_ptr"],
        reference=reference,
        tolerance=(1e-5, 1e-6),  # ex2.approx, online rescaling, fp32 sums
        readonly=["in_ptr"],
    ),
]
