"""The CPU-testable parts of bench/triton_launch_bench.py: Google Benchmark JSON parsing,
statistics, the markdown table and its target verdicts, the AOT harness output parser, and
the triton.tools.compile / link / cc command lines (run here for real, no GPU).

tools/tests/data/gbench_*_sample.json were written by a Google Benchmark 1.7.1 program
(Debian's libbenchmark-dev) registering the C++ benchmark's row names with manual time,
`launches_per_iteration` = 256 in the context, plus rows this comparison must ignore
(`dispatch_only/args4`, `raw_params/args4/mt` with 1 and 2 threads, named like the C++
benchmark's threaded rows) and one row that calls SkipWithError (`broken/args4`);
2 repetitions, random interleaving.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")

_spec = importlib.util.spec_from_file_location("triton_launch_bench",
                                               REPO / "bench" / "triton_launch_bench.py")
tlb = importlib.util.module_from_spec(_spec)
sys.modules["triton_launch_bench"] = tlb
_spec.loader.exec_module(tlb)


def load(name):
    return json.loads((DATA / name).read_text())


# ---------------------------------------------------------------- Google Benchmark JSON


def test_parses_every_repetition_into_microseconds_per_launch():
    doc = load("gbench_launch_sample.json")
    got = tlb.parse_gbench(doc)
    assert set(got) == set(tlb.CPP_PATHS)
    for path in tlb.CPP_PATHS:
        for kernel in tlb.KERNELS:
            expected = [b["real_time"] / 1e3 / 256 for b in doc["benchmarks"]
                        if b["name"] == f"{path}/{kernel}/manual_time"
                        and b["run_type"] == "iteration"]
            assert len(expected) == 2
            assert got[path][kernel] == pytest.approx(expected, rel=1e-12)


def test_ignores_aggregates_and_rows_of_other_benchmarks():
    doc = load("gbench_launch_sample.json")
    names = {b["run_name"] for b in doc["benchmarks"]}
    assert "raw_params/args4/mt/manual_time/threads:1" in names
    assert any(b["run_type"] == "aggregate" for b in doc["benchmarks"])
    got = tlb.parse_gbench(doc)
    assert len(got["raw_params"]["args4"]) == 2  # not the threaded rows', not aggregates


def test_time_unit_and_launch_count_are_honoured():
    doc = load("gbench_launch_sample.json")
    base = tlb.parse_gbench(doc)
    for b in doc["benchmarks"]:
        b["real_time"] /= 1e3
        b["time_unit"] = "us"
    doc["context"]["launches_per_iteration"] = "128"
    got = tlb.parse_gbench(doc)
    assert got["raw_params"]["args32"] == pytest.approx(
        [2 * v for v in base["raw_params"]["args32"]], rel=1e-12)


def test_a_failed_benchmark_is_an_error_not_a_dropped_row():
    doc = load("gbench_error_sample.json")
    with pytest.raises(tlb.BenchError, match="broken/args4.*launch failed"):
        tlb.parse_gbench(doc, paths=("broken",), kernels=("args4",))


def test_missing_rows_and_missing_launch_count_are_errors():
    doc = load("gbench_launch_sample.json")
    doc["benchmarks"] = [b for b in doc["benchmarks"] if not b["name"].startswith("kpack_bound/")]
    with pytest.raises(tlb.BenchError, match="kpack_bound/args4, kpack_bound/args14"):
        tlb.parse_gbench(doc)
    doc = load("gbench_launch_sample.json")
    del doc["context"]["launches_per_iteration"]
    with pytest.raises(tlb.BenchError, match="launches_per_iteration"):
        tlb.parse_gbench(doc)


def test_filter_selects_exactly_the_fifteen_rows():
    import re
    doc = load("gbench_launch_sample.json")
    names = {b["run_name"] for b in doc["benchmarks"]}
    # Checked with Google Benchmark 1.7.1's --benchmark_list_tests too: the same 15 rows.
    picked = {n for n in names if re.search(tlb.gbench_filter(), n)}
    assert picked == {f"{p}/{k}/manual_time" for p in tlb.CPP_PATHS for k in tlb.KERNELS}
    cmd = tlb.gbench_command("/x/kpack_launch_bench", "/tmp/o.json", reps=7, min_time=0.3)
    assert cmd[0] == "/x/kpack_launch_bench"
    assert {"--benchmark_repetitions=7", "--benchmark_min_time=0.3",
            "--benchmark_enable_random_interleaving=true", "--benchmark_out=/tmp/o.json",
            "--benchmark_out_format=json"} <= set(cmd)


# ---------------------------------------------------------------- statistics and markdown


def test_summary_is_median_min_max():
    assert tlb.summarize([3.0, 1.0, 2.0]) == tlb.Summary(2.0, 1.0, 3.0, 3)
    assert tlb.summarize([4.0, 1.0, 2.0, 10.0]) == tlb.Summary(3.0, 1.0, 10.0, 4)
    with pytest.raises(tlb.BenchError):
        tlb.summarize([])


def synthetic(jit_over_kpack, compiled_over_kpack):
    """Results where kpack by Kernel costs 1 µs and raw params 0.5 µs per launch."""
    per_path = {p: {k: [1.0] for k in tlb.KERNELS} for p in tlb.PATH_KEYS}
    for k in tlb.KERNELS:
        per_path["raw_params"][k] = [0.5, 0.4, 0.6]
        per_path["triton_jit"][k] = [jit_over_kpack[k]]
        per_path["triton_compiled"][k] = [compiled_over_kpack[k] * 0.9,
                                          compiled_over_kpack[k],
                                          compiled_over_kpack[k] * 1.2]
    return tlb.summarize_all(per_path)


def test_target_verdicts_at_and_around_the_thresholds():
    s = synthetic({"args4": 4.0, "args14": 3.99, "args32": 12.0},
                  {"args4": 3.0, "args14": 2.5, "args32": 3.01})
    got = {(v["slower"], v["kernel"]): (round(v["ratio"], 3), v["met"])
           for v in tlb.target_verdicts(s)}
    assert got == {("triton_jit", "args4"): (4.0, True), ("triton_jit", "args14"): (3.99, False),
                   ("triton_jit", "args32"): (12.0, True),
                   ("triton_compiled", "args4"): (3.0, True),
                   ("triton_compiled", "args14"): (2.5, False),
                   ("triton_compiled", "args32"): (3.01, True)}


def test_markdown_has_every_path_the_ranges_ratios_and_verdicts():
    s = synthetic({"args4": 8.0, "args14": 3.0, "args32": 12.0},
                  {"args4": 4.0, "args14": 4.0, "args32": 2.0})
    specs = {p: f"spec of {p}" for p in tlb.PATH_KEYS}
    md = tlb.render_markdown(s, specs, notes=["n = 128"])
    lines = md.splitlines()
    rows = [ln for ln in lines if ln.startswith("| Triton `CompiledKernel")]
    # The first table: median with min-max; the second: ratio to raw params (median 0.5).
    assert rows[0] == "| Triton `CompiledKernel[grid](...)` | 4.000 (3.600–4.800) | " \
                      "4.000 (3.600–4.800) | 2.000 (1.800–2.400) |"
    assert rows[1] == "| Triton `CompiledKernel[grid](...)` | 8.00x | 8.00x | 4.00x |"
    assert "| raw `cuLaunchKernelEx`, params | 0.500 (0.400–0.600) |" in md
    jit_target = next(ln for ln in lines if "at least 4x cheaper" in ln)
    assert jit_target.endswith("| 8.00x met | 3.00x MISSED | 12.00x met |")
    compiled_target = next(ln for ln in lines if "at least 3x cheaper" in ln)
    assert compiled_target.endswith("| 4.00x met | 4.00x met | 2.00x MISSED |")
    for p in tlb.PATH_KEYS:
        assert f"spec of {p}" in md
    assert "- n = 128" in md
    assert sum(ln.startswith("| ") for ln in lines) == 3 * 1 + 2 * len(tlb.PATH_KEYS) + 2


# ---------------------------------------------------------------- AOT harness output


def aot_doc(**override):
    doc = {"driver_version": 13000, "n": 128, "batch": 256, "iters": 2, "reps": 2,
           "max_error": {"args4": 0, "args14": 0, "args32": 0},
           "us_per_launch": {"args4": [1.5, 1.25], "args14": [2.0, 2.5], "args32": [3.0, 3.5]}}
    doc.update(override)
    return json.dumps(doc)


def test_aot_output_is_read_and_its_check_enforced():
    per_kernel, doc = tlb.parse_aot_output(aot_doc())
    assert per_kernel == {"args4": [1.5, 1.25], "args14": [2.0, 2.5], "args32": [3.0, 3.5]}
    assert doc["driver_version"] == 13000
    with pytest.raises(tlb.BenchError, match="args14 computed a wrong result"):
        tlb.parse_aot_output(aot_doc(max_error={"args4": 0, "args14": 1.0, "args32": 0}))
    with pytest.raises(tlb.BenchError, match="args32 computed a wrong result: max error nan"):
        tlb.parse_aot_output(aot_doc(max_error={"args4": 0, "args14": 0, "args32": "nan"}))
    with pytest.raises(tlb.BenchError, match="1 repetitions of args4"):
        tlb.parse_aot_output(aot_doc(us_per_launch={"args4": [1.0], "args14": [2.0, 2.0],
                                                    "args32": [3.0, 3.0]}))
    with pytest.raises(tlb.BenchError, match="no valid JSON"):
        tlb.parse_aot_output("Triton Error [CUDA]: invalid argument\n")


# ---------------------------------------------------------------- AOT commands, for real

# triton.tools.compile asks the active driver for the target; with no GPU there is none,
# so this wrapper installs one for sm_90 and then runs the real module with the same argv.
_COMPILE_WRAPPER = """
import runpy, sys
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import ty_to_cpp
from triton.runtime.driver import driver

class Sm90:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def map_python_to_cpp_type(self, ty):
        return ty_to_cpp(ty)

driver.set_active(Sm90())
sys.argv = ["triton.tools.compile", *sys.argv[1:]]
runpy.run_module("triton.tools.compile", run_name="__main__")
"""

HINTED = {"args4": ("x_ptr", "out_ptr", "n"),
          "args14": ("p0", "p1", "p2", "p3", "p4", "p5", "out_ptr", "n"),
          "args32": tuple(f"p{i}" for i in range(15)) + ("out_ptr", "n")}


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    out = tmp_path_factory.mktemp("aot")
    wrapper = out.parent / "compile_wrapper.py"
    wrapper.write_text(_COMPILE_WRAPPER)
    env = dict(os.environ, PYTHONPATH=str(REPO / "tools"))
    for kernel in tlb.KERNELS:
        cmd = tlb.aot_compile_command(sys.executable, kernel, HINTED[kernel], out)
        assert cmd[:3] == [sys.executable, "-m", "triton.tools.compile"]
        subprocess.run([sys.executable, str(wrapper), *cmd[3:]], check=True, env=env)
        subprocess.run(tlb.aot_link_command(sys.executable, kernel, out), check=True, env=env)
    return out


def test_signature_hints_only_the_named_parameters():
    assert tlb.aot_signature("args4", ("x_ptr", "n")) == "*fp32:16, *fp32, i32:16, i32, 128"
    sig = tlb.aot_signature("args32", HINTED["args32"]).split(", ")
    assert len(sig) == 33 and sig[-1] == "128"
    assert sig.count("*fp32:16") == 16 and sig.count("i32:16") == 1 and sig.count("i32") == 15


def test_compile_and_link_write_the_entry_points_the_harness_calls(stubs):
    for kernel in tlb.KERNELS:
        assert len(list(stubs.glob(f"{kernel}.*.c"))) == 1
        assert len(list(stubs.glob(f"{kernel}.*.h"))) == 1
        header = (stubs / f"{kernel}_link.h").read_text()
        decl = next(ln for ln in header.splitlines()
                    if ln.startswith(f"CUresult {kernel}_default("))
        # stream, then the kernel's 2 * inputs + 2 call arguments.
        assert decl.count(",") + 1 == 1 + 2 * tlb.INPUTS[kernel] + 2
        source = (stubs / f"{kernel}_link.c").read_text()
        assert "(out_ptr % 16 == 0) && (n % 16 == 0)" in source
        stub = next(stubs.glob(f"{kernel}.*.c")).read_text()
        assert "unsigned int gX = (n + 127) / 128;" in stub
        assert f"{tlb.NUM_WARPS} * 32" in stub


def test_harness_compiles_and_links_against_the_stubs(stubs, tmp_path):
    assert Path(CUDA_HOME, "include", "cuda.h").is_file(), f"no cuda.h under {CUDA_HOME}"
    binary = tmp_path / "aot_bench"
    cmd = tlb.aot_build_command("gcc", stubs, binary, CUDA_HOME)
    result = subprocess.run(cmd + ["-Wall", "-Werror=implicit-function-declaration"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert binary.is_file()
    # Linked to the driver library, resolved at run time (no GPU here, so not run).
    assert "libcuda.so.1" in subprocess.run(["readelf", "-d", str(binary)], capture_output=True,
                                            text=True, check=True).stdout


# ---------------------------------------------------------------- command line


def test_missing_gpu_skips_unless_required(monkeypatch, capsys):
    monkeypatch.delenv("KPACK_REQUIRE_GPU", raising=False)
    assert tlb.skip_or_fail("no CUDA device") == 77
    monkeypatch.setenv("KPACK_REQUIRE_GPU", "1")
    assert tlb.skip_or_fail("no CUDA device") == 1
    assert "FAILED: no CUDA device (KPACK_REQUIRE_GPU=1)" in capsys.readouterr().err


def test_arguments_have_the_documented_defaults_and_are_checked():
    args = tlb.parse_args(["--kpack-bench", "b", "--out", "o"])
    assert (args.reps, args.batch, args.n, args.min_time) == (20, 256, 128, 0.2)
    for bad in (["--reps", "0"], ["--warmup", "0"], ["--n", "1"]):
        with pytest.raises(SystemExit):
            tlb.parse_args(["--kpack-bench", "b", "--out", "o", *bad])


# ---------------------------------------------------------------- the C++ binary


def fake_binary(tmp_path, body):
    binary = tmp_path / "kpack_launch_bench"
    binary.write_text("#!/bin/sh\n" + body)
    binary.chmod(0o755)
    return binary


def test_cpp_rows_come_from_the_binarys_json_output(tmp_path):
    sample = DATA / "gbench_launch_sample.json"
    binary = fake_binary(tmp_path, 'echo "$@" > "$(dirname "$0")/argv"\n'
                         'for a in "$@"; do case "$a" in\n'
                         f'  --benchmark_out=*) cp {sample} "${{a#--benchmark_out=}}";;\n'
                         'esac; done\n')
    args = tlb.parse_args(["--kpack-bench", str(binary), "--out", str(tmp_path), "--reps", "2"])
    rows, doc = tlb.measure_cpp(args)
    assert rows == tlb.parse_gbench(load("gbench_launch_sample.json"))
    assert doc["context"]["launches_per_iteration"] == "256"
    argv = (tmp_path / "argv").read_text().split()
    assert "--benchmark_repetitions=2" in argv
    assert f"--benchmark_out={tmp_path / 'kpack_launch_bench.json'}" in argv


def test_a_missing_or_failing_binary_is_a_clear_error(tmp_path):
    args = tlb.parse_args(["--kpack-bench", str(tmp_path / "nope"), "--out", str(tmp_path)])
    with pytest.raises(tlb.BenchError, match="nope is missing or not executable"):
        tlb.measure_cpp(args)
    binary = fake_binary(tmp_path, "echo 'no CUDA device' >&2\nexit 3\n")
    args = tlb.parse_args(["--kpack-bench", str(binary), "--out", str(tmp_path)])
    with pytest.raises(tlb.BenchError, match="(?s)exit code 3.*no CUDA device"):
        tlb.measure_cpp(args)
    binary = fake_binary(tmp_path, "exit 0\n")
    with pytest.raises(tlb.BenchError, match="wrote no readable JSON"):
        tlb.measure_cpp(args)
