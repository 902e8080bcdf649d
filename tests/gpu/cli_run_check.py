#!/usr/bin/env python3
"""GPU tier for `kpack run`: the bundled softmax and matmul launched from .npy files
through the command line, outputs compared with numpy references.

Usage: cli_run_check.py KPACK_BINARY PACK_DIR
Exits 77 (skipped) when no GPU is usable, unless KPACK_REQUIRE_GPU=1 (then 1).
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

SKIP = 77


def kpack(binary, *args):
    result = subprocess.run([binary, *args], capture_output=True, text=True)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"kpack {args[0]} failed with exit code {result.returncode}")
    return result.stdout


def check_softmax(binary, pack, tmp, rng):
    rows, cols = 300, 1000
    x = rng.standard_normal((rows, cols), dtype=np.float32) * 4
    np.save(os.path.join(tmp, "x.npy"), x)
    out = os.path.join(tmp, "softmax.npy")
    kpack(binary, "run", pack, "softmax",
          "--arg", f"out_ptr=zeros:float32:{rows * cols}",
          "--arg", f"in_ptr=@{tmp}/x.npy",
          "--arg", f"in_row_stride={cols}", "--arg", f"out_row_stride={cols}",
          "--arg", f"n_cols={cols}", "--grid", str(rows), "--out", f"out_ptr=@{out}")
    got = np.load(out).reshape(rows, cols)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    err = np.abs(got - ref).max()
    print(f"softmax {rows}x{cols}: max abs error {err:.3e} vs float64 numpy")
    np.testing.assert_allclose(got, ref, rtol=3e-6, atol=1e-7)


def check_matmul(binary, pack, tmp, rng):
    m, n, k = 200, 136, 256
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
    np.save(os.path.join(tmp, "a.npy"), a)
    np.save(os.path.join(tmp, "b.npy"), b)
    out = os.path.join(tmp, "c.npy")
    kpack(binary, "run", pack, "matmul",
          "--arg", f"a_ptr=@{tmp}/a.npy", "--arg", f"b_ptr=@{tmp}/b.npy",
          "--arg", f"c_ptr=zeros:float16:{m * n}",
          "--arg", f"M={m}", "--arg", f"N={n}", "--arg", f"K={k}",
          "--arg", f"stride_am={k}", "--arg", "stride_ak=1",
          "--arg", f"stride_bk={n}", "--arg", "stride_bn=1",
          "--arg", f"stride_cm={n}", "--arg", "stride_cn=1",
          "--grid", f"{(m + 127) // 128},{(n + 127) // 128}", "--out", f"c_ptr=@{out}")
    got = np.load(out).reshape(m, n).astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = np.abs(got - ref).max()
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    print(f"matmul {m}x{n}x{k} fp16: max abs error {err:.3e}, relative {rel:.3e} "
          f"vs float64 numpy (fp32 accumulation, fp16 output)")
    # fp16 output rounding: half an ulp of |C| <= ~16 is 2^-7; accumulation order adds less.
    assert rel < 2e-3 and err < 2e-2, (rel, err)


def main():
    binary, pack = sys.argv[1], sys.argv[2]
    doctor = subprocess.run([binary, "doctor"], capture_output=True, text=True).stdout
    if "driver: not available" in doctor or "devices: 0" in doctor:
        print(doctor)
        if os.environ.get("KPACK_REQUIRE_GPU") == "1":
            return 1
        return SKIP
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        check_softmax(binary, pack, tmp, rng)
        check_matmul(binary, pack, tmp, rng)
        kpack(binary, "bench", pack, "softmax",
              "--arg", "out_ptr=zeros:float32:1024", "--arg", f"in_ptr=@{tmp}/x.npy",
              "--arg", "in_row_stride=1000", "--arg", "out_row_stride=1000",
              "--arg", "n_cols=1000", "--grid", "1")
    print("kpack run: softmax and matmul match numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
