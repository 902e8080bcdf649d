"""Scratch memory from Python against the fake driver: a scratch callable that raises in a
step graph's eager step, and reserve_scratch / release_scratch taking a launch's stream
forms (kernels/testpack's `scratch` kernel needs 128 bytes of global scratch per program).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import kpack

from conftest import KERNELS
from test_launch import addr


class NoScratch(Exception):
    pass


def test_a_raising_scratch_callable_in_an_eager_step_propagates_and_is_asked_again(
        fake, open_pack):
    fake.use_primary_context()
    k = open_pack("testpack").scratch
    calls = []
    failing = [True]

    def alloc(nbytes, align, stream):
        calls.append(nbytes)
        if failing[0]:
            raise NoScratch("no scratch today")
        return 0x7E00_0000_0000

    b = k[(1,)].bind(addr(0), addr(1), 64, 64, 64, scratch=alloc)
    g = kpack.graph([b], unseen="launch_eagerly")
    s = fake.stream_create()
    mark = fake.launch_count()
    for _ in range(2):
        with pytest.raises(NoScratch, match="no scratch today"):
            g.replay(stream=s)
    assert calls == [128, 128], "the callable is asked again at the next replay"
    assert fake.launch_count() == mark, "nothing launched"
    failing[0] = False
    g.replay(stream=s)
    assert calls == [128, 128, 128] and fake.launch_count() == mark + 1
    assert g.stats()["eager_steps"] == 1
    b()
    assert len(calls) == 4 and fake.launch_count() == mark + 2


class TorchLikeStream:
    def __init__(self, handle):
        self.cuda_stream = handle


class ProtocolStream:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def test_reserve_and_release_scratch_take_the_stream_forms_of_a_launch(fake, driver):
    fake.use_primary_context()
    pack = kpack.open(KERNELS / "testpack", driver=driver)
    k, args = pack.scratch, (addr(0), addr(1), 64, 64, 64)
    handles = [fake.stream_create() for _ in range(3)]
    forms = [handles[0], TorchLikeStream(handles[1]), ProtocolStream(handles[2])]
    for stream in forms:
        pack.reserve_scratch(4096, stream)
    assert pack.stats()["scratch_arenas"] == 3 and pack.stats()["scratch_reserved"] == 3
    allocations = fake.call_count("MemAlloc")
    for stream in forms:
        k[(2,)](*args, stream=stream)  # 256 bytes: inside the reservation
    assert fake.call_count("MemAlloc") == allocations, "the reserved arenas served them"
    with pytest.raises(TypeError, match="stream= takes an int CUstream"):
        pack.reserve_scratch(4096, "stream")
    frees = fake.call_count("MemFree")
    for stream in forms:
        pack.release_scratch(stream)
    stats = pack.stats()
    assert stats["scratch_arenas"] == 0 and stats["scratch_reserved"] == 0
    assert stats["scratch_bytes"] == 0 and fake.call_count("MemFree") > frees


def test_reserve_scratch_without_a_stream_serves_a_launch_without_one(driver):
    # In a child process, as a launch's default stream depends on whether torch is
    # imported: the legacy stream before, torch's current stream (a stand-in torch whose
    # Tensor's exchange table reports `s`) after.
    script = f"""
import sys, types
import kpack
sys.path.insert(0, {str(KERNELS.parent / 'tests' / 'python')!r})
from conftest import Fake
import kpack_testing as _testing
fake = Fake({driver!r})
pack = kpack.open({str(KERNELS / 'testpack')!r}, driver={driver!r})
fake.use_primary_context()
args = (1 << 20, 2 << 20, 64, 64, 64)
s = fake.stream_create()
_testing.set_current_stream(s)
for torch_imported in (False, True):
    if torch_imported:
        torch = types.ModuleType("torch")
        torch.Tensor = _testing.FakeTensor
        sys.modules["torch"] = torch
    pack.reserve_scratch(4096)
    assert pack.stats()["scratch_arenas"] == 1
    allocations = fake.call_count("MemAlloc")
    mark = fake.launch_count()
    pack.scratch[(2,)](*args)
    assert fake.last_launch(mark).stream == (s if torch_imported else 0)
    assert fake.call_count("MemAlloc") == allocations, torch_imported
    pack.release_scratch()
    assert pack.stats()["scratch_arenas"] == 0, "release_scratch() released the same stream"
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
