#!/usr/bin/env python3
"""A small PyTorch + Triton program for the record-mode GPU check (record_check.py).

It knows nothing about kpack: record_check.py runs it under
``python -m kpack_tools.record``.  Its kernels, in the style of public ones:

- ``scale_add_kernel`` (elementwise with an fp32 scalar and an int stride), twice:
  n = 4096, stride 1 (JIT: pointers and n div16, stride_x == 1 compiled away) and
  n = 1000, stride 3 (pointers div16 only): two variants of one kernel;
- ``softmax_kernel`` (row softmax, 64 x 1000, one program per row);
- ``layernorm_kernel`` (row layer norm with weight and bias, 32 x 768, eps 1e-5);
- ``relu_kernel``, autotuned over two configs (only the chosen one is exported);
- the training layer norm of ``kernels/examples/layer_norm_train.py``: forward, then
  backward (8 pointers, 4 row strides, M and N: Triton specializes 14 properties), for
  64 x 4096 and for 48 x 1000 (other specializations);
- the autotuned matmul of ``kernels/examples/matmul_autotuned.py`` (key M, N, K) for
  four shapes, one of them twice: record mode must export one kernel whose buckets
  select the config the autotuner chose for each;
- the persistent TMA matmul of ``kernels/examples/matmul_tma.py`` with host
  ``TensorDescriptor`` arguments, at a shape that is no multiple of its tiles.

For every launch it saves each pointer argument's buffer before and after the
call (``.npy``) and appends an entry to ``calls.json`` in OUT_DIR (with the config an
autotuner chose, if any), so the check can relaunch the same call from C++ and compare
bytes.

Usage: record_program.py OUT_DIR
"""

import json
import os
import sys

from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels" / "examples"))
import layer_norm_train  # noqa: E402  (the example kernels, used as a program would)
import matmul_autotuned  # noqa: E402
import matmul_tma  # noqa: E402


@triton.jit
def scale_add_kernel(x_ptr, y_ptr, out_ptr, n, stride_x, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * stride_x, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    # exp2 of log2(e)-scaled differences; masked columns are -inf and add 0.
    cols = tl.arange(0, BLOCK)
    src = in_ptr + tl.program_id(0) * in_row_stride
    x = tl.load(src + cols, mask=cols < n_cols, other=-float("inf")) * 1.4426950408889634
    e = tl.exp2(x - tl.max(x, axis=0))
    dst = out_ptr + tl.program_id(0) * out_row_stride
    tl.store(dst + cols, e * (1.0 / tl.sum(e, axis=0)), mask=cols < n_cols)


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, row_stride, n_cols, eps,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * row_stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask)
    b = tl.load(b_ptr + cols, mask=mask)
    tl.store(out_ptr + row * row_stride + cols, d * rstd * w + b, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=2),
                          triton.Config({"BLOCK": 1024}, num_warps=4)], key=["n"])
@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class Calls:
    """Saves each launch's buffers and parameters for the check."""

    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.calls = []

    def launch(self, kernel, grid, buffers, scalars, launch):
        """``launch()`` runs the call; ``buffers`` maps pointer params to tensors."""
        index = len(self.calls)
        entry = {"function": kernel, "grid": grid, "scalars": scalars, "buffers": {}}
        for name, tensor in buffers.items():
            before = f"{index:02d}_{kernel}_{name}_before.npy"
            np.save(os.path.join(self.out_dir, before), tensor.detach().cpu().numpy())
            entry["buffers"][name] = {"before": before}
        launch()
        torch.cuda.synchronize()
        for name, tensor in buffers.items():
            after = f"{index:02d}_{kernel}_{name}_after.npy"
            np.save(os.path.join(self.out_dir, after), tensor.detach().cpu().numpy())
            entry["buffers"][name]["after"] = after
        self.calls.append(entry)
        print(f"program: call {index}: {kernel} grid {grid} {scalars}")

    def save(self):
        with open(os.path.join(self.out_dir, "calls.json"), "w", encoding="utf-8") as f:
            json.dump(self.calls, f, indent=1)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    dev = "cuda"
    calls = Calls(out_dir)

    x = torch.randn(3 * 4096, device=dev)
    y = torch.randn(4096, device=dev)
    for n, stride, alpha in ((4096, 1, 0.75), (1000, 3, -1.5)):
        out = torch.zeros(4096, device=dev)
        grid = [triton.cdiv(n, 512), 1, 1]
        calls.launch("scale_add_kernel", grid, {"x_ptr": x, "y_ptr": y, "out_ptr": out},
                     {"n": n, "stride_x": stride, "alpha": alpha},
                     lambda: scale_add_kernel[tuple(grid)](x, y, out, n, stride, alpha,
                                                           BLOCK=512))

    rows, cols = 64, 1000
    inp = torch.randn(rows, cols, device=dev) * 3
    sm_out = torch.zeros(rows, cols, device=dev)
    calls.launch("softmax_kernel", [rows, 1, 1], {"out_ptr": sm_out, "in_ptr": inp},
                 {"in_row_stride": cols, "out_row_stride": cols, "n_cols": cols},
                 lambda: softmax_kernel[(rows,)](sm_out, inp, cols, cols, cols, BLOCK=1024))
    ref = torch.softmax(inp.double(), dim=1)
    print(f"program: softmax max abs error vs torch float64 "
          f"{(sm_out.double() - ref).abs().max().item():.3e}")

    rows, cols = 32, 768
    xl = torch.randn(rows, cols, device=dev)
    w = torch.randn(cols, device=dev)
    b = torch.randn(cols, device=dev)
    ln_out = torch.zeros(rows, cols, device=dev)
    calls.launch("layernorm_kernel", [rows, 1, 1],
                 {"x_ptr": xl, "w_ptr": w, "b_ptr": b, "out_ptr": ln_out},
                 {"row_stride": cols, "n_cols": cols, "eps": 1e-5},
                 lambda: layernorm_kernel[(rows,)](xl, w, b, ln_out, cols, cols, 1e-5,
                                                   BLOCK=1024))
    ref = torch.nn.functional.layer_norm(xl.double(), (cols,), w.double(), b.double(), 1e-5)
    print(f"program: layernorm max abs error vs torch float64 "
          f"{(ln_out.double() - ref).abs().max().item():.3e}")

    n = 5000
    xr = torch.randn(n, device=dev)
    relu_out = torch.zeros(n, device=dev)
    chosen = {}

    def relu():
        relu_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](xr, relu_out, n)
        chosen["BLOCK"] = relu_kernel.best_config.kwargs["BLOCK"]

    # The grid depends on the config the autotuner picks; the check takes the
    # grid from record.json and checks it against this one after the call.
    calls.launch("relu_kernel", None, {"x_ptr": xr, "out_ptr": relu_out}, {"n": n}, relu)
    calls.calls[-1]["grid"] = [triton.cdiv(n, chosen["BLOCK"]), 1, 1]
    print(f"program: relu autotuner chose BLOCK={chosen['BLOCK']}")

    layer_norm_training(calls, dev)
    autotuned_matmuls(calls, dev)
    tma_matmul(calls, dev)
    calls.save()


def tma_matmul(calls, dev):
    """The persistent TMA matmul through host tensor descriptors, as Triton's tutorial
    09 calls its descriptor kernel (the buffers saved are the descriptors' bases)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    m, n, k = 200, 264, 136
    a = torch.randn(m, k, device=dev).half()
    b = torch.randn(k, n, device=dev).half()
    c = torch.zeros(m, n, device=dev).half()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    da = TensorDescriptor.from_tensor(a, [128, 64])
    db = TensorDescriptor.from_tensor(b, [64, 128])
    dc = TensorDescriptor.from_tensor(c, [128, 128])
    grid = [min(sms, triton.cdiv(m, 128) * triton.cdiv(n, 128)), 1, 1]
    calls.launch("matmul_tma_persistent", grid, {"a_desc": a, "b_desc": b, "c_desc": c},
                 {"M": m, "N": n, "K": k, "NUM_SMS": sms},
                 lambda: matmul_tma.matmul_tma_persistent[tuple(grid)](
                     da, db, dc, m, n, k, sms, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
                     num_warps=8, num_stages=3))
    err = (c.double() - a.double() @ b.double()).abs().max().item()
    print(f"program: matmul_tma {m}x{n}x{k} max abs error vs torch float64 {err:.3e}")


def layer_norm_training(calls, dev):
    """Forward and backward of the example training layer norm, as a model would call
    them: contiguous fp16 activations, fp32 statistics and weight-gradient partials."""
    for m, n in ((64, 4096), (48, 1000)):
        x = (torch.randn(m, n, device=dev) * 2 + 0.5).half()
        w = torch.randn(n, device=dev).half()
        b = torch.randn(n, device=dev).half()
        y = torch.zeros_like(x)
        mean = torch.zeros(m, device=dev)
        rstd = torch.zeros(m, device=dev)
        calls.launch("layer_norm_fwd_kernel", [m, 1, 1],
                     {"X": x, "Y": y, "W": w, "B": b, "Mean": mean, "Rstd": rstd},
                     {"stride_x_row": n, "stride_y_row": n, "N": n, "eps": 1e-5},
                     lambda: layer_norm_train.layer_norm_fwd_kernel[(m,)](
                         x, y, w, b, mean, rstd, n, n, n, 1e-5, BLOCK_N=1024))
        ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
        print(f"program: layer_norm_fwd {m}x{n} max abs error vs torch float64 "
              f"{(y.double() - ref).abs().max().item():.3e}")
        dy = torch.randn(m, n, device=dev).half()
        dx = torch.zeros_like(x)
        programs = triton.cdiv(m, layer_norm_train.BLOCK_M)
        dw = torch.zeros(programs, n, device=dev)
        db = torch.zeros(programs, n, device=dev)
        calls.launch("layer_norm_bwd_kernel", [programs, 1, 1],
                     {"X": x, "W": w, "DY": dy, "DX": dx, "DW": dw, "DB": db, "Mean": mean,
                      "Rstd": rstd},
                     {"stride_x_row": n, "stride_dy_row": n, "stride_dx_row": n,
                      "stride_dw_row": n, "M": m, "N": n},
                     lambda: layer_norm_train.layer_norm_bwd_kernel[(programs,)](
                         x, w, dy, dx, dw, db, mean, rstd, n, n, n, n, m, n,
                         BLOCK_M=layer_norm_train.BLOCK_M, BLOCK_N=256))
        xr = x.double().requires_grad_()
        wr = w.double().requires_grad_()
        torch.nn.functional.layer_norm(xr, (n,), wr, b.double(), 1e-5).backward(dy.double())
        print(f"program: layer_norm_bwd {m}x{n} max abs error vs torch autograd: dx "
              f"{(dx.double() - xr.grad).abs().max().item():.3e}, dw "
              f"{(dw.double().sum(0) - wr.grad).abs().max().item():.3e}")


def autotuned_matmuls(calls, dev):
    """The example autotuned matmul for several (M, N, K), one twice (the autotuner's
    cache answers it); each call records the config the autotuner chose."""
    for m, n, k in ((64, 512, 512), (512, 512, 512), (100, 256, 512), (64, 512, 512),
                    (1000, 512, 256)):
        a = torch.randn(m, k, device=dev).half()
        b = torch.randn(k, n, device=dev).half()
        c = torch.zeros(m, n, device=dev).half()
        tuner = matmul_autotuned.matmul_autotuned_kernel

        def run():
            grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
            tuner[grid](a, b, c, m, n, k, k, 1, n, 1, n, 1)

        calls.launch("matmul_autotuned_kernel", None, {"a_ptr": a, "b_ptr": b, "c_ptr": c},
                     {"M": m, "N": n, "K": k, "stride_am": k, "stride_ak": 1, "stride_bk": n,
                      "stride_bn": 1, "stride_cm": n, "stride_cn": 1}, run)
        best = tuner.best_config
        calls.calls[-1]["grid"] = [triton.cdiv(m, best.kwargs["BLOCK_M"]) *
                                   triton.cdiv(n, best.kwargs["BLOCK_N"]), 1, 1]
        calls.calls[-1]["config"] = {"constexprs": dict(best.kwargs),
                                     "num_warps": best.num_warps,
                                     "num_stages": best.num_stages}
        err = (c.double() - a.double() @ b.double()).abs().max().item()
        print(f"program: autotuned matmul {m}x{n}x{k}: chose {best}; max abs error vs "
              f"float64 {err:.3e}")


if __name__ == "__main__":
    main()
