"""The benchmark pack: reproducible from its sources, with the argument counts it claims."""

import json
from pathlib import Path

from kpack_tools import build_bench_pack
from kpack_tools.cubin import parse_cubin

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "kernels" / "benchpack"


def test_builds_the_committed_pack(tmp_path):
    manifest = build_bench_pack.build(tmp_path / "pack", log=lambda _: None)
    committed = json.loads((COMMITTED / "manifest.json").read_text())
    assert manifest == committed


def test_each_kernel_has_its_argument_count_in_the_cubin():
    committed = json.loads((COMMITTED / "manifest.json").read_text())
    counts = {}
    for kernel in committed["kernels"]:
        variant = kernel["variants"][0]
        layout = parse_cubin((COMMITTED / variant["cubin"]).read_bytes()).layouts[variant["entry"]]
        # Call arguments, then Triton's two hidden scratch pointers.
        counts[kernel["name"]] = len(layout) - 2
    assert counts == {"args4": 4, "args14": 14, "args32": 32}
