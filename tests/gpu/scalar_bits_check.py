#!/usr/bin/env python3
"""GPU tier: fp16, bf16, fp32 and fp64 scalars reach a kernel with the same bits from
kpack as from Triton 3.6's JIT, for Python floats where the roundings differ.

kernels/scalarpack's `fill` kernel (tools/kpack_tools/build_scalar_pack.py) stores each
scalar unconverted into its own output. For every case below the same Python floats are
passed (1) to `fill_kernel` through Triton's JIT on torch tensors and (2) to
`kpack run SCALARPACK fill --arg h=repr(value) ...`, which parses the text into the
same double (repr round-trips) and launches through kpack::Arg(double). The stored bits
must be identical; they are also compared (and a difference printed) with what Triton's
launcher packs: struct.pack('<e') (PyFloat_Pack2, one rounding) for fp16 and float32 bits
>> 16 (truncation) for bf16. A value beyond fp16's range makes the JIT raise OverflowError
(after launching with undefined bits); kpack must refuse it and launch nothing.

Usage: scalar_bits_check.py KPACK_BINARY SCALARPACK_DIR
Exits 77 (skipped) when no GPU or no torch is usable, unless KPACK_REQUIRE_GPU=1 (then 1).
"""

import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from gpu_check import gpu_missing, unavailable

REPO = Path(__file__).resolve().parents[2]
N = 128  # one program of the fill kernel

# (fp16, bf16, fp32, fp64) values. Each fp16 value is one where rounding the double
# through float32 first gives other bits, or a tie/subnormal/special case; each bf16
# value is one where truncating (Triton) and rounding to nearest differ.
CASES = [
    (1.0 + 2**-11 + 2**-40, 0.1, 0.1, 0.1),
    (2049.0000001, 1.0 / 3, 1.0 / 3, 1.0 / 3),
    (0.1, 3.14159, 3.14159, 3.14159),
    (1.0 + 2**-11, 1.0 + 2**-8 * 1.5, 1.0 + 2**-24, 1.0 + 2**-52),
    (65519.99, -2.5e-3, 65519.99, -2.5e-3),
    (6.1e-5, 1e38, 3.4e38, 1e300),
    (2**-25, 2**-130, 2**-149, 5e-324),
    (2**-25 * 1.0000001, -0.0, -0.0, -0.0),
    (float("inf"), float("-inf"), float("inf"), float("-inf")),
    (float("nan"), float("nan"), float("nan"), float("nan")),
]
OVERFLOW_FP16 = 65520.0


def expected_bits(case):
    """What Triton 3.6's launcher packs (driver.py pack_fp16/pack_bf16/pack_fp32/pack_fp64)."""
    h, b, f, d = case
    return (struct.unpack("<H", struct.pack("<e", h))[0],
            int(np.array(b, dtype=np.float64).astype(np.float32).view(np.uint32)) >> 16,
            int(np.array(f, dtype=np.float64).astype(np.float32).view(np.uint32)),
            int(np.array(d, dtype=np.float64).view(np.uint64)))


def kpack_fill(binary, pack, tmp, case):
    """The four stored bit patterns after `kpack run`, or the failed run's stderr."""
    outs = {name: os.path.join(tmp, f"{name}.npy") for name in ("h", "b", "f", "d")}
    h, b, f, d = case
    command = [binary, "run", pack, "fill",
               "--arg", f"h_ptr=zeros:uint16:{N}", "--arg", f"b_ptr=zeros:uint16:{N}",
               "--arg", f"f_ptr=zeros:uint32:{N}", "--arg", f"d_ptr=zeros:uint64:{N}",
               "--arg", f"n={N}", "--arg", f"h={h!r}", "--arg", f"b={b!r}",
               "--arg", f"f={f!r}", "--arg", f"d={d!r}", "--grid", "1"]
    for name, path in outs.items():
        command += ["--out", f"{name}_ptr=@{path}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        return None, result.stdout + result.stderr
    bits = []
    for name in ("h", "b", "f", "d"):
        values = np.load(outs[name])
        if len(set(values.tolist())) != 1:
            return None, f"{name}: the kernel did not write one value everywhere: {values[:8]}"
        bits.append(int(values[0]))
    return tuple(bits), ""


def jit_fill(torch, fill_kernel, block, case):
    h, b, f, d = case
    outs = [torch.empty(N, dtype=t, device="cuda")
            for t in (torch.float16, torch.bfloat16, torch.float32, torch.float64)]
    fill_kernel[(1,)](*outs, N, h, b, f, d, BLOCK=block)
    torch.cuda.synchronize()
    views = (torch.int16, torch.int16, torch.int32, torch.int64)
    masks = (0xffff, 0xffff, 0xffffffff, 0xffffffffffffffff)
    bits = []
    for out, view, mask in zip(outs, views, masks):
        values = set(out.view(view).cpu().tolist())
        if len(values) != 1:
            raise SystemExit(f"JIT fill did not write one value everywhere: {values}")
        bits.append(values.pop() & mask)
    return tuple(bits)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, pack = sys.argv[1], sys.argv[2]
    missing = gpu_missing(binary)
    if missing:
        return unavailable("scalar bits check", missing)
    import torch
    sys.path.insert(0, str(REPO / "tools"))
    from kpack_tools.build_scalar_pack import BLOCK, fill_kernel

    failures = 0
    print(f"{'fp16 value':>24} {'bf16 value':>24}   jit h/b/f/d bits            kpack")
    with tempfile.TemporaryDirectory(prefix="kpack-scalar-bits-") as tmp:
        for case in CASES:
            want = expected_bits(case)
            jit = jit_fill(torch, fill_kernel, BLOCK, case)
            got, error = kpack_fill(binary, pack, tmp, case)
            line = (f"{case[0]!r:>24} {case[1]!r:>24}   "
                    f"{' '.join(hex(x) for x in jit):28} "
                    f"{' '.join(hex(x) for x in got) if got else error.strip()}")
            # The requirement: kpack's bits are the JIT's. That they are also what
            # driver.py's packing functions give is reported, not required (a kernel
            # could in principle alter bits on the way to memory, equally for both).
            ok = got == jit
            print(("   " if ok else "!! ") + line)
            if not ok:
                failures += 1
            if jit != want:
                print(f"   note: driver.py's packing gives {' '.join(hex(x) for x in want)}")

        # fp16 overflow: PyFloat_Pack2 raises OverflowError in the JIT's launcher; kpack
        # must refuse the launch (INVALID_ARGUMENT naming 'h').
        case = (OVERFLOW_FP16, 1.0, 1.0, 1.0)
        try:
            jit_fill(torch, fill_kernel, BLOCK, case)
            jit_refused = False
        except (OverflowError, SystemError) as e:
            jit_refused = True
            print(f"JIT refuses fp16 {OVERFLOW_FP16!r}: {type(e).__name__}: {e}")
        got, error = kpack_fill(binary, pack, tmp, case)
        print(f"kpack for fp16 {OVERFLOW_FP16!r}: " + (error.strip() or f"launched: {got}"))
        if not jit_refused or got is not None or "'h'" not in error:
            failures += 1
            print("!! the JIT must raise and kpack refuse an fp16 scalar beyond 65504")
    if failures:
        print(f"scalar bits check: {failures} case(s) differ")
        return 1
    print(f"scalar bits check: {len(CASES)} cases bit-identical to Triton's JIT; "
          "fp16 overflow raised by the JIT and refused by kpack")
    return 0


if __name__ == "__main__":
    sys.exit(main())
