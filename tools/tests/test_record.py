"""Tests for record mode (``kpack_tools.record``), on the CPU.

Triton's JIT needs a GPU driver only to query the device and to launch, so the
JIT path is driven here through a stand-in driver (``triton.runtime.driver.
set_active``) that reports an sm_90 device and whose launcher does nothing:
``kernel[grid](...)`` specializes the arguments, compiles real sm_90a cubins
and calls the hooks exactly as on a GPU; only the launch itself is a no-op.
The command line is run as a subprocess on tiny programs.

Run with ``PYTHONPATH=tools python3 -m pytest tools/tests``; no GPU needed.
"""

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
    out = tmp_path_factory.mktemp("record") / "pack"
    report = record.export(recorder.recording, out, log=None)
    return recorder.recording, report, out


def _kernel(manifest, name):
    matches = [k for k in manifest["kernels"] if k["name"] == name]
    assert matches, f"no kernel {name} in {[k['name'] for k in manifest['kernels']]}"
    return matches[0]


def test_every_launch_reached_the_launcher(recorded):
    # 5 axpy + 3 scale + 2 autotune benchmarks + 1 tuned + 1 tma.
    assert len(FakeDriver.launcher_cls.launches) == 12


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
            values[param["name"]] = arg["ptr"] if "ptr" in arg else arg["value"]
        chosen = choose_variant(kernel, values)
        assert chosen is not None and chosen["name"] == launch["variant"], launch
        checked += 1
    assert checked == 9  # 5 axpy, 3 scale, 1 tuned (the TMA kernel is not exported)


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
    assert [v["constexprs"]["BLOCK"] for v in tuned["variants"]] == [128]
    assert tuned["variants"][0]["num_warps"] == 4
    assert any("autotuning candidate" in line and "'BLOCK': 64" in line
               for line in report.lines)
    assert any(line.startswith("WARNING: kernel 'tuned_kernel'") and "pre-hooks" in line
               for line in report.lines)
    reasons = [x["reason"] for x in report.record["not_exported"]]
    assert "autotuning candidate, not chosen" in reasons


def test_tma_descriptor_kernel_refused_by_name(recorded):
    _, report, _ = recorded
    names = [k["name"] for k in report.manifest["kernels"]]
    assert not any("tma" in n for n in names)
    refused = [line for line in report.lines if line.startswith("REFUSED")]
    assert any("tma_kernel" in line and "host TMA descriptor" in line for line in refused)


def test_no_generic_variant_reported(recorded):
    _, report, _ = recorded
    assert any("kernel 'axpy_kernel' has no generic variant" in line for line in report.lines)


def test_record_json_in_pack_matches_cubins(recorded):
    _, report, out = recorded
    on_disk = json.loads((out / record.RECORD_FILE).read_text())
    assert on_disk == json.loads(json.dumps(report.record))
    assert on_disk["format"] == record.RECORD_FORMAT
    for kernel in report.manifest["kernels"]:
        for variant in kernel["variants"]:
            cubin = parse_cubin((out / variant["cubin"]).read_bytes())
            assert variant["entry"] in cubin.layouts


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
