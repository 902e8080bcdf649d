"""What the Python GPU checks share: whether a GPU (and torch) is usable, and the exit
code when it is not: 77 (ctest's SKIP_RETURN_CODE), or 1 under KPACK_REQUIRE_GPU=1."""

import os
import subprocess

SKIP = 77


def gpu_missing(binary, need_torch=True):
    """Why the checks cannot run here, or None: `kpack doctor` finds no device, or torch
    (when needed) is missing or sees no CUDA device."""
    doctor = subprocess.run([binary, "doctor"], capture_output=True, text=True).stdout
    if "driver: not available" in doctor or "devices: 0" in doctor:
        return f"kpack doctor: {doctor.strip()}"
    if not need_torch:
        return None
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def unavailable(check, reason):
    """The exit code for `check` (e.g. "record check") when it cannot run: `reason`."""
    print(f"{check}: SKIPPED: {reason}")
    if os.environ.get("KPACK_REQUIRE_GPU") == "1":
        print(f"{check}: KPACK_REQUIRE_GPU=1, so this is a failure, not a skip")
        return 1
    return SKIP
