"""The wrong-architecture pack: honest about its arch, and reproducible."""

import json
from pathlib import Path

from kpack_tools import build_arch_pack
from kpack_tools.cubin import parse_cubin

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "kernels" / "archpack"


def test_builds_the_committed_pack(tmp_path):
    manifest = build_arch_pack.build(tmp_path / "pack", log=lambda _: None)
    committed = json.loads((COMMITTED / "manifest.json").read_text())
    assert [k["name"] for k in manifest["kernels"]] == ["add_sm80", "add_sm100"]
    for fresh, old in zip(manifest["kernels"], committed["kernels"]):
        assert fresh["variants"][0]["sha256"] == old["variants"][0]["sha256"]


def test_manifest_arch_is_the_cubin_arch():
    committed = json.loads((COMMITTED / "manifest.json").read_text())
    for kernel, arch in zip(committed["kernels"], build_arch_pack.ARCHS):
        variant = kernel["variants"][0]
        assert variant["arch"] == arch
        cubin = parse_cubin((COMMITTED / variant["cubin"]).read_bytes())
        assert cubin.arch == arch
