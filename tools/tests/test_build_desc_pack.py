"""The descriptor packs (kernels/descpack, kernels/descpack_sm80) and the pack writer's
handling of tensordesc parameters and flattened tuples."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from kpack_tools import build_desc_pack, fixed_pack
from kpack_tools.pack import build_manifest
from kpack_tools.param_types import desc_parts, parse_tensordesc, tensordesc_meta_entry
from pack_validator import cuobjdump_slots

REPO = Path(__file__).resolve().parents[2]


def test_the_layouts_are_what_cuobjdump_reads():
    # The committed packs are their builder's output (test_fixed_packs.py); cuobjdump reads
    # sm_90a cubins.
    pack = REPO / "kernels" / "descpack"
    for kernel in json.loads((pack / "manifest.json").read_text())["kernels"]:
        variant = kernel["variants"][0]
        slots = cuobjdump_slots(pack / variant["cubin"], variant["entry"])
        assert [(s["offset"], s["size"]) for s in variant["layout"]] == \
            [(offset, size) for _, offset, size in slots]


def test_descriptor_and_tuple_layouts():
    manifest = json.loads((REPO / "kernels" / "descpack" / "manifest.json").read_text())
    kernels = {k["name"]: k for k in manifest["kernels"]}
    assert manifest["format"] == "kpack/2"
    copy = kernels["copy_tma"]["variants"][0]
    assert [(s["param"], s.get("part"), s["offset"], s["size"]) for s in copy["layout"][:2]] == \
        [("in_desc", "tma", 48, 128), ("in_desc", "shape[0]", 176, 4)]
    # Triton's metadata says elem_type 1 for int16 (its device numbering); the driver's
    # CUtensorMapDataType is UINT16 = 1 too. For fp16 both are 6.
    assert kernels["copy_i16"]["variants"][0]["tensordesc_meta"][0]["data_type"] == 1
    assert copy["tensordesc_meta"][0] == {"data_type": 6, "elem_size": 2, "swizzle": 3,
                                          "block_size": [64, 64], "fp4_padded": False}
    pair = kernels["axpy_pair"]
    assert [p["name"] for p in pair["params"]] == ["ptrs.0", "ptrs.1", "n", "coefs.0",
                                                   "coefs.1", "BLOCK"]
    sm80 = json.loads((REPO / "kernels" / "descpack_sm80" / "manifest.json").read_text())
    pointer = sm80["kernels"][0]["variants"][0]
    assert "tensordesc_meta" not in pointer
    assert [s.get("part") for s in pointer["layout"][:10]] == [p for p, _ in desc_parts(2, False)]


def test_tensordesc_helpers():
    assert parse_tensordesc("tensordesc<fp16[64, 128]>") == ("fp16", (64, 128))
    for bad in ("tensordesc<fp16>", "tensordesc<fp17[64]>", "tensordesc<fp16[1, 1, 1, 1, 1, 1]>",
                "tensordesc<fp16[64, 128],NVMMASharedLayout()>"):
        with pytest.raises(ValueError):
            parse_tensordesc(bad)
    assert [size for _, size in desc_parts(2, True)] == [128, 4, 4, 8, 8]
    # Triton's device-side numbering of the TMA element types differs from the driver's at
    # 8, 9 and 10 (driver.py, TMA_DTYPE_DEVICE_TO_HOST).
    meta = {"swizzle": 1, "elem_size": 4, "block_size": [8], "fp4_padded": False}
    assert [tensordesc_meta_entry({**meta, "elem_type": t})["data_type"]
            for t in (6, 8, 9, 10)] == [6, 10, 8, 9]
    assert tensordesc_meta_entry(None) is None


def _copy_kernel():
    spec, arch = build_desc_pack.KERNELS[0]
    kernel = spec.kernel(fixed_pack.compile_kernel(spec, arch))
    return dataclasses.replace(kernel, grid=None, variants=[
        dataclasses.replace(kernel.variants[0], name="v")])


@pytest.mark.parametrize("change, message", [
    (lambda k, v: (k, dataclasses.replace(v, types={"in_desc": "tensordesc<bf16[64, 128]>"})),
     "must be a tensordesc type of the element type and rank"),
    (lambda k, v: (k, dataclasses.replace(v, metadata={**v.metadata, "tensordesc_meta":
                                                       v.metadata["tensordesc_meta"][:1]})),
     "metadata tensordesc_meta has 1 entries for 2 tensordesc parameters"),
    (lambda k, v: (dataclasses.replace(k, params=[("in_desc", "tensordesc<fp16[64, 128, 2]>")]
                                       + list(k.params[1:])), v),
     "cubin has 14 parameters, expected 14 call parameters (tensordesc parameters counted "
     "by their parts)"),
    (lambda k, v: (dataclasses.replace(k, params=[("in_desc", "tensordesc<fp16[64]x>")]
                                       + list(k.params[1:])), v),
     "is not a tensordesc<DTYPE[B0, ...]> type"),
])
def test_writer_refuses_descriptor_mismatches(change, message):
    kernel = _copy_kernel()
    kernel, variant = change(kernel, kernel.variants[0])
    with pytest.raises(ValueError, match=re.escape(message)):
        build_manifest([dataclasses.replace(kernel, variants=[variant])])


def test_block_shapes_do_not_tell_variants_apart():
    """Two variants that differ only in a descriptor's block shape could not be told apart
    at launch (the caller's descriptor has no block shape): the second is refused."""
    kernel = _copy_kernel()
    other = dataclasses.replace(kernel.variants[0], name="w",
                                types={"in_desc": "tensordesc<fp16[128, 128]>"})
    with pytest.raises(ValueError, match="variant 'w' has the same bucket, assumptions and "
                                         "types as variant 'v'"):
        build_manifest([dataclasses.replace(kernel, variants=[kernel.variants[0], other])])
