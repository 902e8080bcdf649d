"""Tests for the dispatch pack and the writer's dispatch checks.

Run with ``PYTHONPATH=tools python3 -m pytest tools/tests``; no GPU needed.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kpack_tools import build_dispatch_pack
from kpack_tools.cubin import read_cubin
from kpack_tools.grid_expr import (check_grid_expression, evaluate_grid_expression,
                                   parse_grid_expression)
from kpack_tools.pack import Kernel, Variant, write_pack
from pack_validator import (CUOBJDUMP, bucket_of, choose_variant, cuobjdump_slots,
                            validate_manifest)

REPO = Path(__file__).resolve().parents[2]

DIV16 = {"x_ptr": ["div16"], "y_ptr": ["div16"], "out_ptr": ["div16"], "n": ["div16"]}
UNIT = {**DIV16, "stride_x": ["eq1"]}
# name: (bucket, BLOCK, num_warps, assumptions, types)
EXPECTED = {
    "b0_generic": (0, 256, 2, None, None),
    "b0_div16": (0, 256, 2, DIV16, None),
    "b0_div16_unit": (0, 256, 2, UNIT, None),
    "b1_generic": (1, 1024, 4, None, None),
    "b1_div16": (1, 1024, 4, DIV16, None),
    "b1_div16_unit": (1, 1024, 4, UNIT, None),
    "b2_generic": (2, 4096, 8, None, None),
    "b2_div16": (2, 4096, 8, DIV16, None),
    "b2_div16_unit": (2, 4096, 8, UNIT, None),
    "b2_generic_i64": (2, 4096, 8, None, {"n": "i64"}),
}
I32_LAYOUT = [("x_ptr", 0, 8), ("y_ptr", 8, 8), ("out_ptr", 16, 8), ("n", 24, 4),
              ("stride_x", 28, 4), ("alpha", 32, 4),
              ("$global_scratch", 40, 8), ("$profile_scratch", 48, 8)]
UNIT_LAYOUT = [("x_ptr", 0, 8), ("y_ptr", 8, 8), ("out_ptr", 16, 8), ("n", 24, 4),
               ("alpha", 28, 4), ("$global_scratch", 32, 8), ("$profile_scratch", 40, 8)]
I64_LAYOUT = [("x_ptr", 0, 8), ("y_ptr", 8, 8), ("out_ptr", 16, 8), ("n", 24, 8),
              ("stride_x", 32, 4), ("alpha", 36, 4),
              ("$global_scratch", 40, 8), ("$profile_scratch", 48, 8)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A fresh build of the dispatch pack: (pack directory, manifest)."""
    out = tmp_path_factory.mktemp("build") / "dispatchpack"
    manifest = build_dispatch_pack.build(out, log=None)
    return out, manifest


@pytest.fixture(scope="module")
def axpy(built):
    return built[1]["kernels"][0]


def _variant(axpy, name):
    return next(v for v in axpy["variants"] if v["name"] == name)


def test_written_manifest_is_what_build_returned(built):
    out, manifest = built
    text = (out / "manifest.json").read_text(encoding="utf-8")
    assert text == json.dumps(manifest, indent=2) + "\n"


def test_manifest_follows_pack_format(built, axpy):
    out, manifest = built
    assert validate_manifest(manifest, out) == []
    assert [k["name"] for k in manifest["kernels"]] == ["axpy"]
    assert axpy["buckets"] == [{"param": "n", "edges": [4096, 262144]}]
    assert axpy["grid"] == ["cdiv(n, BLOCK)"]
    assert [(p["name"], p["type"]) for p in axpy["params"]] == [
        ("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"),
        ("stride_x", "i32"), ("alpha", "fp32"), ("BLOCK", "constexpr")]


def test_variants_are_the_specified_ones(axpy):
    assert [v["name"] for v in axpy["variants"]] == list(EXPECTED)
    for variant in axpy["variants"]:
        bucket, block, warps, assumptions, types = EXPECTED[variant["name"]]
        assert variant["bucket"] == [bucket]
        assert variant["constexprs"] == {"BLOCK": block}
        assert variant["num_warps"] == warps and variant["num_ctas"] == 1
        assert variant.get("assumptions") == assumptions
        assert variant.get("types") == types
        assert variant["shared"] == 0 and variant["global_scratch_size"] == 0
        assert variant["launch_pdl"] is False


def test_layouts_are_the_known_truth(axpy):
    for variant in axpy["variants"]:
        layout = [(s["param"], s["offset"], s["size"]) for s in variant["layout"]]
        name = variant["name"]
        want = UNIT_LAYOUT if name.endswith("_unit") else \
            I64_LAYOUT if name.endswith("_i64") else I32_LAYOUT
        assert layout == want, name


def test_layout_is_what_the_cubin_says(built, axpy):
    out, _ = built
    for variant in axpy["variants"]:
        cubin = read_cubin(out / variant["cubin"])
        assert cubin.arch == variant["arch"] == 90 and cubin.arch_specific
        assert cubin.entries == (variant["entry"],) == ("axpy_kernel",)
        slots = cubin.layouts[variant["entry"]]
        assert [(s["offset"], s["size"]) for s in variant["layout"]] == \
            [(s.offset, s.size) for s in slots]


@pytest.mark.skipif(not CUOBJDUMP.is_file(), reason="Triton's cuobjdump not found")
def test_cubin_reader_agrees_with_cuobjdump(built, axpy):
    out, _ = built
    for variant in axpy["variants"]:
        path = out / variant["cubin"]
        slots = read_cubin(path).layouts[variant["entry"]]
        assert [(s.ordinal, s.offset, s.size) for s in slots] == \
            cuobjdump_slots(path, variant["entry"])


def test_every_variant_is_a_distinct_cubin(built, axpy):
    assert len({v["sha256"] for v in axpy["variants"]}) == len(axpy["variants"])


def test_pack_is_small(built):
    out, _ = built
    assert sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) < 300 * 1024


# --- what the runtime must choose (reference chooser in pack_validator.py) ---

ALIGNED, MISALIGNED = 0x7f0000000000, 0x7f0000000004


def _args(n, stride_x=1, x=ALIGNED, y=ALIGNED, out=ALIGNED):
    return {"x_ptr": x, "y_ptr": y, "out_ptr": out, "n": n, "stride_x": stride_x, "alpha": 2.0}


@pytest.mark.parametrize("args, expected", [
    (_args(16), "b0_div16_unit"),
    (_args(16, stride_x=2), "b0_div16"),
    (_args(16, stride_x=-1), "b0_div16"),
    (_args(16, x=MISALIGNED), "b0_generic"),
    (_args(17), "b0_generic"),
    (_args(1), "b0_generic"),            # n == 1: no variant assumes eq1 on n
    (_args(0), "b0_div16_unit"),          # 0 is a multiple of 16
    (_args(4096), "b0_div16_unit"),       # edges are inclusive upper bounds
    (_args(4097), "b1_generic"),
    (_args(4112, stride_x=3), "b1_div16"),
    (_args(262144), "b1_div16_unit"),
    (_args(262145), "b2_generic"),
    (_args(2**31 - 16), "b2_div16_unit"),
    (_args(2**31 - 1), "b2_generic"),     # i32 before i64
    (_args(2**31), "b2_generic_i64"),     # only the i64 build fits
    (_args(2**31, stride_x=1, x=ALIGNED), "b2_generic_i64"),
    (_args(2**31 + 5, stride_x=7), "b2_generic_i64"),
    (_args(2**63), None),                 # no variant types n as u64
    (_args(100, stride_x=2**31), None),   # stride_x is i32 in every variant
])
def test_reference_choice(axpy, args, expected):
    chosen = choose_variant(axpy, args)
    assert (chosen and chosen["name"]) == expected


def test_every_i32_n_has_a_fallback(axpy):
    for n in (-5, 0, 1, 4095, 4096, 4097, 262144, 262145, 2**31 - 1):
        for stride in (-3, 1, 2):
            assert choose_variant(axpy, _args(n, stride, x=MISALIGNED)) is not None
    assert bucket_of(axpy, _args(4096)) == (0,) and bucket_of(axpy, _args(4097)) == (1,)


@pytest.mark.parametrize("n, expected", [(1, 1), (256, 1), (257, 2), (10000, 10),
                                         (2**31 + 1, 2**19 + 1), (0, 0)])
def test_grid_expression(axpy, n, expected):
    chosen = choose_variant(axpy, _args(n, stride_x=3))
    tree = parse_grid_expression(axpy["grid"][0])
    assert evaluate_grid_expression(tree, {"n": n, **chosen["constexprs"]}) == expected


# --- the writer refuses bad dispatch specs ---

PARAMS = list(build_dispatch_pack.PARAMS)
BUCKETS = [{"param": "n", "edges": [4096, 262144]}]


def _from_pack(out, entry, **dispatch):
    """A writer Variant rebuilt from a written manifest entry, dispatch fields replaced."""
    meta = {field: entry[field] for field in (
        "num_warps", "num_ctas", "shared", "global_scratch_size", "global_scratch_align",
        "profile_scratch_size", "profile_scratch_align", "launch_pdl",
        "launch_cooperative_grid")}
    meta.update(name=entry["entry"], target={"backend": "cuda", "arch": entry["arch"]},
                num_stages=entry["num_stages"], triton_version=entry["triton_version"])
    fields = {"bucket": entry.get("bucket"), "assumptions": entry.get("assumptions"),
              "types": entry.get("types")}
    fields.update(dispatch)
    return Variant(name=fields.pop("name", entry["name"]),
                   cubin=(out / entry["cubin"]).read_bytes(), metadata=meta,
                   constexprs=entry["constexprs"], **fields)


def test_writer_round_trips_the_pack(tmp_path, built, axpy):
    out, manifest = built
    variants = [_from_pack(out, v) for v in axpy["variants"]]
    rewritten = write_pack(tmp_path / "p", [Kernel("axpy", PARAMS, variants, BUCKETS,
                                                   axpy["grid"])])
    assert rewritten["kernels"] == manifest["kernels"]


def test_writer_single_variant_without_dispatch_fields(tmp_path, built, axpy):
    entry = _variant(axpy, "b1_generic")
    manifest = write_pack(tmp_path / "p", [Kernel("axpy", PARAMS, [
        _from_pack(built[0], entry, bucket=None)])])
    kernel = manifest["kernels"][0]
    assert set(kernel) == {"name", "params", "variants"}
    assert not {"bucket", "assumptions", "types"} & set(kernel["variants"][0])
    assert validate_manifest(manifest, tmp_path / "p") == []


# (variant name in the built pack, dispatch overrides, kernel overrides, message)
BAD_SPECS = [
    ("b0_generic", {"assumptions": {"stride_x": ["eq1"]}}, {},
     "have an eq1 assumption but the cubin still has a slot"),
    ("b0_div16_unit", {"assumptions": DIV16}, {}, "cubin has 7 parameters, expected 6 call"),
    ("b0_generic", {}, {"buckets": [{"param": "n", "edges": [262144, 4096]}]},
     "edges [262144, 4096] are not strictly increasing"),
    ("b0_generic", {}, {"buckets": [{"param": "n", "edges": [4096, 4096]}]},
     "are not strictly increasing"),
    ("b0_generic", {}, {"buckets": [{"param": "n", "edges": []}]},
     "edges must be a non-empty list"),
    ("b0_generic", {}, {"buckets": [{"param": "n", "edges": [1.5]}]},
     "edge 1.5 is not a 64-bit integer"),
    ("b0_generic", {}, {"buckets": [{"param": "n", "edges": list(range(4096))}]},
     "4097 buckets, at most 4096"),
    ("b0_generic", {}, {"buckets": [{"param": "alpha", "edges": [1]}]},
     "a bucket dim needs an integer call parameter"),
    ("b0_generic", {}, {"buckets": [{"param": "m", "edges": [1]}]}, "unknown parameter 'm'"),
    ("b0_generic", {"bucket": [3]}, {}, "bucket[0] = 3 is out of range for 'n'"),
    ("b0_generic", {"bucket": [-1]}, {}, "bucket[0] = -1 is out of range"),
    ("b0_generic", {"bucket": [0, 0]}, {}, "must list one index per bucket dim (1)"),
    ("b0_generic", {"bucket": [0]}, {"buckets": None}, "but the kernel has no buckets"),
    ("b0_generic", {"assumptions": {"alpha": ["div16"]}}, {},
     "div16 on 'alpha' of type fp32; div16 needs a pointer or integer parameter"),
    ("b0_generic", {"assumptions": {"x_ptr": ["eq1"]}}, {},
     "eq1 on 'x_ptr' of type *fp32; eq1 needs an integer parameter"),
    ("b0_generic", {"assumptions": {"n": ["div8"]}}, {}, "unknown assumption 'div8'"),
    ("b0_generic", {"assumptions": {"n": []}}, {}, "needs a non-empty list"),
    ("b0_generic", {"assumptions": {"BLOCK": ["div16"]}}, {}, "'BLOCK' is not a call parameter"),
    ("b0_div16_unit", {"assumptions": {**DIV16, "stride_x": ["eq1", "div16"]}}, {},
     "cannot be both div16 and eq1"),
    ("b0_generic", {"types": {"n": "fp32"}}, {}, "'n' -> 'fp32' is not an integer type"),
    ("b0_generic", {"types": {"n": "*i32"}}, {}, "'n' -> '*i32' is not an integer type"),
    ("b0_generic", {"types": {"alpha": "i32"}}, {}, "only integer parameters may be retyped"),
    ("b0_generic", {"types": {"n": "i64"}}, {},
     "('n') is 4 bytes, its type i64 (types override) needs 8"),
    ("b2_generic_i64", {"types": None}, {}, "('n') is 8 bytes, its type needs 4"),
    ("b0_generic", {}, {"grid": ["cdiv(n, BLOCK"]}, "grid[0]: 'cdiv(n, BLOCK': syntax error"),
    ("b0_generic", {}, {"grid": ["cdiv(n, BLOCK)", "m"]}, "grid[1]: 'm': unknown name 'm'"),
    ("b0_generic", {}, {"grid": ["alpha"]}, "parameter 'alpha' is fp32, not an integer"),
    ("b0_generic", {}, {"grid": ["n / (BLOCK - 256)"]}, "division by zero while folding"),
    ("b0_generic", {}, {"grid": ["1", "1", "1", "1"]}, "grid must be a list of 1-3"),
    ("b0_generic", {}, {"grid": "cdiv(n, BLOCK)"}, "grid must be a list of 1-3"),
]


@pytest.mark.parametrize("name, dispatch, kernel_fields, message", BAD_SPECS)
def test_writer_refuses_bad_dispatch(tmp_path, built, axpy, name, dispatch, kernel_fields,
                                     message):
    variant = _from_pack(built[0], _variant(axpy, name), **dispatch)
    fields = {"buckets": BUCKETS, "grid": ["cdiv(n, BLOCK)"]}
    fields.update(kernel_fields)
    with pytest.raises(ValueError, match=re.escape(message)):
        write_pack(tmp_path / "p", [Kernel("axpy", PARAMS, [variant], **fields)])
    assert not (tmp_path / "p").exists()


def test_writer_refuses_duplicate_variants(tmp_path, built, axpy):
    out = built[0]
    generic = _variant(axpy, "b0_generic")
    with pytest.raises(ValueError, match="duplicate variant name 'b0_generic'"):
        write_pack(tmp_path / "p", [Kernel("axpy", PARAMS, [
            _from_pack(out, generic), _from_pack(out, generic)], BUCKETS)])
    with pytest.raises(ValueError, match="same bucket, assumptions and types as variant "
                                         "'b0_generic', so it would never be chosen"):
        write_pack(tmp_path / "p", [Kernel("axpy", PARAMS, [
            _from_pack(out, generic), _from_pack(out, generic, name="again")], BUCKETS)])
    assert not (tmp_path / "p").exists()


def test_writer_refuses_a_bucket_without_variants(tmp_path, built, axpy):
    """The runtime refuses such a pack at Open; the writer refuses to write it."""
    out = built[0]
    variants = [_from_pack(out, _variant(axpy, name)) for name in ("b0_generic", "b2_generic")]
    with pytest.raises(ValueError, match=re.escape(
            "no variant serves bucket [1] (4097 <= n <= 262144); every bucket needs a variant")):
        write_pack(tmp_path / "p", [Kernel("axpy", PARAMS, variants, BUCKETS)])
    assert not (tmp_path / "p").exists()


def test_validator_flags_a_bucket_without_variants(built):
    out, manifest = built
    broken = json.loads(json.dumps(manifest))
    kernel = broken["kernels"][0]
    kernel["variants"] = [v for v in kernel["variants"] if v["bucket"] != [1]]
    assert "kernel 'axpy': no variant serves bucket [1]" in validate_manifest(broken, out)


@pytest.mark.parametrize("text, message", [
    ("", "empty expression"), ("-n", "found '-'"), ("n +", "end of expression"),
    ("foo(1, 2)", "unknown function 'foo'"), ("n % 2", "unexpected character '%'"),
    ("cdiv(n)", "expected ','"), ("n)", "unexpected ')'"),
    ("99999999999999999999", "does not fit in 64 bits"),
])
def test_grid_syntax_errors(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_grid_expression(text)


def test_grid_folding_and_evaluation():
    types = {"n": "i32", "m": "i64", "BLOCK": "constexpr"}
    check_grid_expression("max(cdiv(n, BLOCK), 1) * min(m, 3) + (BLOCK - 1) / 2",
                          types, {"BLOCK": 64}, "w")
    with pytest.raises(ValueError, match="64-bit overflow while folding"):
        check_grid_expression("n + 9223372036854775807 * 2", types, {"BLOCK": 64}, "w")
    with pytest.raises(ValueError, match="constexpr 'BLOCK' = 1.5 is not an integer"):
        check_grid_expression("cdiv(n, BLOCK)", types, {"BLOCK": 1.5}, "w")
    tree = parse_grid_expression("(0 - 7) / 2 + cdiv(n, 4) - min(n, 2) * max(1, 0)")
    assert evaluate_grid_expression(tree, {"n": 9}) == -3 + 3 - 2  # truncating division


def test_cli_writes_the_pack(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "tools"))
    out = tmp_path / "cli"
    result = subprocess.run(
        [sys.executable, "-m", "kpack_tools.build_dispatch_pack", "--out", str(out)],
        env=env, check=True, capture_output=True, text=True)
    assert "b2_generic_i64" in result.stdout and (out / "manifest.json").is_file()
    assert "div16(x_ptr,y_ptr,out_ptr,n) eq1(stride_x)" in result.stdout


# --- the test-side validator catches what the writer refuses ---

def _set(path, value):
    def mutate(manifest):
        node = manifest["kernels"][0]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return mutate


def _add_stride_slot(manifest):
    layout = manifest["kernels"][0]["variants"][2]["layout"]  # b0_div16_unit
    layout.insert(4, {"param": "stride_x", "offset": 28, "size": 4})
    for slot, offset in zip(layout[5:], (32, 40, 48)):
        slot["offset"] = offset


@pytest.mark.parametrize("mutate, message", [
    (_add_stride_slot, "call params in layout"),
    (_set(["buckets", 0, "edges"], [262144, 4096]), "not strictly increasing"),
    (_set(["buckets", 0, "param"], "alpha"), "is not an integer"),
    (_set(["variants", 0, "bucket"], [3]), "out of range"),
    (_set(["variants", 0, "assumptions"], {"alpha": ["div16"]}), "div16 on fp32"),
    (_set(["variants", 0, "assumptions"], {"x_ptr": ["eq1"]}), "eq1 on *fp32"),
    (_set(["variants", 0, "types"], {"n": "fp32"}), "types 'n'"),
    (_set(["variants", 0, "types"], {"n": "i64"}), "layout[3].size 4 != 8"),
    (_set(["variants", 1, "name"], "b0_generic"), "duplicate variant names"),
    (_set(["grid"], ["cdiv(n, x_ptr)"]), "not an integer call parameter"),
    (_set(["grid"], ["n ** 2"]), "operator Pow"),
    (_set(["grid"], ["n / 0"]), "division by literal zero"),
    (_set(["grid"], ["1", "1", "1", "1"]), "grid must be 1-3 strings"),
    (_set(["surprise"], 1), "fields"),
])
def test_validator_catches(built, mutate, message):
    out, manifest = built
    broken = json.loads(json.dumps(manifest))
    mutate(broken)
    errors = validate_manifest(broken, out)
    assert any(message in e for e in errors), errors
