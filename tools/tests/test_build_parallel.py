"""``kpack_tools.build --jobs``: the variants compiled in a process pool first, into Triton's
on-disk cache, where the serial pass finds all of them; the pack is the one a serial build
writes. Run with ``PYTHONPATH=tools python3 -m pytest tools/tests/test_build_parallel.py``.
"""

from pathlib import Path

import pytest

from kpack_tools import build as builder

REPO = Path(__file__).resolve().parents[2]
SPECS = [REPO / "kernels" / "examples" / name for name in ("vector_add.py", "softmax.py")]


def _entries(cache):
    return sorted(p.name for p in Path(cache).iterdir()) if Path(cache).is_dir() else []


def test_parallel_precompile_fills_the_cache_the_build_then_uses(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache_parallel"))
    after_pool = {}
    precompile = builder.precompile

    def watched(*args, **kwargs):
        precompile(*args, **kwargs)
        after_pool["entries"] = _entries(tmp_path / "cache_parallel")
    monkeypatch.setattr(builder, "precompile", watched)
    logs = []
    parallel, _ = builder.build(SPECS, tmp_path / "parallel", tune=False, log=logs.append,
                                jobs=2)
    assert any(line.startswith("compiled ") and "with 2 processes" in line for line in logs)
    assert after_pool["entries"], "the pool compiled nothing into the cache"
    # The serial pass compiled nothing the pool had not: every variant was a cache hit.
    assert _entries(tmp_path / "cache_parallel") == after_pool["entries"]

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache_serial"))
    serial, _ = builder.build(SPECS, tmp_path / "serial", tune=False, log=None)
    assert parallel == serial
    for kernel in serial["kernels"]:
        for variant in kernel["variants"]:
            assert (tmp_path / "parallel" / variant["cubin"]).read_bytes() == \
                (tmp_path / "serial" / variant["cubin"]).read_bytes()


def test_jobs_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        builder.main([str(SPECS[0]), "--out", "unused", "--jobs", "0"])
    assert "--jobs must be at least 1" in capsys.readouterr().err


def test_a_variant_the_pool_cannot_compile_is_left_to_the_build(tmp_path, monkeypatch):
    """A failing worker is reported, not fatal: the serial pass compiles (and fails) it
    with the build's own error."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    logs = []
    builder.precompile([SPECS[0]], [("vector_add", "no_such_config", "generic"),
                                    ("vector_add", "b1024_w4", "generic")], 90, 2, logs.append)
    assert any("precompile of ('vector_add', 'no_such_config', 'generic') failed" in line
               for line in logs)
    assert any(line.startswith("compiled 2 variants") for line in logs)
    assert _entries(tmp_path / "cache")
