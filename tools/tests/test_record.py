"""Tests for record mode (``kpack_tools.record``), on the CPU.

Triton's JIT needs a GPU driver only to query the device and to launch, so the
JIT path is driven here through a stand-in driver (``triton.runtime.driver.
set_active``) that reports an sm_90 device and whose launcher does nothing:
``kernel[grid](...)`` specializes the arguments, compiles real sm_90a cubins
and calls the hooks exactly as on a GPU; only the launch itself is a no-op.
The command line is run as a subprocess on tiny programs.

Run with ``PYTHONPATH=tools python3 -m pytest tools/tests``; no GPU needed.
"""

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

from kpack_tools import record
from kpack_tools.cubin import parse_cubin
from pack_validator import choose_variant, validate_manifest

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"


class FakeTensor:
    """What Triton's JIT reads from a tensor argument: an address and a dtype."""

    def __init__(self, ptr: int, dtype=tl.float32, shape=(1024,)):
        self.ptr, self.dtype, self.shape = ptr, dtype, shape

    def data_ptr(self) -> int:
        return self.ptr


class FakeDriver:
    """An sm_90 device that compiles for real and launches nothing."""

    class utils:
        @staticmethod
        def get_device_properties(device):
            return {"max_shared_mem": 232448}

        @staticmethod
        def load_binary(name, kernel, shared, device):
            return None, name, 32, 0, 1024

    class launcher_cls:
        launches = []

        def __init__(self, src, metadata):
            self.name = metadata.name

        def __call__(self, *args):
            FakeDriver.launcher_cls.launches.append(self.name)

    def __init__(self):
        self.timings = {}

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0

    def get_active_torch_device(self):
        return None

    def get_benchmarker(self):
        def bench(kernel_call, quantiles):
            kernel_call()
            # The autotuner below sees BLOCK=64 as slower than BLOCK=128.
            timing = self.timings.pop(0)
            return [timing] * len(quantiles)
        return bench


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, n, stride_x, alpha, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    result = tl.load(x_ptr + i * stride_x, mask=i < n) * alpha + tl.load(y_ptr + i, mask=i < n)
    tl.store(out_ptr + i, result, mask=i < n)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def _other_scale_kernel():
    """A different function that is also called ``scale_kernel``."""
    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 3, mask=offs < n)
    return scale_kernel


OTHER_SCALE = _other_scale_kernel()


def _zero_out(nargs):
    pass


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2),
                          triton.Config({"BLOCK": 128}, num_warps=4, pre_hook=_zero_out)],
                 key=["n"])
@triton.jit
def tuned_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


@triton.jit
def tma_kernel(desc, out_ptr, BLOCK: tl.constexpr):
    tile = desc.load([0, 0])
    offs = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    tl.store(out_ptr + offs, tile)


@triton.jit
def pair_kernel(ptrs, n, coefs, BLOCK: tl.constexpr):
    x_ptr, y_ptr = ptrs
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = coefs[0] * tl.load(x_ptr + offs, mask=mask) + coefs[1] * tl.load(y_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, y, mask=mask)


@pytest.fixture(scope="module")
def fake_driver():
    fake = FakeDriver()
    previous = driver._active  # None here: reset_active() would look for a real GPU
    driver.set_active(fake)
    yield fake
    driver.set_active(previous)


A, B, C = FakeTensor(1 << 20), FakeTensor(2 << 20), FakeTensor(3 << 20)
MISALIGNED = FakeTensor((4 << 20) + 4)


@pytest.fixture(scope="module")
def recorded(fake_driver, tmp_path_factory):
    """One recording of a program with several kernels and specializations,
    exported to a pack: (recording, report, pack dir)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    FakeDriver.launcher_cls.launches.clear()
    fake_driver.timings = [2.0, 1.0]
    with record.Recorder(log=None) as recorder:
        grid = (4,)
        axpy_kernel[grid](A, B, C, 4096, 1, 2.0, BLOCK=1024)          # div16 x4, eq1 stride
        axpy_kernel[grid](A, B, C, 4096, 1, 3.0, BLOCK=1024)          # same variant again
        axpy_kernel[grid](A, B, C, 1000, 3, 2.0, BLOCK=1024)          # div16 pointers only
        axpy_kernel[grid](MISALIGNED, B, C, 1000, 3, 2.0, BLOCK=1024)  # x not div16
        axpy_kernel[grid](A, B, C, 2**31 + 16, 2, 2.0, BLOCK=1024)    # n: i64, div16
        scale_kernel[grid](A, C, 1000, BLOCK=128)                     # two configs of
        scale_kernel[grid](A, C, 1000, BLOCK=256)                     # one function
        OTHER_SCALE[grid](A, C, 1000, BLOCK=128)                      # name collision
        tuned_kernel[lambda meta: (triton.cdiv(500, meta["BLOCK"]),)](A, C, 500)
        desc = TensorDescriptor(A, [64, 64], [64, 1], [16, 16])
        tma_kernel[(1,)](desc, C, BLOCK=16)
        pair_kernel[grid]((A, B), 4096, (2.0, 0.5), BLOCK=1024)       # tuples, div16
        pair_kernel[grid]((MISALIGNED, B), 1000, (2.0, 0.5), BLOCK=1024)
    out = tmp_path_factory.mktemp("record") / "pack"
    report = record.export(recorder.recording, out, log=None)
    return recorder.recording, report, out


def _kernel(manifest, name):
    matches = [k for k in manifest["kernels"] if k["name"] == name]
    assert matches, f"no kernel {name} in {[k['name'] for k in manifest['kernels']]}"
    return matches[0]


def test_every_launch_reached_the_launcher(recorded):
    # 5 axpy + 3 scale + 2 autotune benchmarks + 1 tuned + 1 tma + 2 pair.
    assert len(FakeDriver.launcher_cls.launches) == 14


def test_manifest_is_valid(recorded):
    _, report, out = recorded
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest == report.manifest
    validate_manifest(manifest, out)


def test_specializations_become_variants_of_one_kernel(recorded):
    _, report, _ = recorded
    axpy = _kernel(report.manifest, "axpy_kernel")
    assert [p["type"] for p in axpy["params"]] == \
        ["*fp32", "*fp32", "*fp32", "i32", "i32", "fp32", "constexpr"]
    got = {v["name"]: (v.get("assumptions"), v.get("types")) for v in axpy["variants"]}
    d16 = ["div16"]
    assert got == {
        "x_ptr.d16-y_ptr.d16-out_ptr.d16-n.d16-stride_x.eq1":
            ({"x_ptr": d16, "y_ptr": d16, "out_ptr": d16, "n": d16, "stride_x": ["eq1"]}, None),
        "x_ptr.d16-y_ptr.d16-out_ptr.d16":
            ({"x_ptr": d16, "y_ptr": d16, "out_ptr": d16}, None),
        "y_ptr.d16-out_ptr.d16": ({"y_ptr": d16, "out_ptr": d16}, None),
        "x_ptr.d16-y_ptr.d16-out_ptr.d16-n.d16-n.i64":
            ({"x_ptr": d16, "y_ptr": d16, "out_ptr": d16, "n": d16}, {"n": "i64"}),
        # Compiled by the recorder: the JIT's builds for arguments without alignment or 1s.
        "generic": (None, None),
        "n.i64": (None, {"n": "i64"}),
    }
    for variant in axpy["variants"]:
        assert variant["constexprs"] == {"BLOCK": 1024}
        layout = {s["param"]: s["size"] for s in variant["layout"]}
        if "stride_x" in (variant.get("assumptions") or {}):
            assert "stride_x" not in layout      # eq1: compiled away
        else:
            assert layout["stride_x"] == 4
        assert layout["n"] == (8 if variant.get("types") else 4)


def test_runtime_choice_matches_what_the_jit_compiled(recorded):
    """For every recorded launch, the runtime's rule picks the variant the
    JIT compiled for it (pack_validator re-implements the rule)."""
    _, report, out = recorded
    manifest = report.manifest
    checked = 0
    for launch in report.record["launches"]:
        kernel = _kernel(manifest, launch["kernel"])
        values = {}
        for param in kernel["params"]:
            if param["type"] == "constexpr":
                continue
            arg = launch["args"][param["name"]]
            arg = arg.get("tensordesc", arg)  # a descriptor dispatches on nothing
            values[param["name"]] = arg["ptr"] if "ptr" in arg else arg["value"]
        chosen = choose_variant(kernel, values)
        assert chosen is not None and chosen["name"] == launch["variant"], launch
        checked += 1
    assert checked == 12  # 5 axpy, 3 scale, 1 tuned, 1 tma, 2 pair


def test_launches_recorded_with_grid_and_arguments(recorded):
    _, report, _ = recorded
    launches = report.record["launches"]
    first = launches[0]
    assert first["kernel"] == "axpy_kernel" and first["grid"] == [4, 1, 1]
    assert first["args"]["n"] == {"value": 4096}
    assert first["args"]["alpha"] == {"value": 2.0}
    assert first["args"]["x_ptr"]["ptr"] == A.ptr and first["args"]["x_ptr"]["align16"]
    assert launches[1]["args"]["alpha"] == {"value": 3.0}
    tuned = [x for x in launches if x["kernel"] == "tuned_kernel"]
    assert len(tuned) == 1 and tuned[0]["grid"] == [4, 1, 1]   # cdiv(500, 128)
    per_variant = {(k["kernel"], k["variant"]): k["launches"] for k in report.record["kernels"]}
    assert per_variant[("axpy_kernel",
                        "x_ptr.d16-y_ptr.d16-out_ptr.d16-n.d16-stride_x.eq1")] == 2


def test_configurations_become_separate_kernels(recorded):
    _, report, _ = recorded
    names = [k["name"] for k in report.manifest["kernels"]]
    # Named after the module too: another function is also called scale_kernel.
    cfgs = [n for n in names if n.startswith("test_record.scale_kernel__cfg")]
    assert len(cfgs) == 2
    blocks = sorted(_kernel(report.manifest, n)["variants"][0]["constexprs"]["BLOCK"]
                    for n in cfgs)
    assert blocks == [128, 256]
    assert any("'test_record.scale_kernel': 2 configurations compiled" in line
               for line in report.lines)


def test_name_collision_disambiguated_and_reported(recorded):
    _, report, _ = recorded
    names = [k["name"] for k in report.manifest["kernels"]]
    other = [n for n in names if "_other_scale_kernel" in n]
    assert other == ["test_record._other_scale_kernel._locals_.scale_kernel"]
    assert "scale_kernel" not in names  # neither keeps the ambiguous short name
    assert any(line.startswith("name collision: 2 different functions are called "
                               "'scale_kernel'") for line in report.lines)


def test_autotuning_candidates_not_exported_and_pre_hook_warned(recorded):
    _, report, _ = recorded
    tuned = _kernel(report.manifest, "tuned_kernel")
    # The chosen config's specialized build and its generic build.
    assert [(v["constexprs"]["BLOCK"], v["num_warps"]) for v in tuned["variants"]] == \
        [(128, 4), (128, 4)]
    assert [v.get("assumptions") is None for v in tuned["variants"]] == [False, True]
    assert tuned["autotune_key"] == ["n"]  # one config chosen: no buckets needed
    assert "buckets" not in tuned
    assert any("autotuning candidate" in line and "'BLOCK': 64" in line
               for line in report.lines)
    assert any(line.startswith("WARNING: kernel 'tuned_kernel'") and "pre-hooks" in line
               for line in report.lines)
    reasons = [x["reason"] for x in report.record["not_exported"]]
    assert "autotuning candidate, not chosen" in reasons


def test_tma_descriptor_kernel_exported(recorded):
    """The issue's case: a kernel taking a host TensorDescriptor was refused; now it is a
    kernel with a tensordesc parameter, its TMA expansion and metadata."""
    _, report, out = recorded
    kernel = _kernel(report.manifest, "tma_kernel")
    assert kernel["params"][0] == {"name": "desc", "type": "tensordesc<fp32[16, 16]>"}
    assert not [line for line in report.lines if line.startswith("REFUSED")]
    for variant in kernel["variants"]:
        assert variant["tensordesc_meta"][0]["data_type"] == 7  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
        assert [s.get("part") for s in variant["layout"][:5]] == \
            ["tma", "shape[0]", "shape[1]", "strides[0]", "strides[1]"]
    launch = next(x for x in report.record["launches"] if x["kernel"] == "tma_kernel")
    assert launch["args"]["desc"]["tensordesc"] == {
        "ptr": A.ptr, "align16": True, "dtype": str(A.dtype), "shape": [64, 64],
        "strides": [64, 1], "block_shape": [16, 16], "padding": "zero"}
    assert validate_manifest(report.manifest, out) == []


def test_tuple_parameters_exported_flattened(recorded):
    _, report, _ = recorded
    kernel = _kernel(report.manifest, "pair_kernel")
    assert [(p["name"], p["type"]) for p in kernel["params"]] == [
        ("ptrs.0", "*fp32"), ("ptrs.1", "*fp32"), ("n", "i32"), ("coefs.0", "fp32"),
        ("coefs.1", "fp32"), ("BLOCK", "constexpr")]
    names = sorted(v["name"] for v in kernel["variants"])
    assert names == ["generic", "ptrs.0.d16-ptrs.1.d16-n.d16", "ptrs.1.d16"], names
    launch = next(x for x in report.record["launches"] if x["kernel"] == "pair_kernel")
    assert launch["args"]["ptrs.1"]["ptr"] == B.ptr and launch["args"]["coefs.0"]["value"] == 2.0


def test_every_kernel_and_config_gets_its_generic_build(recorded):
    """The program only ever passed aligned pointers to axpy; the recorder compiled the
    generic build (no div16, no eq1) as the JIT would for other arguments, so any call
    the JIT would run launches, and the runtime's choice is still the JIT's."""
    recording, report, out = recorded
    assert not any("no generic variant" in line for line in report.lines)
    for kernel in report.manifest["kernels"]:
        assert any("assumptions" not in v for v in kernel["variants"]), kernel["name"]
    axpy = _kernel(report.manifest, "axpy_kernel")
    generic = next(v for v in axpy["variants"] if v["name"] == "generic")
    assert [s["param"] for s in generic["layout"]][:6] == \
        ["x_ptr", "y_ptr", "out_ptr", "n", "stride_x", "alpha"]  # stride_x has a slot
    entry = next(k for k in report.record["kernels"]
                 if (k["kernel"], k["variant"]) == ("axpy_kernel", "generic"))
    assert entry["generated"] == "generic build compiled by the recorder"
    assert entry["launches"] == 0
    source = recording.compiles[entry["hash"]]
    assert source.generated_from in recording.compiles and source.div16 == []
    assert any("kernel 'axpy_kernel' variant 'generic'" in line and "compiled by the recorder"
               in line for line in report.lines)
    # Misaligned x and y now launch the generic build.
    values = {"x_ptr": MISALIGNED.ptr, "y_ptr": B.ptr + 8, "out_ptr": C.ptr, "n": 1000,
              "stride_x": 2, "alpha": 2.0}
    assert choose_variant(axpy, values)["name"] == "generic"
    assert choose_variant(axpy, {**values, "n": 2**31 + 1})["name"] == "n.i64"


def test_kernels_carry_their_source(recorded):
    recording, report, _ = recorded
    import hashlib
    axpy = _kernel(report.manifest, "axpy_kernel")
    assert report.manifest["format"] == "kpack/2"
    assert axpy["source"] == {"qualname": "test_record.axpy_kernel",
                              "sha256": hashlib.sha256(axpy_kernel.src.encode()).hexdigest()}
    assert all("readonly" not in p for k in report.manifest["kernels"] for p in k["params"])


def test_record_json_in_pack_matches_cubins(recorded):
    _, report, out = recorded
    on_disk = json.loads((out / record.RECORD_FILE).read_text())
    assert on_disk == json.loads(json.dumps(report.record))
    assert on_disk["format"] == record.RECORD_FORMAT
    for kernel in report.manifest["kernels"]:
        for variant in kernel["variants"]:
            cubin = parse_cubin((out / variant["cubin"]).read_bytes())
            assert variant["entry"] in cubin.layouts


def test_grid_tolerance_is_asserted_for_the_named_functions_only(recorded, tmp_path):
    recording, report, _ = recorded
    assert report.record["grid_tolerant"] == []
    assert all("grid_tolerance" not in k for k in report.manifest["kernels"])
    lines = []
    report = record.export(recording, tmp_path / "tolerant", log=lines.append,
                           grid_tolerant=["axpy_kernel", "test_record.tuned_kernel"])
    marked = {k["name"]: k.get("grid_tolerance") for k in report.manifest["kernels"]}
    assert marked["axpy_kernel"] == {"proof": "asserted"}
    assert marked["tuned_kernel"] == {"proof": "asserted"}
    assert all(v is None for k, v in marked.items() if k not in ("axpy_kernel", "tuned_kernel"))
    assert report.record["grid_tolerant"] == ["axpy_kernel", "tuned_kernel"]
    assert any("grid tolerance asserted for kernel 'axpy_kernel' (unproven" in line
               for line in lines)
    validate_manifest(report.manifest, tmp_path / "tolerant")
    with pytest.raises(ValueError, match="--grid-tolerant 'nope' matches no exported kernel"):
        record.export(recording, tmp_path / "bad", log=None, grid_tolerant=["nope"])


def test_version_refused_clearly(monkeypatch):
    with pytest.raises(record.UnsupportedTritonVersion,
                       match=r"found Triton 3\.5\.1, supported: 3\.6\.0"):
        record.check_triton_version("3.5.1")
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    with pytest.raises(record.UnsupportedTritonVersion, match="found Triton 3.7.0"):
        record.Recorder(log=None).start()


def test_export_refuses_existing_directory(recorded, tmp_path):
    recording, _, _ = recorded
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="exists and is not empty"):
        record.export(recording, tmp_path, log=None)


# ---------------------------------------------------------------------------
# Autotuned functions dispatch like the program did
# ---------------------------------------------------------------------------

@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2),
                          triton.Config({"BLOCK": 256}, num_warps=4)],
                 key=["n", "m"])
@triton.jit
def tuned2d_kernel(x_ptr, out_ptr, n, m, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs * m, mask=offs < n)
    tl.store(out_ptr + offs, x * 2, mask=offs < n)


# (n, m) key values in the order the program uses them, and the config the stand-in
# benchmarker makes the autotuner choose for each (a repeated key is not re-tuned).
TUNED_CALLS = [((100, 4), 64), ((5000, 4), 256), ((100, 64), 256), ((100, 4), 64)]


@pytest.fixture(scope="module")
def autotuned(fake_driver, tmp_path_factory):
    fake_driver.timings = []
    for (n, m), block in TUNED_CALLS[:3]:
        fake_driver.timings += [1.0, 2.0] if block == 64 else [2.0, 1.0]
    with record.Recorder(log=None) as recorder:
        for (n, m), _ in TUNED_CALLS:
            tuned2d_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](A, C, n, m)
    out = tmp_path_factory.mktemp("autotuned") / "pack"
    return record.export(recorder.recording, out, log=None), out


def _values(kernel, launch):
    return {p["name"]: (launch["args"][p["name"]].get("ptr", launch["args"][p["name"]].get("value")))
            for p in kernel["params"] if p["type"] != "constexpr"}


def test_autotuned_function_is_one_kernel_bucketed_on_its_key(autotuned):
    report, out = autotuned
    names = [k["name"] for k in report.manifest["kernels"]]
    assert names == ["tuned2d_kernel"], names  # no __cfg split
    kernel = report.manifest["kernels"][0]
    assert kernel["autotune_key"] == ["n", "m"]
    # Per key parameter: below, each recorded value, the two halves between, above.
    assert kernel["buckets"] == [{"param": "n", "edges": [99, 100, 2550, 4999, 5000]},
                                 {"param": "m", "edges": [3, 4, 34, 63, 64]}]
    assert validate_manifest(report.manifest, out) == []  # every bucket has a variant
    assert {v["constexprs"]["BLOCK"] for v in kernel["variants"]} == {64, 256}
    assert any("autotuned over key ['n', 'm']; 2 configurations chosen for 3 recorded key "
               "values" in line for line in report.lines)


def test_recorded_keys_select_the_autotuners_choice(autotuned):
    report, _ = autotuned
    kernel = report.manifest["kernels"][0]
    launches = report.record["launches"]
    assert len(launches) == len(TUNED_CALLS)
    for launch, ((n, m), block) in zip(launches, TUNED_CALLS):
        assert launch["autotune_key"] == {"n": n, "m": m}
        chosen = choose_variant(kernel, _values(kernel, launch))
        assert chosen["name"] == launch["variant"], launch
        assert "_key" in chosen["name"]  # an exact bucket: a key the program used
        assert chosen["constexprs"]["BLOCK"] == block, (n, m)
        assert chosen["num_warps"] == (2 if block == 64 else 4)
    keys = report.record["autotuned"][0]["recorded_keys"]
    assert [(k["values"], k["constexprs"]["BLOCK"], k["options"]["num_warps"]) for k in keys] \
        == [({"n": 100, "m": 4}, 64, 2), ({"n": 5000, "m": 4}, 256, 4),
            ({"n": 100, "m": 64}, 256, 4)]


@pytest.mark.parametrize("n, m, block, key", [
    (3000, 4, 256, 1),   # n nearer 5000
    (2550, 4, 64, 0),    # n exactly between 100 and 5000: the smaller
    (2551, 4, 256, 1),
    (1, 1, 64, 0),       # below every recorded value
    (10**6, 4, 256, 1),  # above
    (100, 30, 64, 0),    # m nearer 4
    (100, 40, 256, 2),   # m nearer 64
    (5000, 64, 256, 1),  # both values recorded, the pair not: nearest key, first used
])
def test_unseen_keys_use_the_nearest_recorded_key(autotuned, n, m, block, key):
    report, _ = autotuned
    kernel = report.manifest["kernels"][0]
    values = {"x_ptr": A.ptr, "out_ptr": C.ptr, "n": n, "m": m}
    chosen = choose_variant(kernel, values)
    assert f"_near{key}_" in chosen["name"], chosen["name"]
    assert chosen["constexprs"]["BLOCK"] == block
    bucket = next(b for b in report.record["autotuned"][0]["buckets"]
                  if b["bucket"] == chosen["bucket"])
    assert bucket == {**bucket, "key": f"key{key}", "exact": False}


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2),
                          triton.Config({"BLOCK": 256}, num_warps=4)],
                 key=["n", "n_elements"])  # a typo, as in a public tutorial: no such parameter
@triton.jit
def typo_key_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 3, mask=offs < n)


def test_an_autotune_key_naming_no_parameter_is_ignored_with_a_warning(fake_driver, tmp_path):
    """Triton's autotuner ignores a key name that is no parameter of the function; the
    recorder does the same, says so, and exports the kernel bucketed on the rest."""
    fake_driver.timings = [1.0, 2.0, 2.0, 1.0]  # n=100: BLOCK 64 wins; n=5000: BLOCK 256
    with record.Recorder(log=None) as recorder:
        for n in (100, 5000):
            typo_key_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](A, C, n)
    report = record.export(recorder.recording, tmp_path / "pack", log=None)
    assert [k["name"] for k in report.manifest["kernels"]] == ["typo_key_kernel"]
    kernel = report.manifest["kernels"][0]
    assert kernel["autotune_key"] == ["n"]
    assert kernel["buckets"] == [{"param": "n", "edges": [99, 100, 2550, 4999, 5000]}]
    assert {v["constexprs"]["BLOCK"] for v in kernel["variants"]} == {64, 256}
    warnings = [line for line in report.lines if line.startswith("WARNING")]
    assert warnings == ["WARNING: test_record.typo_key_kernel: triton.autotune key "
                        "'n_elements' names no parameter of the function; Triton's "
                        "autotuner ignores it, and so does kpack"], report.lines
    assert report.record["autotuned"][0]["key"] == ["n"]
    assert not report.record["not_exported"]
    assert validate_manifest(report.manifest, tmp_path / "pack") == []


@triton.jit
def maybe_scaled_kernel(x_ptr, out_ptr, n, scale_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if scale_ptr is not None:
        x = x * tl.load(scale_ptr)
    tl.store(out_ptr + offs, x, mask=offs < n)


def test_a_none_argument_is_a_constexpr_none_of_the_kernel(fake_driver, tmp_path):
    """What Triton compiles in for a None argument is part of the configuration: the pack
    kernel has that parameter as a constexpr whose value is null in every variant (the
    shape the drop-in serves such calls by: tests/python/test_dropin.py)."""
    with record.Recorder(log=None) as recorder:
        maybe_scaled_kernel[(4,)](A, C, 1000, None, BLOCK=128)
    report = record.export(recorder.recording, tmp_path / "pack", log=None)
    kernel = _kernel(report.manifest, "maybe_scaled_kernel")
    assert [(p["name"], p["type"]) for p in kernel["params"]] == [
        ("x_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"), ("scale_ptr", "constexpr"),
        ("BLOCK", "constexpr")]
    assert [v["constexprs"] for v in kernel["variants"]] == \
        [{"scale_ptr": None, "BLOCK": 128}] * len(kernel["variants"])
    assert report.record["launches"][0]["args"]["scale_ptr"] == {"value": None}


def _set_desc_blocks(nargs):
    # Triton's tutorials (09-persistent-matmul): the config's tile becomes the descriptors'
    # block shape before each launch.
    for name in ("in_desc", "out_desc"):
        nargs[name].block_shape = [nargs["BM"], 32]


@triton.autotune(configs=[triton.Config({"BM": 16}, num_warps=4, pre_hook=_set_desc_blocks),
                          triton.Config({"BM": 64}, num_warps=4, pre_hook=_set_desc_blocks)],
                 key=["M"])
@triton.jit
def tuned_tma_copy(in_desc, out_desc, M, BM: tl.constexpr):
    row = tl.program_id(0) * BM
    out_desc.store([row, 0], in_desc.load([row, 0]))


def test_autotuned_tma_kernel_gets_each_configs_block_shape(fake_driver, tmp_path):
    """Descriptors whose block shape a pre_hook sets per config: one kernel, bucketed on the
    key, whose variants carry each config's block shape (types overrides), and no
    per-config split (the block shape follows the config)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    fake_driver.timings = [1.0, 2.0, 2.0, 1.0]  # M=64: BM 16 wins; M=4096: BM 64
    with record.Recorder(log=None) as recorder:
        for m in (64, 4096):
            src = TensorDescriptor(A, [m, 32], [32, 1], [1, 32])  # the pre_hook sets the block
            dst = TensorDescriptor(C, [m, 32], [32, 1], [1, 32])
            tuned_tma_copy[lambda meta: (triton.cdiv(m, meta["BM"]),)](src, dst, m)
    report = record.export(recorder.recording, tmp_path / "pack", log=None)
    assert [k["name"] for k in report.manifest["kernels"]] == ["tuned_tma_copy"]
    kernel = report.manifest["kernels"][0]
    assert kernel["params"][0]["type"] == "tensordesc<fp32[16, 32]>"
    blocks = {}
    for variant in kernel["variants"]:
        bm = variant["constexprs"]["BM"]
        assert variant.get("types", {}).get("in_desc", kernel["params"][0]["type"]) == \
            f"tensordesc<fp32[{bm}, 32]>"
        blocks[bm] = variant["tensordesc_meta"][0]["block_size"]
    assert blocks == {16: [16, 32], 64: [64, 32]}
    assert validate_manifest(report.manifest, tmp_path / "pack") == []
    launch = report.record["launches"][1]
    assert launch["args"]["in_desc"]["tensordesc"]["block_shape"] == [64, 32]
    assert choose_variant(kernel, {"in_desc": 0, "out_desc": 0, "M": 4096})["constexprs"] == \
        {"BM": 64}


# ---------------------------------------------------------------------------
# Heavily specialized kernels, and kernels the writer refuses
# ---------------------------------------------------------------------------

def test_thirteen_specialized_properties_export(fake_driver, tmp_path):
    """The issue's case: a norm backward that Triton specializes on 8 pointers, 4 strides,
    M and N (14 properties) was refused with the whole export; now it is exported."""
    sys.path.insert(0, str(REPO / "kernels" / "examples"))
    try:
        import layer_norm_train
    finally:
        sys.path.pop(0)
    h, f = tl.float16, tl.float32
    X, W, DY, DX = (FakeTensor(k << 20, h) for k in (1, 2, 3, 4))
    DW, DB, MEAN, RSTD = (FakeTensor(k << 20, f) for k in (5, 6, 7, 8))
    with record.Recorder(log=None) as recorder:
        layer_norm_train.layer_norm_bwd_kernel[(4,)](X, W, DY, DX, DW, DB, MEAN, RSTD,
                                                     4096, 4096, 4096, 4096, 64, 4096,
                                                     BLOCK_M=16, BLOCK_N=256)
        scale_kernel[(4,)](A, C, 1000, BLOCK=128)
    report = record.export(recorder.recording, tmp_path / "pack", log=None)
    kernel = _kernel(report.manifest, "layer_norm_bwd_kernel")
    specialized = next(v for v in kernel["variants"] if v.get("assumptions"))
    assert len(specialized["assumptions"]) == 14
    assert [v["name"] for v in kernel["variants"] if "assumptions" not in v] == ["generic"]
    assert kernel["source"]["qualname"] == "layer_norm_train.layer_norm_bwd_kernel"
    _kernel(report.manifest, "scale_kernel")
    assert validate_manifest(report.manifest, tmp_path / "pack") == []


def test_a_kernel_the_writer_refuses_costs_no_other_kernel(recorded, tmp_path):
    recording, report, _ = recorded
    broken = copy.deepcopy(recording)
    cfg2 = [k for k in report.record["kernels"] if k["kernel"] == "test_record.scale_kernel__cfg2"]
    for entry in cfg2:  # every variant of one kernel: the kernel is refused
        broken.cubins[broken.compiles[entry["hash"]].cubin_sha256] = b"not a cubin"
    generic = next(k for k in report.record["kernels"]
                   if (k["kernel"], k["variant"]) == ("axpy_kernel", "generic"))
    broken.cubins[broken.compiles[generic["hash"]].cubin_sha256] = b"\x7fELF truncated"
    again = record.export(broken, tmp_path / "pack", log=None)
    names = [k["name"] for k in again.manifest["kernels"]]
    assert "test_record.scale_kernel__cfg2" not in names
    assert sorted(names) == sorted(n for n in (k["name"] for k in report.manifest["kernels"])
                                   if n != "test_record.scale_kernel__cfg2")
    refused = [x for x in again.record["not_exported"] if "kernel" in x]
    assert {(x["kernel"], x.get("variant")) for x in refused} == {
        *(("test_record.scale_kernel__cfg2", e["variant"]) for e in cfg2),
        ("test_record.scale_kernel__cfg2", None), ("axpy_kernel", "generic")}
    assert len(cfg2) == 2 and all("not an ELF" in x["reason"] or "ELF" in x["reason"]
                                  for x in refused), refused
    assert any(line.startswith("REFUSED kernel 'test_record.scale_kernel__cfg2' "
                               "(test_record.scale_kernel): ") for line in again.lines)
    axpy = _kernel(again.manifest, "axpy_kernel")
    assert "generic" not in [v["name"] for v in axpy["variants"]]
    assert "n.i64" in [v["name"] for v in axpy["variants"]]  # the other generic build
    # record.json launches only name what was written.
    written = {(k["name"], v["name"]) for k in again.manifest["kernels"] for v in k["variants"]}
    assert all((x["kernel"], x["variant"]) in written for x in again.record["launches"])
    assert json.loads((tmp_path / "pack" / record.RECORD_FILE).read_text())["not_exported"] \
        == again.record["not_exported"]


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------

PROGRAM = textwrap.dedent("""
    import sys
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    src = ASTSource(fn=double_kernel, signature={"x_ptr": "*fp32", "out_ptr": "*fp32",
                    "n": "i32", "BLOCK": "constexpr"}, constexprs={"BLOCK": 256})
    triton.compile(src, target=GPUTarget("cuda", 90, 32))
    print("compiled")
    sys.exit(int(sys.argv[1]))
""")


def _record_cli(tmp_path, *command, env=None):
    full_env = dict(os.environ, PYTHONPATH=str(TOOLS))
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "kpack_tools.record", "--out",
                           str(tmp_path / "pack"), "--", *command],
                          capture_output=True, text=True, env=full_env, timeout=300)


def test_cli_propagates_exit_status_without_triton_kernels(tmp_path):
    result = _record_cli(tmp_path, sys.executable, "-c",
                         "import sys; print('hello'); sys.exit(3)")
    assert result.returncode == 3, result.stderr
    assert "hello" in result.stdout
    assert "nothing recorded" in result.stderr
    assert not (tmp_path / "pack").exists()
    ok = _record_cli(tmp_path, sys.executable, "-c", "pass")
    assert ok.returncode == 1 and "nothing recorded" in ok.stderr


def test_cli_records_a_failing_program_and_keeps_its_status(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    result = _record_cli(tmp_path, sys.executable, str(script), "5")
    assert result.returncode == 5, result.stderr
    assert "compiled" in result.stdout
    assert "the program exited with status 5" in result.stderr
    manifest = json.loads((tmp_path / "pack" / "manifest.json").read_text())
    kernel = _kernel(manifest, "double_kernel")
    assert [v["constexprs"] for v in kernel["variants"]] == [{"BLOCK": 256}]
    assert json.loads((tmp_path / "pack" / "record.json").read_text())["launches"] == []
    again = _record_cli(tmp_path, sys.executable, str(script), "0")
    assert again.returncode == 2 and "--force" in again.stderr


def test_cli_refuses_other_triton_version(tmp_path):
    fake = tmp_path / "fake" / "triton"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '3.5.0'\n")
    result = _record_cli(tmp_path, sys.executable, "-c", "print('ran')",
                         env={"PYTHONPATH": os.pathsep.join([str(TOOLS), str(fake.parent)])})
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "found Triton 3.5.0, supported: 3.6.0" in result.stderr
    assert "ran" not in result.stdout
    assert not (tmp_path / "pack").exists()



def test_cli_runs_the_sitecustomize_it_shadows(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_RAN'] = 'yes'\n")
    result = _record_cli(
        tmp_path, sys.executable, "-c",
        "import os, sys; print('other:', os.environ.get('OTHER_RAN')); "
        "print('boot on path:', any('_record_boot' in p for p in sys.path))",
        env={"PYTHONPATH": os.pathsep.join([str(TOOLS), str(other)])})
    assert "other: yes" in result.stdout and "boot on path: False" in result.stdout
    assert "Error in sitecustomize" not in result.stderr, result.stderr
    assert result.returncode == 1  # nothing compiled


def test_hooks_removed_after_recording_and_one_recorder_at_a_time(recorded):
    from triton import knobs
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.autotuner import Autotuner
    before = (knobs.compilation.listener, CompiledKernel.launch_metadata, Autotuner._bench,
              Autotuner.run)
    recorder = record.Recorder(log=None).start()
    try:
        assert knobs.compilation.listener is not before[0]
        with pytest.raises(RuntimeError, match="another Recorder is already active"):
            record.Recorder(log=None).start()
    finally:
        recorder.stop()
    assert (knobs.compilation.listener, CompiledKernel.launch_metadata, Autotuner._bench,
            Autotuner.run) == before
