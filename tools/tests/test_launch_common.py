"""bench/launch_common.py, the part the two Python launch benchmarks share, without a GPU:
how paths are timed and interleaved, and what Triton's two launch paths call."""

import contextlib
import importlib.util
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("launch_common",
                                               REPO / "bench" / "launch_common.py")
common = importlib.util.module_from_spec(_spec)
sys.modules["launch_common"] = common
_spec.loader.exec_module(common)


class Log:
    """A stand-in torch that records device synchronizations among the launches."""

    def __init__(self):
        self.events = []
        self.cuda = types.SimpleNamespace(synchronize=lambda: self.events.append("sync"))

    def batch(self, name):
        def run(count):
            self.events.append((name, count))
        return run


def test_every_batch_is_timed_between_synchronizations():
    torch = Log()
    us = common.time_batches(torch, torch.batch("a"), 256, 3)
    assert torch.events == ["sync", ("a", 256)] * 3 + ["sync"]
    assert us >= 0


def test_measure_warms_up_then_interleaves_every_path_each_repetition():
    torch = Log()
    entered = []

    @contextlib.contextmanager
    def active(path):
        entered.append(path)
        yield

    batches = {(p, k): torch.batch(f"{p}/{k}") for p in ("jit", "kpack") for k in ("a4", "a14")}
    results = common.measure(torch, batches, count=8, iters=2, warmup=1, reps=3, active=active)
    assert {p: {k: len(v) for k, v in per.items()} for p, per in results.items()} == \
        {"jit": {"a4": 3, "a14": 3}, "kpack": {"a4": 3, "a14": 3}}
    launched = [e for e in torch.events if e != "sync"]
    warmup, timed = launched[:4], launched[4:]
    assert [name for name, _ in warmup] == ["jit/a4", "jit/a14", "kpack/a4", "kpack/a14"]
    assert len(timed) == 3 * 4 * 2 and all(count == 8 for _, count in timed)
    rounds = [[name for name, _ in timed[i:i + 8:2]] for i in range(0, 24, 8)]
    assert all(sorted(r) == sorted(name for name, _ in warmup) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1, "a new random order per repetition"
    assert entered == [name.split("/")[0] for name, _ in warmup] + \
        [name.split("/")[0] for r in rounds for name in r]


def test_triton_paths_launch_as_the_jit_and_the_cached_compiled_kernel():
    calls = []

    class Compiled:
        def __getitem__(self, grid):
            return lambda *args: calls.append(("compiled", grid, args))

    class Fn:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append(("jit", grid, args, kwargs))
                return Compiled()
            return launch

    jit, cached, compiled = common.triton_paths(Fn(), ("x", "out", 300, 3), n=300)
    assert isinstance(compiled, Compiled)
    calls.clear()
    jit(2)
    cached(1)
    options = {"BLOCK": 128, "num_warps": 4}
    assert calls == [("jit", (3,), ("x", "out", 300, 3), options)] * 2 + \
        [("compiled", (3, 1, 1), ("x", "out", 300, 3, 128))]


def test_looped_calls_the_launch_count_times():
    calls = []
    common.looped(lambda: calls.append(1))(5)
    assert calls == [1] * 5
