"""The fixed packs committed in kernels/ (test, dispatch, benchmark, scalar, wrong-arch and
descriptor packs): each is its builder's output byte for byte (the cubins are compiled
without line info, so a build from any checkout gives the same bytes), and each has what
it exists for in its cubins."""

import json
from pathlib import Path

import pytest

from kpack_tools import (build_arch_pack, build_bench_pack, build_desc_pack,
                         build_dispatch_pack, build_scalar_pack, build_test_pack)
from kpack_tools.cubin import parse_cubin
from pack_validator import validate_manifest

KERNELS = Path(__file__).resolve().parents[2] / "kernels"

# (committed pack, its builder, the target it is built for)
FIXED_PACKS = [("testpack", build_test_pack, 90), ("dispatchpack", build_dispatch_pack, 90),
               ("benchpack", build_bench_pack, 90), ("scalarpack", build_scalar_pack, 90),
               ("archpack", build_arch_pack, 90), ("descpack", build_desc_pack, 90),
               ("descpack_sm80", build_desc_pack, 80)]


def _files(root: Path):
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("name, builder, target", FIXED_PACKS, ids=[p[0] for p in FIXED_PACKS])
def test_the_committed_pack_is_its_builders_output(tmp_path, name, builder, target):
    manifest = builder.build(tmp_path / name, target, log=lambda line: None)
    committed = KERNELS / name
    assert json.loads((committed / "manifest.json").read_text()) == manifest, \
        f"kernels/{name} is stale: rebuild it with python -m {builder.__name__} " \
        f"--out kernels/{name}" + (f" --target {target}" if target != 90 else "")
    assert validate_manifest(manifest, committed) == []
    fresh, old = _files(tmp_path / name), _files(committed)
    assert sorted(fresh) == sorted(old)
    assert [path for path in fresh if fresh[path] != old[path]] == []


def _layout(pack: str, kernel: int = 0):
    manifest = json.loads((KERNELS / pack / "manifest.json").read_text())
    variant = manifest["kernels"][kernel]["variants"][0]
    cubin = parse_cubin((KERNELS / pack / variant["cubin"]).read_bytes())
    return manifest["kernels"][kernel], variant, cubin


def test_each_bench_kernel_has_its_argument_count_in_the_cubin():
    counts = {}
    for i in range(3):
        kernel, variant, cubin = _layout("benchpack", i)
        # Call arguments, then Triton's two hidden scratch pointers.
        counts[kernel["name"]] = len(cubin.layouts[variant["entry"]]) - 2
    assert counts == {"args4": 4, "args14": 14, "args32": 32}


def test_the_fill_scalars_have_their_widths_in_the_cubin():
    _, variant, cubin = _layout("scalarpack")
    sizes = {slot["param"]: slot["size"] for slot in variant["layout"]}
    assert [sizes[p] for p in ("h", "b", "f", "d")] == [2, 2, 4, 8]
    assert [(s.offset, s.size) for s in cubin.layouts[variant["entry"]]] == \
        [(s["offset"], s["size"]) for s in variant["layout"]]


def test_the_archpack_manifest_arch_is_the_cubin_arch():
    assert build_arch_pack.ARCHS == (80, 100)
    for i, arch in enumerate(build_arch_pack.ARCHS):
        kernel, variant, cubin = _layout("archpack", i)
        assert kernel["name"] == f"add_sm{arch}"
        assert variant["arch"] == arch and cubin.arch == arch
