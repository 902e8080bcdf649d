"""The scalar pack: reproducible from its source, with the scalar slots it claims."""

import json
from pathlib import Path

from kpack_tools import build_scalar_pack
from kpack_tools.cubin import parse_cubin

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "kernels" / "scalarpack"


def test_builds_the_committed_pack(tmp_path):
    manifest = build_scalar_pack.build(tmp_path / "pack", log=lambda _: None)
    committed = json.loads((COMMITTED / "manifest.json").read_text())
    assert manifest == committed


def test_scalars_have_their_widths_in_the_cubin():
    committed = json.loads((COMMITTED / "manifest.json").read_text())
    variant = committed["kernels"][0]["variants"][0]
    layout = parse_cubin((COMMITTED / variant["cubin"]).read_bytes()).layouts[variant["entry"]]
    sizes = {slot["param"]: slot["size"] for slot in variant["layout"]}
    assert [sizes[p] for p in ("h", "b", "f", "d")] == [2, 2, 4, 8]
    assert [(s.offset, s.size) for s in layout] == [(s["offset"], s["size"])
                                                    for s in variant["layout"]]
