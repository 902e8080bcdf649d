#!/usr/bin/env python3
"""GPU tier for record mode: record a PyTorch + Triton program, relaunch every
recorded launch from C++ (`kpack run`) and require bit-identical outputs.

1. `python -m kpack_tools.record --out PACK -- python record_program.py DATA`
   (record_program.py: elementwise, softmax and layer-norm kernels, a training
   layer norm whose backward Triton specializes on 14 properties, an autotuned
   ReLU and an autotuned matmul called for several (M, N, K); it saves every
   pointer argument before and after each launch, and the config each autotuner
   chose).
2. `kpack verify PACK` (manifest, sha256, layouts, and loading every variant).
3. For each launch in PACK/record.json, in order, matched with the program's
   own calls.json: check the recorded scalars and grid against what the program
   passed, run `kpack run PACK KERNEL` on the saved "before" buffers with the
   recorded scalars and grid, check that kpack chose the variant the JIT used
   (for an autotuned call: a variant with the config the autotuner chose), and
   compare every buffer afterwards with the program's "after" bytes.
4. The pack as a whole: every kernel has a generic variant (compiled by the
   recorder where the program never made one), the autotuned matmul is one kernel
   bucketed on its key, and a kernel depends on more than 12 properties.

Usage: record_check.py KPACK_BINARY
Exits 77 (skipped) when no GPU or no torch is usable, unless KPACK_REQUIRE_GPU=1
(then 1).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from gpu_check import gpu_missing, unavailable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def run(command, **kwargs):
    print("$ " + " ".join(str(c) for c in command), flush=True)
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                            **kwargs)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result


def scalar_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def pack_failures(manifest, record, autotuned_checked):
    """Checks of the pack as a whole (printed as they go)."""
    failures = []
    for kernel in manifest["kernels"]:
        generic = [v["name"] for v in kernel["variants"] if not v.get("assumptions")]
        most = max(len(v.get("assumptions", {})) for v in kernel["variants"])
        print(f"kernel {kernel['name']}: {len(kernel['variants'])} variants, generic "
              f"{generic[:3]}{'...' if len(generic) > 3 else ''}, at most {most} assumptions"
              + (f", buckets on {[b['param'] for b in kernel['buckets']]}"
                 if "buckets" in kernel else ""))
        if not generic:
            failures.append(f"kernel {kernel['name']} has no generic variant")
    if not any(len(v.get("assumptions", {})) > 12
               for k in manifest["kernels"] for v in k["variants"]):
        failures.append("no variant depends on more than 12 properties (the layer-norm "
                        "backward should have 14)")
    matmul = [k for k in manifest["kernels"] if k["name"].startswith("matmul_autotuned_kernel")]
    if [k["name"] for k in matmul] != ["matmul_autotuned_kernel"]:
        failures.append(f"the autotuned matmul is not exactly one kernel: "
                        f"{[k['name'] for k in matmul]}")
    elif matmul[0].get("autotune_key") != ["M", "N", "K"]:
        failures.append(f"matmul_autotuned_kernel has autotune_key "
                        f"{matmul[0].get('autotune_key')}")
    for entry in record.get("autotuned", []):
        print(f"autotuned {entry['kernel']}: key {entry['key']}, bucketed on "
              f"{entry['bucketed']}, {len(entry['recorded_keys'])} recorded keys, "
              f"{len(entry['buckets'])} buckets")
    if autotuned_checked < 5:
        failures.append(f"only {autotuned_checked} autotuned matmul calls checked, expected 5")
    for line in record.get("not_exported", []):
        print(f"not exported: {line}")
    return failures


def main():
    binary = sys.argv[1]
    missing = gpu_missing(binary)
    if missing:
        return unavailable("record check", missing)
    import torch
    import triton
    print(f"record check: torch {torch.__version__}, triton {triton.__version__}")

    with tempfile.TemporaryDirectory(prefix="kpack-record-check-") as tmp:
        tmp = Path(tmp)
        pack, data = tmp / "pack", tmp / "data"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "tools")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        recorded = run([sys.executable, "-m", "kpack_tools.record", "--out", pack, "--",
                        sys.executable, HERE / "record_program.py", data], env=env)
        if recorded.returncode != 0:
            print(f"FAIL: record exited with {recorded.returncode}")
            return 1
        verified = run([binary, "verify", pack])
        if verified.returncode != 0:
            print(f"FAIL: kpack verify exited with {verified.returncode}")
            return 1

        manifest = json.loads((pack / "manifest.json").read_text())
        record = json.loads((pack / "record.json").read_text())
        calls = json.loads((data / "calls.json").read_text())
        functions = {(k["kernel"], k["variant"]): k["function"] for k in record["kernels"]}
        launches = record["launches"]
        failures = []
        if len(launches) != len(calls):
            failures.append(f"record.json has {len(launches)} launches, the program made "
                            f"{len(calls)} calls")
        params = {k["name"]: k["params"] for k in manifest["kernels"]}
        variants = {k["name"]: {v["name"]: v for v in k["variants"]}
                    for k in manifest["kernels"]}
        variants_used = {}
        autotuned_checked = 0
        for index, (launch, call) in enumerate(zip(launches, calls)):
            kernel, variant = launch["kernel"], launch["variant"]
            what = f"launch {index}: {kernel} [{variant}] grid {launch['grid']}"
            function = functions[(kernel, variant)].rsplit(".", 1)[-1]
            if function != call["function"]:
                failures.append(f"{what}: recorded function {function}, program called "
                                f"{call['function']}")
                continue
            if launch["grid"] != call["grid"]:
                failures.append(f"{what}: recorded grid differs from the program's {call['grid']}")
            # The program's own buffers (a layer norm's per-row statistics are smaller than
            # every size argument, which `kpack run` otherwise refuses as a likely mistake).
            command = [binary, "run", pack, kernel, "--no-size-check", "--grid",
                       ",".join(str(g) for g in launch["grid"])]
            outputs = {}
            aligned = True
            for param in params[kernel]:
                name = param["name"]
                if param["type"] == "constexpr":
                    continue
                arg = launch["args"][name]
                if param["type"].startswith("*") or param["type"].startswith("tensordesc"):
                    # A tensor descriptor: its whole (contiguous) base tensor, `tdesc:`.
                    desc = param["type"].startswith("tensordesc")
                    aligned = aligned and (arg["tensordesc"] if desc else arg)["align16"]
                    before = data / call["buffers"][name]["before"]
                    command += ["--arg", f"{name}={'tdesc:' if desc else ''}@{before}"]
                    outputs[name] = tmp / f"{index:02d}_{name}_kpack.npy"
                    command += ["--out", f"{name}=@{outputs[name]}"]
                else:
                    if arg["value"] != call["scalars"][name]:
                        failures.append(f"{what}: recorded {name}={arg['value']!r}, program "
                                        f"passed {call['scalars'][name]!r}")
                    command += ["--arg", f"{name}={scalar_text(arg['value'])}"]
            result = run(command)
            if result.returncode != 0:
                failures.append(f"{what}: kpack run exited with {result.returncode}")
                continue
            chosen = re.search(r"variant (\S+),", result.stdout)
            chosen = chosen.group(1) if chosen else None
            if chosen != variant and aligned:
                failures.append(f"{what}: kpack chose variant {chosen}, the JIT compiled "
                                f"{variant} for this call")
            if "config" in call:  # an autotuned call: kpack must use the chosen config
                v = variants[kernel].get(chosen, {})
                got = {"constexprs": {k: v.get("constexprs", {}).get(k)
                                      for k in call["config"]["constexprs"]},
                       "num_warps": v.get("num_warps"), "num_stages": v.get("num_stages")}
                print(f"{what}: autotuner chose {call['config']}; kpack's variant {chosen} "
                      f"has {got}")
                if got != call["config"]:
                    failures.append(f"{what}: kpack's variant {chosen} has config {got}, the "
                                    f"autotuner chose {call['config']}")
                autotuned_checked += 1
            variants_used.setdefault(kernel, set()).add(variant)
            for name, path in outputs.items():
                want = np.load(data / call["buffers"][name]["after"])
                got = np.load(path).reshape(want.shape)
                same = got.dtype == want.dtype and got.tobytes() == want.tobytes()
                diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
                differing = int(np.count_nonzero(got.view(np.uint8) != want.view(np.uint8)))
                print(f"{what}: kpack chose {chosen}; buffer {name} ({want.size} x "
                      f"{want.dtype}): {'bit-identical' if same else 'DIFFERENT'} "
                      f"(max abs diff {np.nanmax(diff) if diff.size else 0:.3e}, "
                      f"{differing} bytes differ)")
                if not same:
                    failures.append(f"{what}: buffer {name} differs from the program's output")

        kernels = {functions[(x['kernel'], x['variant'])] for x in launches}
        multi = [k for k, v in variants_used.items() if len(v) > 1]
        print(f"record check: {len(launches)} launches of {len(kernels)} Triton functions "
              f"relaunched; kernels with several variants launched: {multi}")
        if len(kernels) < 3:
            failures.append(f"only {len(kernels)} different kernels recorded, expected >= 3")
        if not multi:
            failures.append("no kernel was launched in two variants")
        failures += pack_failures(manifest, record, autotuned_checked)
        for failure in failures:
            print(f"FAIL: {failure}")
        if failures:
            return 1
    print("record check: every recorded launch relaunched from C++ with bit-identical outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
