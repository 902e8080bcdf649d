"""Tests for the test-pack build, the pack writer and the cubin reader.

Run with ``PYTHONPATH=tools python3 -m pytest tools/tests``; no GPU needed.
The manifest validator (``pack_validator.py``) re-implements the rules of
docs/pack-format.md independently of the writer, so a writer bug cannot hide
behind itself.
"""

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kpack_tools import build_test_pack, fixed_pack
from kpack_tools.cubin import parse_cubin, read_cubin
from kpack_tools.pack import Kernel, Variant, write_pack
from pack_validator import CUOBJDUMP, validate_manifest

REPO = Path(__file__).resolve().parents[2]


def _variants(manifest):
    for kernel in manifest["kernels"]:
        for variant in kernel["variants"]:
            yield kernel, variant


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A fresh build of the test pack: (pack directory, manifest)."""
    out = tmp_path_factory.mktemp("build") / "testpack"
    manifest = build_test_pack.build(out, log=lambda line: None)
    return out, manifest


@pytest.fixture(scope="module")
def add_cubin(built):
    return (built[0] / "cubins" / "add" / "default.cubin").read_bytes()


def test_written_manifest_is_what_build_returned(built):
    out, manifest = built
    text = (out / "manifest.json").read_text(encoding="utf-8")
    assert text == json.dumps(manifest, indent=2) + "\n"


def test_manifest_follows_pack_format(built):
    out, manifest = built
    assert validate_manifest(manifest, out) == []
    assert [k["name"] for k in manifest["kernels"]] == \
        ["add", "scalars", "matmul", "cluster", "pdl", "scratch", "softmax"]


def test_layout_is_what_the_cubin_says(built):
    out, manifest = built
    for _, variant in _variants(manifest):
        cubin = read_cubin(out / variant["cubin"])
        assert cubin.arch == variant["arch"] == 90 and cubin.arch_specific
        assert cubin.entries == (variant["entry"],)
        slots = cubin.layouts[variant["entry"]]
        assert [(s["offset"], s["size"]) for s in variant["layout"]] == \
            [(s.offset, s.size) for s in slots]


def test_add_layout_is_the_known_truth(built):
    _, manifest = built
    add = manifest["kernels"][0]["variants"][0]
    assert [(s["param"], s["offset"], s["size"]) for s in add["layout"]] == [
        ("x_ptr", 0, 8), ("y_ptr", 8, 8), ("out_ptr", 16, 8), ("n", 24, 4),
        ("$global_scratch", 32, 8), ("$profile_scratch", 40, 8)]


@pytest.mark.skipif(not CUOBJDUMP.is_file(), reason="Triton's cuobjdump not found")
def test_cubin_reader_agrees_with_cuobjdump(built):
    out, manifest = built
    for _, variant in _variants(manifest):
        path = out / variant["cubin"]
        dump = subprocess.run([str(CUOBJDUMP), "-elf", str(path)], check=True,
                              capture_output=True, text=True).stdout
        assert "sm=90a" in dump.splitlines()[1]
        records = re.findall(r"Ordinal\s*:\s*(0x[0-9a-f]+)\s+Offset\s*:\s*(0x[0-9a-f]+)\s+"
                             r"Size\s*:\s*(0x[0-9a-f]+)", dump)
        expected = sorted(tuple(int(v, 16) for v in record) for record in records)
        slots = read_cubin(path).layouts[variant["entry"]]
        assert [(s.ordinal, s.offset, s.size) for s in slots] == expected


def test_kernels_have_their_features(built):
    _, manifest = built
    variants = {k["name"]: v for k, v in _variants(manifest)}
    assert variants["matmul"]["shared"] > 49152
    assert variants["cluster"]["num_ctas"] == 2
    assert variants["pdl"]["launch_pdl"] is True
    assert variants["scratch"]["global_scratch_size"] > 0
    scalars = [(s["param"], s["size"]) for s in variants["scalars"]["layout"]]
    assert scalars[3:8] == [("alpha", 4), ("beta", 2), ("gamma", 2), ("flag", 1), ("big", 8)]
    assert 0 < variants["softmax"]["shared"] <= 49152


def test_softmax_is_row_per_program_without_grid(built):
    """softmax: the caller passes the grid (one program per row); the layout
    and metadata are the ones tools/README.md documents."""
    _, manifest = built
    kernel = manifest["kernels"][-1]
    assert kernel["name"] == "softmax" and "grid" not in kernel and "buckets" not in kernel
    assert [(p["name"], p["type"]) for p in kernel["params"]] == [
        ("out_ptr", "*fp32"), ("in_ptr", "*fp32"), ("in_row_stride", "i32"),
        ("out_row_stride", "i32"), ("n_cols", "i32"), ("BLOCK", "constexpr")]
    variant, = kernel["variants"]
    assert variant["constexprs"] == {"BLOCK": 1024}
    assert (variant["num_warps"], variant["num_ctas"], variant["shared"],
            variant["global_scratch_size"], variant["launch_pdl"]) == (4, 1, 16, 0, False)
    assert [(s["param"], s["offset"], s["size"]) for s in variant["layout"]] == [
        ("out_ptr", 0, 8), ("in_ptr", 8, 8), ("in_row_stride", 16, 4),
        ("out_row_stride", 20, 4), ("n_cols", 24, 4),
        ("$global_scratch", 32, 8), ("$profile_scratch", 40, 8)]


def test_softmax_ptx_matches_the_documented_accuracy():
    """tools/README.md derives softmax's error bound from these instructions:
    exp as a rounded multiply by log2(e) then ex2.approx.f32 (2 ulp, subnormals
    kept), the quotient as div.full.f32 (2 ulp), no FMA contraction."""
    spec = next(k for k in build_test_pack.TEST_KERNELS if k.name == "softmax")
    ptx = fixed_pack.compile_kernel(spec, 90).asm["ptx"]
    ops = re.findall(r"^\s*(?:@%p\d+\s+)?([a-z][a-z0-9_.]*)\s", ptx, re.M)
    float_ops = sorted({op for op in ops if op.endswith(".f32")})
    assert float_ops == ["add.f32", "div.full.f32", "ex2.approx.f32", "max.f32",
                         "mul.f32", "sub.f32"]
    assert ptx.count("ex2.approx.f32") == ptx.count("div.full.f32") == 8
    assert re.findall(r"mul\.f32\s+%r\d+, %r\d+, (0f[0-9A-F]{8});", ptx) == ["0f3FB8AA3B"] * 8


@pytest.mark.skipif(not CUOBJDUMP.is_file(), reason="Triton's cuobjdump not found")
def test_softmax_sass_has_no_fma(built):
    """ptxas may contract a multiply and an add on its own; the documented
    bound assumes every operation rounds separately."""
    out, _ = built
    sass = subprocess.run([str(CUOBJDUMP), "-sass", str(out / "cubins/softmax/default.cubin")],
                          check=True, capture_output=True, text=True).stdout
    assert sass.count("MUFU.EX2") == 8 and sass.count("MUFU.RCP") == 1
    assert "FFMA" not in sass


def test_pack_is_small(built):
    out, _ = built
    assert sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) < 500 * 1024


def _add_variant(cubin, **metadata):
    meta = {"name": "add_kernel", "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
            "num_warps": 4, "num_ctas": 1, "shared": 0,
            "global_scratch_size": 0, "global_scratch_align": 1,
            "profile_scratch_size": 0, "profile_scratch_align": 1,
            "launch_pdl": False, "launch_cooperative_grid": False}
    meta.update(metadata)
    return Variant(name="default", cubin=cubin, metadata=meta, constexprs={"BLOCK": 1024})


ADD_PARAMS = [("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"),
              ("BLOCK", "constexpr")]


def test_writer_accepts_raw_cubin_and_metadata(tmp_path, add_cubin):
    manifest = write_pack(tmp_path / "p", [Kernel("add", ADD_PARAMS, [_add_variant(add_cubin)])])
    assert validate_manifest(manifest, tmp_path / "p") == []
    assert "generator" not in manifest and "num_stages" not in manifest["kernels"][0]["variants"][0]


@pytest.mark.parametrize("params, variant_meta, message", [
    (ADD_PARAMS[:2] + ADD_PARAMS[3:], {}, "cubin has 6 parameters, expected 3 call"),
    (ADD_PARAMS[:3] + [("n", "i64"), ADD_PARAMS[4]], {}, "('n') is 4 bytes, its type needs 8"),
    (ADD_PARAMS, {"name": "other_kernel"}, "entry 'other_kernel' not in cubin"),
    (ADD_PARAMS, {"target": {"arch": 80}}, "cubin is for sm_90, metadata target is 80"),
    (ADD_PARAMS[:4] + [("BLOCK", "nvTmaDesc")], {},
     "'nvTmaDesc' (a caller-encoded CUtensorMap) is not supported"),
])
def test_writer_refuses_mismatches(tmp_path, add_cubin, params, variant_meta, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        write_pack(tmp_path / "p",
                   [Kernel("add", params, [_add_variant(add_cubin, **variant_meta)])])
    assert not (tmp_path / "p").exists()


def test_writer_refuses_to_replace_a_non_pack(tmp_path, add_cubin):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "precious.txt").write_text("keep me")
    with pytest.raises(ValueError, match="is not a pack"):
        write_pack(tmp_path / "p", [Kernel("add", ADD_PARAMS, [_add_variant(add_cubin)])])
    assert (tmp_path / "p" / "precious.txt").read_text() == "keep me"


def _section_header(data, name):
    """Byte offset of the section header named ``name``."""
    shoff, = struct.unpack_from("<Q", data, 40)
    shnum, shstrndx = struct.unpack_from("<HH", data, 60)
    strtab_offset, = struct.unpack_from("<Q", data, shoff + shstrndx * 64 + 24)
    for i in range(shnum):
        header = shoff + i * 64
        name_offset, = struct.unpack_from("<I", data, header)
        start = strtab_offset + name_offset
        if data[start:data.index(b"\0", start)] == name.encode():
            return header
    raise KeyError(name)


def _kparam_payloads(data):
    """Byte offsets of the KPARAM_INFO payloads in .nv.info.add_kernel."""
    header = _section_header(data, ".nv.info.add_kernel")
    offset, size = struct.unpack_from("<QQ", data, header + 24)
    body = data[offset:offset + size]
    return [offset + m.start() + 4 for m in re.finditer(b"\x04\x17\x0c\x00", body)]


@pytest.mark.parametrize("cut", [0, 3, 20, 63, 64, 200, 2000, -300, -1])
def test_cubin_truncated(add_cubin, cut):
    with pytest.raises(ValueError, match="truncated|not an ELF"):
        parse_cubin(add_cubin[:cut])


@pytest.mark.parametrize("data", [b"", b"hello world" * 10, b"// PTX\n.version 8.7\n" * 5])
def test_cubin_not_elf(data):
    with pytest.raises(ValueError, match="not an ELF file"):
        parse_cubin(data)


def test_cubin_wrong_class_machine_abi(add_cubin):
    elf32 = add_cubin[:4] + b"\x01" + add_cubin[5:]
    with pytest.raises(ValueError, match="not a 64-bit little-endian"):
        parse_cubin(elf32)
    x86 = add_cubin[:18] + struct.pack("<H", 62) + add_cubin[20:]
    with pytest.raises(ValueError, match="e_machine is 62"):
        parse_cubin(x86)
    abi9 = add_cubin[:8] + b"\x09" + add_cubin[9:]
    with pytest.raises(ValueError, match="unsupported CUDA ELF ABI version 9"):
        parse_cubin(abi9)


def test_cubin_missing_nv_info_section(add_cubin):
    renamed = add_cubin.replace(b".nv.info.add_kernel\0", b".nv.ofni.add_kernel\0")
    assert renamed != add_cubin
    with pytest.raises(ValueError, match=r"no section '\.nv\.info\.add_kernel'"):
        parse_cubin(renamed)


def test_cubin_truncated_nv_info_record(add_cubin):
    data = bytearray(add_cubin)
    header = _section_header(data, ".nv.info.add_kernel")
    size, = struct.unpack_from("<Q", data, header + 32)
    struct.pack_into("<Q", data, header + 32, size - 2)
    with pytest.raises(ValueError, match="runs past the end|truncated record"):
        parse_cubin(bytes(data))


def test_cubin_bad_kparam_ordinals(add_cubin):
    data = bytearray(add_cubin)
    payloads = _kparam_payloads(data)
    assert len(payloads) == 6
    struct.pack_into("<H", data, payloads[0] + 4, 0)  # two parameters with ordinal 0
    with pytest.raises(ValueError, match=r"ordinals of 'add_kernel' are not 0\.\.5"):
        parse_cubin(bytes(data))


def test_cubin_layout_sorted_by_ordinal(add_cubin):
    cubin = parse_cubin(add_cubin)
    assert cubin.entries == ("add_kernel",)
    assert [s.ordinal for s in cubin.layouts["add_kernel"]] == list(range(6))
    # ptxas writes the records in descending ordinal order; sorting is the reader's job.
    data = add_cubin
    ordinals = [struct.unpack_from("<H", data, p + 4)[0] for p in _kparam_payloads(data)]
    assert ordinals == sorted(ordinals, reverse=True)


def test_cli_writes_the_pack(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "tools"))
    out = tmp_path / "cli"
    result = subprocess.run(
        [sys.executable, "-m", "kpack_tools.build_test_pack",
         "--out", str(out)], env=env, check=True, capture_output=True, text=True)
    assert "matmul" in result.stdout and (out / "manifest.json").is_file()
