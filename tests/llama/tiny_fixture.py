#!/usr/bin/env python3
"""The ctest fixture of the Llama engine's tests: in OUT,

  tiny/          the tiny checkpoint, by examples/llama/python/make_checkpoint.py
                 --preset tiny --seed 0 (the Hugging Face layout, through `safetensors`)
  oracle/        numpy_model.py's teacher-forced run over it: --batch 3
                 --prompt-lens 5,9,3 --steps 16 --seed 0 (prefill_logits.npy,
                 step_logits.npy, inputs.npy, tokens.npy, result.json)
  inv_freq.npy   the Python engine's rotary inverse frequencies for it
                 (config.rope_inv_freq), which the C++ engine must match bit for bit
  decode_splits.npy
                 the Python engine's decode-attention splits (config.decode_splits),
                 int32 [300, 16]: element [B - 1, NKV - 1] for batches 1-300 and 1-16 kv
                 heads, which the C++ engine's DecodeSplits must match

    tiny_fixture.py REPO_ROOT OUT

Needs numpy and safetensors (not torch). Each tool runs through its own command line,
as a user would run it.
"""

import shutil
import subprocess
import sys
from pathlib import Path


def main() -> int:
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    python_dir = root / "examples" / "llama" / "python"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    steps = [
        [sys.executable, str(python_dir / "make_checkpoint.py"), "--preset", "tiny",
         "--seed", "0", "--out", str(out / "tiny")],
        [sys.executable, str(python_dir / "numpy_model.py"), "--checkpoint", str(out / "tiny"),
         "--batch", "3", "--prompt-lens", "5,9,3", "--steps", "16", "--seed", "0",
         "--teacher-force", "--out", str(out / "oracle")],
    ]
    for cmd in steps:
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            return 1
    sys.path.insert(0, str(python_dir))
    import numpy as np
    from config import decode_splits, load_config, rope_inv_freq
    np.save(out / "inv_freq.npy", rope_inv_freq(load_config(out / "tiny" / "config.json")))
    np.save(out / "decode_splits.npy",
            np.array([[decode_splits(b, nkv) for nkv in range(1, 17)] for b in range(1, 301)],
                     dtype=np.int32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
