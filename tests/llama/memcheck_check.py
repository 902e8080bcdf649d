#!/usr/bin/env python3
"""kpack-llama on the tiny checkpoint under compute-sanitizer memcheck (GPU tier):
prefill of three prompts (5, 9, 3 tokens) and 16 decode steps, through step graphs and
eagerly; any memcheck error fails. Exit 77 (skipped) without a GPU, unless
KPACK_REQUIRE_GPU=1.

    memcheck_check.py KPACK_LLAMA PACK TINY_CHECKPOINT
"""

import os
import shutil
import subprocess
import sys


def main() -> int:
    binary, pack, checkpoint = sys.argv[1:4]
    required = os.environ.get("KPACK_REQUIRE_GPU") == "1"
    args = [binary, "--pack", pack, "--checkpoint", checkpoint, "--batch", "3",
            "--prompt-lens", "5,9,3", "--capacity", "64", "--digests"]
    probe = subprocess.run(args + ["--steps", "1"], capture_output=True, text=True)
    if probe.returncode != 0:
        if "UNAVAILABLE" in probe.stderr and not required:
            print(f"SKIPPED: no GPU: {probe.stderr.strip()}")
            return 77
        print(probe.stdout, probe.stderr)
        return 1
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(sanitizer):
        print("compute-sanitizer not found (PATH, /usr/local/cuda/bin)")
        return 1 if required else 77
    for graphs in ("on", "off"):
        # --report-api-errors no: loading probes cuKernelGetParamInfo one index past the
        # manifest's layout on purpose (a cubin with more parameters than the manifest says
        # is refused), an API error by design, as in tools/gpu_tier.sh's memcheck stage.
        cmd = ([sanitizer, "--tool", "memcheck", "--report-api-errors", "no", "--error-exitcode",
                "3"] + args + ["--steps", "16", "--graphs", graphs])
        print("+", " ".join(cmd), flush=True)
        run = subprocess.run(cmd, capture_output=True, text=True)
        print(run.stdout[-4000:], run.stderr[-4000:])
        if run.returncode != 0 or "ERROR SUMMARY: 0 errors" not in run.stdout + run.stderr:
            print(f"memcheck failed with graphs {graphs} (exit {run.returncode})")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
