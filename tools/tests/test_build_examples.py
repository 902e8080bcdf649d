"""Tests for ``kpack_tools.build`` (spec-driven builder) and the example pack.

The example kernels are compiled from source (no GPU: no tuning), the pack is
checked against the format rules and the cubins, and the committed
``kernels/examplepack`` is checked to be what its sources and recorded configs
compile to, byte for byte.  Run with ``PYTHONPATH=tools python3 -m pytest
tools/tests``.
"""

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kpack_tools import build as builder
from kpack_tools.cubin import parse_cubin
from kpack_tools.spec import Bucket, Config, SpecError, Specialization, check_spec, load_specs
from pack_validator import choose_variant, cuobjdump_slots, validate_manifest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "kernels" / "examples"
SPEC_FILES = [EXAMPLES / f"{name}.py" for name in ("vector_add", "softmax", "layer_norm",
                                                    "matmul", "layer_norm_train", "matmul_tma",
                                                    "attention_tma")]
COMMITTED_PACK = REPO / "kernels" / "examplepack"
KERNELS = ("vector_add", "softmax", "layer_norm", "matmul_fp16", "matmul_bf16",
           "layer_norm_fwd", "layer_norm_bwd", "matmul_tma", "attention_fwd",
           "attention_fwd_causal")


@pytest.fixture(scope="module")
def specs():
    return {spec.name: spec for path in SPEC_FILES for spec in load_specs(path)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The example pack built from source without tuning: (dir, manifest, tuning)."""
    out = tmp_path_factory.mktemp("build") / "examplepack"
    manifest, tuning = builder.build(SPEC_FILES, out, tune=False, log=None)
    return out, manifest, tuning


def kernel_of(manifest, name):
    return next(k for k in manifest["kernels"] if k["name"] == name)


def test_built_pack_is_valid_and_layouts_match_the_cubins(built):
    out, manifest, _ = built
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest
    assert validate_manifest(manifest, out) == []
    assert [k["name"] for k in manifest["kernels"]] == list(KERNELS)
    for kernel in manifest["kernels"]:
        for variant in kernel["variants"]:
            cubin = (out / variant["cubin"]).read_bytes()
            assert hashlib.sha256(cubin).hexdigest() == variant["sha256"]
            # ptxas's own view of the parameters, through NVIDIA's cuobjdump.
            slots = cuobjdump_slots(out / variant["cubin"], variant["entry"])
            assert [(s["offset"], s["size"]) for s in variant["layout"]] == \
                [(offset, size) for _, offset, size in slots], (kernel["name"], variant["name"])


def test_no_tune_records_defaults_and_says_so(built, specs):
    out, manifest, tuning = built
    assert json.loads((out / "tuning.json").read_text()) == tuning
    assert tuning["tuned"] is False
    assert tuning["reason"].startswith("not tuned: --no-tune was given")
    for entry in tuning["kernels"]:
        spec = specs[entry["name"]]
        assert entry["tuned"] is False and entry["device"] is None
        for number, bucket in enumerate(entry["buckets"]):
            assert bucket["times_us"] is None and bucket["checked_against"] is None
            assert bucket["chosen"] == spec.default_config(number).name
            config = spec.config(bucket["chosen"])
            for variant in kernel_of(manifest, entry["name"])["variants"]:
                if variant.get("bucket", []) == bucket["bucket"]:
                    assert variant["num_warps"] == config.num_warps
                    assert variant["num_stages"] == config.num_stages
                    assert variant["constexprs"] == dict(spec.constexprs(config))


def test_tuning_without_a_gpu_does_not_pretend(tmp_path):
    pytest.importorskip("triton")
    try:
        import torch  # noqa: F401
        if torch.cuda.is_available():
            pytest.skip("a GPU is present: this test covers the no-GPU path")
    except ImportError:
        pass
    _, tuning = builder.build([EXAMPLES / "vector_add.py"], tmp_path / "p", tune=True, log=None)
    assert tuning["tuned"] is False and tuning["device"] is None
    assert "not tuned:" in tuning["reason"]
    assert tuning["kernels"][0]["buckets"][0]["times_us"] is None


def test_matmul_buckets_specializations_and_grid(built):
    _, manifest, _ = built
    for name in ("matmul_fp16", "matmul_bf16"):
        kernel = kernel_of(manifest, name)
        assert kernel["buckets"] == [{"param": "M", "edges": [16, 64, 256]}]
        assert kernel["grid"] == ["cdiv(M, BLOCK_M)", "cdiv(N, BLOCK_N)"]
        dtype = name.split("_")[1]
        assert [p["type"] for p in kernel["params"][:3]] == [f"*{dtype}"] * 3
        names = [v["name"] for v in kernel["variants"]]
        assert names == [f"b{b}_{s}" for b in range(4) for s in ("generic", "contig")]
        for variant in kernel["variants"]:
            slots = [s["param"] for s in variant["layout"]]
            if variant["name"].endswith("contig"):
                assert variant["assumptions"]["stride_ak"] == ["eq1"]
                assert variant["assumptions"]["K"] == ["div16"]
                assert "stride_ak" not in slots and "stride_bn" not in slots \
                    and "stride_cn" not in slots
            else:
                assert "assumptions" not in variant
                assert len(slots) == 12 + 2
        # The runtime's choice (reference chooser) per M bucket and alignment.
        base = {"a_ptr": 0x1000, "b_ptr": 0x2000, "c_ptr": 0x3000, "N": 256, "K": 128,
                "stride_am": 128, "stride_ak": 1, "stride_bk": 256, "stride_bn": 1,
                "stride_cm": 256, "stride_cn": 1}
        for m, bucket in ((1, 0), (16, 0), (17, 1), (64, 1), (65, 2), (256, 2), (257, 3)):
            assert choose_variant(kernel, {**base, "M": m})["name"] == f"b{bucket}_contig"
            assert choose_variant(kernel, {**base, "M": m, "K": 100})["name"] == \
                f"b{bucket}_generic"


def test_layer_norm_backward_depends_on_more_than_12_properties(built):
    """A backward norm kernel written like public ones: Triton's JIT specializes its 8
    pointers, 4 row strides and N, which the old 12-property dispatch table refused."""
    _, manifest, _ = built
    kernel = kernel_of(manifest, "layer_norm_bwd")
    contig = [v for v in kernel["variants"] if v["name"].endswith("_contig")]
    assert len(contig) == 3 and all(len(v["assumptions"]) == 13 for v in contig)
    assert kernel["grid"] == ["cdiv(M, BLOCK_M)"]
    assert all(v["constexprs"]["BLOCK_M"] == 16 for v in kernel["variants"])
    base = {"X": 0x1000, "W": 0x2000, "DY": 0x3000, "DX": 0x4000, "DW": 0x5000, "DB": 0x6000,
            "Mean": 0x7000, "Rstd": 0x8000, "stride_x_row": 4096, "stride_dy_row": 4096,
            "stride_dx_row": 4096, "stride_dw_row": 4096, "M": 100, "N": 4096}
    assert choose_variant(kernel, base)["name"] == "b1_contig"
    assert choose_variant(kernel, {**base, "Rstd": 0x8004})["name"] == "b1_generic"
    assert choose_variant(kernel, {**base, "N": 8000})["name"] == "b2_contig"
    assert [p["name"] for p in kernel["params"] if p.get("readonly")] == \
        ["X", "W", "DY", "Mean", "Rstd"]


def test_row_count_grid_is_left_to_the_caller(built, specs):
    """layer_norm_fwd's grid is n_rows = X.shape[0], a launch value: not in the manifest."""
    _, manifest, _ = built
    assert "grid" not in kernel_of(manifest, "layer_norm_fwd")
    assert manifest["format"] == "kpack/2"
    for kernel in manifest["kernels"]:
        module, function = kernel["source"]["qualname"].rsplit(".", 1)
        assert function == specs[kernel["name"]].fn.fn.__name__
        assert module in [f.stem for f in SPEC_FILES]


def test_tma_kernels_expand_their_descriptors(built):
    """The persistent matmul's descriptors: Triton's TMA expansion in the layout, the
    metadata in tensordesc_meta (the driver's data type), and per bucket the config's block
    shape, the kernel's type in bucket 0 and a `types` override in bucket 1."""
    _, manifest, _ = built
    kernel = kernel_of(manifest, "matmul_tma")
    assert [p["type"] for p in kernel["params"][:3]] == [
        "tensordesc<fp16[64, 64]>", "tensordesc<fp16[64, 128]>", "tensordesc<fp16[64, 128]>"]
    assert kernel["grid"] == ["min(NUM_SMS, cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N))"]
    for variant in kernel["variants"]:
        parts = [(s["param"], s.get("part"), s["size"]) for s in variant["layout"][:5]]
        assert parts == [("a_desc", "tma", 128), ("a_desc", "shape[0]", 4),
                         ("a_desc", "shape[1]", 4), ("a_desc", "strides[0]", 8),
                         ("a_desc", "strides[1]", 8)]
        meta = variant["tensordesc_meta"]
        assert [m["data_type"] for m in meta] == [6] * 3  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16
        assert all(m["swizzle"] == 3 and m["elem_size"] == 2 for m in meta)
        if variant["bucket"] == [0]:
            assert "types" not in variant
            assert meta[0]["block_size"] == [64, 64]
        else:
            assert variant["types"] == {"a_desc": "tensordesc<fp16[128, 64]>",
                                        "c_desc": "tensordesc<fp16[128, 128]>"}
            assert meta[0]["block_size"] == [128, 64]
    base = {"M": 64, "N": 512, "K": 512, "NUM_SMS": 132}
    assert choose_variant(kernel, base)["name"] == "b0_aligned"
    assert choose_variant(kernel, {**base, "M": 1000})["name"] == "b1_generic"
    attention = kernel_of(manifest, "attention_fwd_causal")
    assert attention["params"][4]["type"] == "tensordesc<fp16[1, 1, 128, 64]>"
    assert attention["variants"][0]["tensordesc_meta"][0]["block_size"] == [1, 1, 128, 64]
    assert attention["variants"][0]["entry"] == "attention_fwd_causal"


def test_layer_norm_eps_is_a_4_byte_fp32_slot(built):
    _, manifest, _ = built
    kernel = kernel_of(manifest, "layer_norm")
    assert dict((p["name"], p["type"]) for p in kernel["params"])["eps"] == "fp32"
    for variant in kernel["variants"]:
        eps = next(s for s in variant["layout"] if s["param"] == "eps")
        assert eps["size"] == 4 and eps["offset"] % 4 == 0


def _committed():
    return json.loads((COMMITTED_PACK / "manifest.json").read_text())


def test_committed_pack_matches_its_sources(specs):
    """Each committed variant is what its recorded config and specialization
    compile to now (byte-identical cubin), and tuning.json agrees."""
    manifest = _committed()
    assert validate_manifest(manifest, COMMITTED_PACK) == []
    tuning = json.loads((COMMITTED_PACK / "tuning.json").read_text())
    assert tuning["format"] == builder.TUNING_FORMAT
    chosen = {(k["name"], tuple(b["bucket"])): b["chosen"]
              for k in tuning["kernels"] for b in k["buckets"]}
    assert sorted(k["name"] for k in manifest["kernels"]) == sorted(KERNELS)
    for kernel in manifest["kernels"]:
        spec = specs[kernel["name"]]
        first = spec.config(chosen[(kernel["name"], tuple(kernel["variants"][0].get("bucket",
                                                                                     [])))])
        assert [(p["name"], p["type"]) for p in kernel["params"]] == \
            [tuple(p) for p in spec.params_for(first)]
        specials = {s.name: s for s in spec.all_specializations()}
        for variant in kernel["variants"]:
            config = spec.config(chosen[(kernel["name"], tuple(variant.get("bucket", [])))])
            types = {p["name"]: p["type"] for p in kernel["params"]}
            types.update(variant.get("types", {}))
            assert [(name, types[name]) for name, _ in spec.params] == spec.params_for(config)
            assert variant["constexprs"] == dict(spec.constexprs(config))
            assert (variant["num_warps"], variant["num_stages"], variant["num_ctas"]) == \
                (config.num_warps, config.num_stages, config.num_ctas)
            special = specials[variant["name"].split("_", 1)[1] if spec.buckets
                               else variant["name"]]
            compiled = builder.compile_variant(spec, config, special)
            cubin = (COMMITTED_PACK / variant["cubin"]).read_bytes()
            assert compiled.asm["cubin"] == cubin, (kernel["name"], variant["name"])
            assert parse_cubin(cubin).layouts[variant["entry"]]


# ---------------------------------------------------------------------------
# Failure paths
# ---------------------------------------------------------------------------

def _bad(spec, **changes):
    with pytest.raises(SpecError) as err:
        check_spec(dataclasses.replace(spec, **changes), "bad.py")
    return str(err.value)


def test_bad_specs_are_refused_with_clear_errors(specs):
    add = specs["vector_add"]
    softmax = specs["softmax"]
    msg = _bad(add, configs=[Config("c", {"BLOCK": 64, "BLOCKK": 2})])
    assert "bad.py: kernel 'vector_add': config 'c': unknown parameter 'BLOCKK'" in msg
    msg = _bad(add, configs=[Config("c", {})], default="c")
    assert "config 'c': missing constexpr(s) ['BLOCK']" in msg
    msg = _bad(add, buckets=[Bucket("x_ptr", [10])], representatives=[{"x_ptr": 1}] * 2)
    assert "parameter 'x_ptr' is *fp32; a bucket parameter must be an integer" in msg
    msg = _bad(softmax, representatives=[{"n_rows": 1, "n_cols": 5000}] * 3)
    assert "representatives[0] {'n_rows': 1, 'n_cols': 5000} is in bucket [1], not in " \
        "bucket [0] (n_cols <= 1024)" in msg
    msg = _bad(softmax, representatives=[{"n_rows": 1}] * 3)
    assert "bucket parameter 'n_cols' needs an integer value, got None" in msg
    msg = _bad(add, params=[("x_ptr", "*fp32"), ("y", "*fp32"), ("out_ptr", "*fp32"),
                            ("n", "i32"), ("BLOCK", "constexpr")])
    assert "do not match vector_add_kernel's parameters" in msg
    msg = _bad(add, specializations=[Specialization("s", eq1=["x_ptr"])])
    assert "eq1 on 'x_ptr' of type *fp32: needs an integer" in msg
    msg = _bad(add, specializations=[Specialization("s", div16=["nope"])])
    assert "div16: 'nope' is not a call parameter" in msg
    msg = _bad(add, default="nope")
    assert "no config named 'nope'" in msg
    msg = _bad(add, grid=["cdiv(n, BLOCKS)"])
    assert "unknown name 'BLOCKS'" in msg
    mm = specs["matmul_tma"]
    msg = _bad(mm, params=[("a_desc", "tensordesc<fp16[BLOCK_Q, BLOCK_K]>")] + list(mm.params[1:]))
    assert "parameter 'a_desc': 'tensordesc<fp16[BLOCK_Q, BLOCK_K]>': block dimension " \
        "'BLOCK_Q' is not an integer constexpr of the config (got None)" in msg
    msg = _bad(mm, params=[("a_desc", "tensordesc<fp16[BLOCK_M]x>")] + list(mm.params[1:]))
    assert "is not a tensordesc<DTYPE[B0, ...]> type" in msg
    msg = _bad(mm, params=[("a_desc", ("*fp16", "*fp16"))] + list(mm.params[1:]))
    assert "tuple parameters are not supported by build specs" in msg
    msg = _bad(mm, readonly=["a_desc"])
    assert "readonly: 'a_desc' is not a pointer parameter" in msg


def test_unknown_triton_version_is_refused(monkeypatch, tmp_path):
    with pytest.raises(builder.BuildError) as err:
        builder.check_triton_version("3.5.1")
    assert "Triton 3.5.1 is installed, but kpack_tools.build supports only Triton 3.6.0" \
        in str(err.value)
    import triton
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    with pytest.raises(builder.BuildError, match="Triton 3.7.0 is installed"):
        builder.build([EXAMPLES / "vector_add.py"], tmp_path / "p", tune=False, log=None)
    assert not (tmp_path / "p").exists()


def test_command_line_reports_a_bad_spec_file(tmp_path):
    spec = tmp_path / "bad_spec.py"
    spec.write_text((EXAMPLES / "vector_add.py").read_text().replace(
        'representatives=[{"n": 1 << 22}]', 'representatives=[]'))
    result = subprocess.run(
        [sys.executable, "-m", "kpack_tools.build", str(spec), "--out", str(tmp_path / "p"),
         "--no-tune"], capture_output=True, text=True,
        env={"PYTHONPATH": str(REPO / "tools"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 1, result.stderr
    assert "kernel 'vector_add': 0 representative shapes for 1 bucket(s)" in result.stderr
    assert not (tmp_path / "p").exists()
    missing = subprocess.run(
        [sys.executable, "-m", "kpack_tools.build", str(tmp_path / "none.py"), "--out",
         str(tmp_path / "p")], capture_output=True, text=True,
        env={"PYTHONPATH": str(REPO / "tools"), "PATH": "/usr/bin:/bin"})
    assert missing.returncode == 1 and "no such spec file" in missing.stderr
