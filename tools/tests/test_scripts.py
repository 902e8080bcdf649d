"""The set-up, main-job and test scripts (tools/*.sh) tell the user what a long step is
doing before it starts: `pip install -q` compiled the extension for a minute and a half
without a word."""

import re
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(TOOLS.glob("*.sh"))


def _commands(lines):
    """(index, command text) per command, continuation lines joined."""
    out, start, text = [], None, ""
    for i, line in enumerate(lines):
        if start is None:
            start, text = i, ""
        text += line.rstrip("\\\n") + " "
        if not line.rstrip().endswith("\\"):
            out.append((start, text.strip()))
            start = None
    return out


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_a_quiet_pip_install_is_announced(script):
    lines = script.read_text(encoding="utf-8").splitlines()
    commands = _commands(lines)
    for n, (start, text) in enumerate(commands):
        if re.search(r"pip install\b", text) and re.search(r"(^|\s)-q(\s|$)", text) \
                and ">" not in text:  # output that goes to a log is announced by the log
            before = [t for _, t in commands[max(0, n - 4):n]]
            assert any(t.startswith("echo") and "pip install" in t for t in before), \
                f"{script.name}:{start + 1}: a quiet `pip install` with no `echo` before it " \
                f"saying what it does"


def test_the_scripts_are_found():
    assert {"run.sh", "setup.sh", "test.sh"} <= {s.name for s in SCRIPTS}


def test_the_tests_show_what_opening_a_pack_costs():
    """ctest shows a passing test's output only with -V: tools/test.sh runs the Open
    benchmark itself, after a CPU tier that leaves it out, so CI prints its figures."""
    text = (TOOLS / "test.sh").read_text(encoding="utf-8")
    commands = [t for _, t in _commands(text.splitlines())]
    assert any("ctest" in t and "-L cpu" in t and "-E '^kpack_open_bench$'" in t
               for t in commands), "the CPU tier runs kpack_open_bench, which hides its output"
    assert any(t.startswith("KPACK_CUDA_DRIVER=") and "build/bench/kpack_open_bench" in t
               for t in commands)
