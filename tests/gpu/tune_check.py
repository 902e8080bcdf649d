#!/usr/bin/env python3
"""GPU check: the tuner checks candidates before it times them.

Builds tune_check_spec.py (a single-pass RMS norm whose BLOCK_SIZE must cover the row,
bucketed on N = 1000 / 3000 / 8000, every BLOCK_SIZE a candidate everywhere) with tuning
on this GPU, then requires:

1. tuning.json records the wrong candidates as mismatches and excludes them: b1024_w4
   in buckets [1] and [2], b4096_w8 in bucket [2]; each bucket's chosen config covers its
   rows;
2. the wrong candidates really are wrong (their JIT outputs differ from the reference)
   and, timed here, the fastest candidate of the long-row buckets is one of them -- what
   the tuner chose before it checked (printed; asserted only as "wrong");
3. the pack computes right answers: `kpack run` on every bucket's representative shape
   (grid passed: n_rows is a launch value) agrees with the float64 reference within the
   spec's tolerance, and with Triton's JIT running the chosen config bit for bit.

Usage: tune_check.py KPACK_BINARY [--keep DIR]
Exits 77 (skipped) without a GPU or torch, unless KPACK_REQUIRE_GPU=1 (then 1).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP = 77
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
os.environ["TRITON_DISABLE_LINE_INFO"] = "1"  # as the pack's cubins are built


def unavailable(reason):
    print(f"tune check: {reason}")
    if os.environ.get("KPACK_REQUIRE_GPU") == "1":
        print("tune check: KPACK_REQUIRE_GPU=1, so this is a failure, not a skip")
        return 1
    return SKIP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--keep", help="build the pack into this directory and keep it")
    opts = parser.parse_args()
    doctor = subprocess.run([opts.binary, "doctor"], capture_output=True, text=True).stdout
    if "driver: not available" in doctor or "devices: 0" in doctor:
        return unavailable(f"no usable GPU: {doctor.strip()}")
    try:
        import torch
    except ImportError:
        return unavailable("torch is not installed")
    if not torch.cuda.is_available():
        return unavailable("torch sees no CUDA device")
    import numpy as np
    import triton
    sys.path.insert(0, str(REPO / "tools"))
    from kpack_tools import build as builder
    from kpack_tools.autotune import compare, jit_launcher, time_launch
    from kpack_tools.spec import load_specs

    spec_file = HERE / "tune_check_spec.py"
    spec = load_specs(spec_file)[0]
    failures = []
    with tempfile.TemporaryDirectory(prefix="kpack-tune-check-") as tmp:
        pack = Path(opts.keep or os.path.join(tmp, "pack"))
        builder.build([spec_file], pack, tune=True, reps=10)
        tuning = json.loads((pack / "tuning.json").read_text())
        manifest = json.loads((pack / "manifest.json").read_text())
        buckets = tuning["kernels"][0]["buckets"]
        if not tuning["tuned"]:
            failures.append(f"the build did not tune: {tuning['reason']}")
        expect_wrong = {0: set(), 1: {"b1024_w4"}, 2: {"b1024_w4", "b4096_w8"}}
        for number, bucket in enumerate(buckets):
            n = bucket["representative"]["N"]
            print(f"bucket {bucket['bucket']} ({bucket['range']}), N={n}: chosen "
                  f"{bucket['chosen']}; checked against {bucket['checked_against']}; times "
                  f"{bucket['times_us']}")
            for name, text in bucket["mismatches"].items():
                print(f"  excluded {name}: {text}")
            if set(bucket["mismatches"]) != expect_wrong[number]:
                failures.append(f"bucket {bucket['bucket']}: mismatches "
                                f"{sorted(bucket['mismatches'])}, expected "
                                f"{sorted(expect_wrong[number])}")
            chosen = spec.config(bucket["chosen"])
            if chosen.constexprs["BLOCK_SIZE"] < n:
                failures.append(f"bucket {bucket['bucket']}: chose {chosen.name}, whose "
                                f"BLOCK_SIZE skips columns of N={n}")

            # Every candidate through the JIT: correct or not, and how fast.
            args = spec.make_inputs(dict(bucket["representative"]), "cuda")
            ref = spec.reference(args)["Y"]
            times = {}
            for config in spec.configs:
                run = {k: v.clone() if hasattr(v, "clone") else v for k, v in args.items()}
                launch = jit_launcher(spec, config, run)
                launch()
                torch.cuda.synchronize()
                wrong = compare("Y", run["Y"], ref, (1e-5, 1e-6))
                times[config.name] = time_launch(launch, 10, 3)
                print(f"  JIT {config.name}: {times[config.name]:.2f} us, "
                      f"{'WRONG: ' + wrong if wrong else 'correct'}")
                if (wrong is not None) != (config.name in expect_wrong[number]):
                    failures.append(f"bucket {bucket['bucket']}: {config.name} through the JIT "
                                    f"is {'wrong' if wrong else 'correct'}, expected otherwise")
            fastest = min(times, key=times.get)
            if fastest in expect_wrong[number]:
                print(f"  the fastest candidate, {fastest}, is wrong for N={n}: an unchecked "
                      f"tuner would have chosen it; this one chose {bucket['chosen']}")
            else:
                print(f"  the fastest candidate, {fastest}, is correct here")

            # The pack, through the C++ runtime.
            call = {p: args[p] for p in spec.call_params}
            cmd = [opts.binary, "run", str(pack), spec.name, "--grid", str(args["n_rows"])]
            for name, value in call.items():
                if hasattr(value, "data_ptr"):
                    if name in spec.outputs:
                        cmd += ["--arg", f"{name}=zeros:float32:{value.numel()}",
                                "--out", f"{name}=@{tmp}/{name}.out.npy"]
                    else:
                        np.save(f"{tmp}/{name}.npy", value.cpu().numpy().reshape(-1))
                        cmd += ["--arg", f"{name}=@{tmp}/{name}.npy"]
                else:
                    cmd += ["--arg", f"{name}={value!r}"]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                failures.append(f"bucket {bucket['bucket']}: kpack run failed: {result.stderr}")
                continue
            got = torch.from_numpy(np.load(f"{tmp}/Y.out.npy")).view(ref.shape)
            wrong = compare("Y", got, ref.cpu(), (1e-5, 1e-6))
            # Triton's JIT specialized exactly like the variant kpack chose (as in
            # examples_check.py): the same machine code on the same bytes.
            variant_name = result.stdout.split("variant ", 1)[1].split(",", 1)[0]
            variant = next(v for v in manifest["kernels"][0]["variants"]
                           if v["name"] == variant_name)
            assumed = set(variant.get("assumptions", {}))
            jit_fn = triton.JITFunction(spec.fn.fn, do_not_specialize=[
                q for q in spec.call_params if q not in assumed])
            jit = {k: v.clone() if hasattr(v, "clone") else v for k, v in args.items()}
            jit_launcher(spec, chosen, jit, fn=jit_fn)()
            torch.cuda.synchronize()
            same = torch.equal(got.view(torch.int32), jit["Y"].cpu().view(torch.int32))
            print(f"  kpack run: {result.stdout.splitlines()[0]}; vs reference: "
                  f"{wrong or 'within rtol 1e-5, atol 1e-6'}; bitwise equal to the JIT's "
                  f"{chosen.name}: {same}")
            if wrong:
                failures.append(f"bucket {bucket['bucket']}: the pack's output is wrong: {wrong}")
            if not same:
                failures.append(f"bucket {bucket['bucket']}: the pack's output differs from "
                                f"the JIT running {chosen.name}")
        if [k["name"] for k in manifest["kernels"]] != [spec.name] or \
                "grid" in manifest["kernels"][0]:
            failures.append("the manifest should hold rms_norm_one_pass without a grid")
    for failure in failures:
        print(f"FAIL: {failure}")
    if failures:
        return 1
    print("tune check: the wrong candidates were excluded with their mismatches recorded, "
          "and the pack computes right answers in every bucket")
    return 0


if __name__ == "__main__":
    sys.exit(main())
