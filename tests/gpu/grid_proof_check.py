#!/usr/bin/env python3
"""GPU check: the builder proves a spec's grid_tolerant before the manifest says it
(kpack_tools.grid_proof; ctest kpack_grid_proof_gpu).

Builds, tuned on this GPU, a spec of two example kernels that both assert
``grid_tolerant``: vector_add (every program masks by n: tolerant) bucketed on n, and the
example softmax, one program per row with no row check, bucketed on its row count (a
larger grid runs rows past the tensors: not tolerant). Then requires:

1. vector_add's verdict is "proven": every shape checked, padded and exact grids
   bit-identical, guards intact, each with its timed cost; the manifest says
   ``grid_tolerance: {"proof": "gpu", "max": ...}``;
2. softmax's verdict is "refused", naming a write past a tensor (its guard memory
   changed) -- the check caught a kernel that does not mask itself, on real memory -- and
   the manifest has no grid_tolerance for it;
3. the costs are printed (the padded grids' GPU time against the exact ones').

Usage: grid_proof_check.py [--keep DIR]
Exits 77 (skipped) without torch or a GPU, unless KPACK_REQUIRE_GPU=1 (then 1).
"""

import argparse
import sys
import tempfile
import textwrap
from pathlib import Path

from python_cases import skip_or_fail as unavailable  # the GPU tier's skip rule

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

SPEC = textwrap.dedent('''
    import sys
    sys.path.insert(0, "EXAMPLES")
    from vector_add import make_inputs as add_inputs, reference as add_reference, \\
        vector_add_kernel
    from softmax import make_inputs as softmax_inputs, softmax_kernel
    sys.path.pop(0)
    from kpack_tools.spec import Bucket, Config, KernelSpec

    KPACK_KERNELS = [
        KernelSpec(
            name="vector_add", fn=vector_add_kernel,
            params=[("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"),
                    ("BLOCK", "constexpr")],
            configs=[Config("b1024_w4", {"BLOCK": 1024}, num_warps=4)], default="b1024_w4",
            grid=["cdiv(n, BLOCK)"], buckets=[Bucket("n", [65536, 1 << 20])],
            representatives=[{"n": 40000}, {"n": 700000}, {"n": 3000000}],
            make_inputs=add_inputs, outputs=["out_ptr"], reference=add_reference,
            tolerance=(0.0, 0.0), grid_tolerant=True, grid_max={"n": 1 << 22},
            # The last bucket spans 4x (2^20 < n <= 2^22): at its bottom the padded grid
            # runs 4x the programs, the extra ones returning at once -- measured 1.27x
            # the exact grid's GPU time on the H200, above the default limit of 1.25.
            # This check is about the proof; the cost gate is tested on the CPU.
            grid_cost_limit=2.0),
        KernelSpec(
            name="softmax", fn=softmax_kernel,
            params=[("out_ptr", "*fp32"), ("in_ptr", "*fp32"), ("in_row_stride", "i32"),
                    ("out_row_stride", "i32"), ("n_rows", "i32"), ("n_cols", "i32"),
                    ("BLOCK", "constexpr")],
            configs=[Config("b1024_w4", {"BLOCK": 1024}, num_warps=4)], default="b1024_w4",
            grid=["n_rows"], buckets=[Bucket("n_rows", [64, 512])],
            representatives=[{"n_rows": 40, "n_cols": 1000}, {"n_rows": 300, "n_cols": 1000},
                             {"n_rows": 900, "n_cols": 1000}],
            make_inputs=softmax_inputs, outputs=["out_ptr"], deterministic=True,
            grid_tolerant=True),
    ]
''')


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep", help="build the pack into this directory and keep it")
    opts = parser.parse_args()
    try:
        import torch
    except ImportError:
        return unavailable("torch is not installed")
    if not torch.cuda.is_available():
        return unavailable("torch sees no CUDA device")
    sys.path.insert(0, str(REPO / "tools"))
    from kpack_tools import build as builder
    from kpack_tools import grid_proof

    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "grid_proof_spec.py"
        spec.write_text(SPEC.replace("EXAMPLES", str(REPO / "kernels" / "examples")))
        out = Path(opts.keep) if opts.keep else Path(tmp) / "pack"
        manifest, tuning = builder.build([spec], out, reps=10)
    kernels = {k["name"]: k for k in tuning["kernels"]}
    failures = []
    add = kernels["vector_add"]["grid_tolerance"]
    softmax = kernels["softmax"]["grid_tolerance"]
    for name, entry in (("vector_add", add), ("softmax", softmax)):
        print(f"{name}: {entry['verdict']} (max cost {entry['max_cost']}); {entry['reason']}")
        for bucket in entry["buckets"]:
            for shape in bucket["shapes"]:
                print(f"  bucket {bucket['bucket']} {shape['shape']}: grid {shape['grid']} -> "
                      f"{shape['larger_grid']}, {shape['exact_us']} us -> {shape['larger_us']} us"
                      + (f", PROBLEM {shape['problem']}" if shape["problem"] else ""))
    if add["max_cost"] is None or add["max_cost"] <= 0:
        failures.append(f"vector_add: no padded/exact cost recorded ({add['max_cost']})")
    if add["verdict"] != grid_proof.PROVEN:
        failures.append(f"vector_add not proven: {add['verdict']}: {add['reason']}")
    if not all(s["problem"] is None for b in add["buckets"] for s in b["shapes"]):
        failures.append("vector_add: a shape has a problem")
    if len([s for b in add["buckets"] for s in b["shapes"]]) < 6:
        failures.append("vector_add: fewer shapes checked than expected")
    by_name = {k["name"]: k for k in manifest["kernels"]}
    if by_name["vector_add"].get("grid_tolerance") != {"proof": "gpu", "max": {"n": 1 << 22}}:
        failures.append(f"vector_add manifest: {by_name['vector_add'].get('grid_tolerance')}")
    if softmax["verdict"] != grid_proof.REFUSED or "wrote past" not in (softmax["reason"] or ""):
        failures.append(f"softmax not refused for writing past its tensors: "
                        f"{softmax['verdict']}: {softmax['reason']}")
    if "grid_tolerance" in by_name["softmax"]:
        failures.append("softmax manifest has grid_tolerance")
    for line in failures:
        print(f"FAILED: {line}")
    if failures:
        return 1
    print("OK: vector_add proven on the GPU, softmax refused (it writes past its tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
