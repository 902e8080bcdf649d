#!/usr/bin/env python3
"""Write a seeded random Llama checkpoint in the Hugging Face layout (config.json +
model.safetensors, bf16): weights ~ N(0, 0.02), norm weights ~ 1 + N(0, 0.1).

    make_checkpoint.py --preset tiny|llama-3.2-1b [--config config.json] --seed N --out DIR
                       [--backend auto|numpy|torch] [--device cpu|cuda]

--config takes the model shape from a config.json instead of the preset (the preset is
then not needed). checkpoint.py says which random streams each backend uses; `auto` is
numpy below 64M parameters and torch (if importable) above. Needs numpy and safetensors
(and torch for the torch path).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkpoint import write_checkpoint  # noqa: E402
from config import ConfigError, PRESETS, preset_dict  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--config", help="a config.json giving the model shape")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=("auto", "numpy", "torch"), default="auto")
    ap.add_argument("--device", default="cpu", help="torch backend: where to draw the numbers")
    args = ap.parse_args(argv)
    if (args.preset is None) == (args.config is None):
        ap.error("give exactly one of --preset and --config")
    if args.seed < 0:
        ap.error("--seed must be >= 0")
    try:
        config = (preset_dict(args.preset) if args.preset else
                  json.loads(Path(args.config).read_text()))
        t0 = time.perf_counter()
        cfg = write_checkpoint(args.out, config, args.seed, args.backend, args.device)
    except (ConfigError, OSError, json.JSONDecodeError) as e:
        print(f"make_checkpoint: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {cfg.parameter_count() / 1e6:.1f}M parameters, "
          f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
