"""The command line shared by the pack-building scripts."""

import argparse


def run_build(doc, build, argv=None):
    """Parses ``--out`` and ``--target`` and calls ``build(out, target)``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", required=True, help="pack directory to (re)write")
    parser.add_argument("--target", type=int, default=90,
                        help="CUDA compute capability, major*10+minor (default 90: sm_90a)")
    args = parser.parse_args(argv)
    build(args.out, args.target)
