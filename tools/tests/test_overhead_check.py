"""bench/overhead_check.py's reading of callgrind dumps (the CI gate's instruction counts)."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("overhead_check",
                                               REPO / "bench" / "overhead_check.py")
overhead_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overhead_check)

# The shape of a real dump: compressed object names, a call from the bench into the fake
# driver (counted), a call inside the driver (not counted again), a call from the bench
# to libc (not the driver), and a call with no cob= (same object as the caller).
DUMP = """\
# callgrind format
desc: Trigger: Client Request: kpack_by_kernel/args4
events: Ir
summary: 1000

ob=(43) /build/tests/fake_driver/libkpack_fake_cuda.so
fn=(1) FakeLaunchKernelEx
0 30
cfn=(2) Enter
calls=10 0
0 70

ob=(3) /usr/lib/libc.so.6
fn=(5) memset
0 11

ob=(40) /build/bench/kpack_overhead_bench
fn=(6) kpack::LaunchArgs
0 500
cob=(43)
cfn=(1)
calls=10 0
0 100
cob=(3)
cfn=(5)
calls=10 0
0 11
cfn=(7) kpack::Helper
calls=10 0
0 40
"""


def test_driver_part_is_calls_from_outside_into_the_fake():
    trigger, total, driver = overhead_check.parse_callgrind_dump(DUMP, "libkpack_fake_cuda.so")
    assert trigger == "kpack_by_kernel/args4"
    assert total == 1000
    assert driver == 100  # not the 70 inside it, not libc's 11, not the bench's own 40


def test_a_dump_without_a_summary_is_refused():
    try:
        overhead_check.parse_callgrind_dump("events: Ir\n", "libkpack_fake_cuda.so")
    except ValueError as e:
        assert "summary" in str(e)
    else:
        raise AssertionError("no error")


def _paragraphs(path: Path):
    return (REPO / path).read_text(encoding="utf-8").split("\n\n")


def test_the_documents_state_the_gates_thresholds():
    """bench/README.md and RESULTS.md once said "2x" while the script gated at 1.25x
    instructions and 2.5x ns: every paragraph that states the gate names both defaults."""
    factors = [f"{overhead_check.INSTRUCTION_FACTOR:g}", f"{overhead_check.NS_FACTOR:g}"]
    stating = []
    for doc in ("bench/README.md", "bench/RESULTS.md", "bench/CMakeLists.txt"):
        for text in _paragraphs(doc):
            if "overhead_baseline.json" in text and ("fails" in text or "fail " in text):
                stating.append(doc)
                flat = " ".join(text.split())
                assert all(f"{f}×" in flat or f"{f}x" in flat for f in factors), (doc, flat)
    assert sorted(set(stating)) == ["bench/CMakeLists.txt", "bench/README.md",
                                    "bench/RESULTS.md"]
