"""kpack._kpack's launch entry for native code (src/python/native_api.h), which kpack.torch's
C++ ops launch through, exercised without torch against the recording fake driver:
kpack_testing.native_launch calls the entry as libkpack_torch_ops.so does. A launch through
it must put the same parameter bytes to the driver as the Python launch of the same values.
"""

from __future__ import annotations

import math

import pytest

import kpack
import kpack_testing as _testing
from kpack import _kpack

from conftest import KERNELS

BASE = 0x7F00_0000_0000


def addr(i: int) -> int:
    return BASE + 0x10_0000 * (i + 1)


@pytest.fixture
def api(fake):
    fake.use_primary_context()  # what torch's CUDAGuard does for the C++ ops
    return _kpack._native_api()


def launch(api, kernel, args, **kw):
    return _testing.native_launch(api, kernel._native_handle(), args, **kw)


def test_the_entry_describes_the_kernel_and_its_call_parameters(api, open_pack):
    k = open_pack("testpack").scalars
    version, size_ok, name, params, past_end_null = _testing.native_describe(
        api, k._native_handle())
    assert version == 1 and size_ok and name == "scalars" and past_end_null
    assert params == [(p.name, p.type) for p in k.params if not p.constexpr]
    assert [p[0] for p in params] == ["x_ptr", "out_ptr", "n", "alpha", "beta", "gamma", "flag",
                                      "big"]
    # A handle belongs to its object: another kernel, another handle.
    assert k._native_handle() != open_pack("testpack").add._native_handle()


def test_a_native_launch_passes_what_the_python_launch_passes(fake, api, open_pack):
    k = open_pack("testpack").scalars
    values = [addr(0), addr(1), 256, 1.5, -2.0, 0.1, True, -(2**40)]
    mark = fake.launch_count()
    k[(3,)](*values, stream=0)  # explicit: the default would be torch's if imported
    want = fake.last_launch(mark)
    kinds = ["p", "p", "i", "f", "f", "f", "b", "i"]
    mark = fake.launch_count()
    assert launch(api, k, list(zip(kinds, values)), grid=(3,)) == (0, "", 0)
    got = fake.last_launch(mark)
    assert got.params == want.params and got.grid == want.grid == (3, 1, 1)
    assert got.entry == want.entry and got.stream == want.stream


def test_without_a_grid_the_manifest_grid_expressions_apply(fake, api, open_pack, layouts):
    k = open_pack("examplepack").vector_add
    off = layouts("examplepack", "vector_add", "generic")
    mark = fake.launch_count()
    code, message, _ = launch(api, k, [("p", addr(0)), ("p", addr(1)), ("p", addr(2)),
                                       ("i", 5000)])
    assert (code, message) == (0, "")
    got = fake.last_launch(mark)
    assert got.grid == (math.ceil(5000 / 1024), 1, 1)
    assert [got.u64(off[p]) for p in ("x_ptr", "y_ptr", "out_ptr")] == [addr(0), addr(1),
                                                                        addr(2)]
    assert got.i32(off["n"]) == 5000


def test_a_thread_without_a_current_context_gets_the_devices_primary_context(fake,
                                                                              open_pack):
    import threading  # noqa: PLC0415
    k = open_pack("examplepack").vector_add
    api = _kpack._native_api()
    result = []

    def run():  # a fresh thread: the fake, like libcuda, has no context current there
        result.append(launch(api, k, [("p", addr(0)), ("p", addr(1)), ("p", addr(2)),
                                      ("i", 64)]))
    mark = fake.launch_count()
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert result == [(0, "", 0)] and fake.launch_count() == mark + 1


INVALID_ARGUMENT = 3


def test_a_wrong_argument_count_fails_naming_the_kernel_and_launches_nothing(fake, api,
                                                                            open_pack):
    k = open_pack("examplepack").vector_add
    mark = fake.launch_count()
    code, message, _ = launch(api, k, [("p", addr(0)), ("p", addr(1)), ("p", addr(2))])
    assert code == INVALID_ARGUMENT
    assert message == "kernel 'vector_add' takes 4 arguments, got 3"
    assert fake.launch_count() == mark


def test_a_value_the_runtime_refuses_comes_back_as_its_status(fake, api, open_pack):
    k = open_pack("examplepack").vector_add
    mark = fake.launch_count()
    code, message, _ = launch(api, k, [("p", addr(0)), ("p", addr(1)), ("p", addr(2)),
                                       ("i", 2**31)])
    assert code == INVALID_ARGUMENT and "'n'" in message and "2147483648" in message, message
    assert fake.launch_count() == mark


def test_a_long_message_is_truncated_to_the_buffer(fake, api, open_pack):
    k = open_pack("examplepack").vector_add
    code, message, _ = launch(api, k, [("i", 1)] * 300)
    assert code == INVALID_ARGUMENT and message.startswith("kernel 'vector_add' takes 4")


def test_scratch_comes_from_the_given_allocator(fake, api, open_pack):
    k = open_pack("testpack").scratch
    scratch = 0x7E00_0000_0000
    mark = fake.launch_count()
    code, message, calls = launch(api, k, [("p", addr(0)), ("p", addr(1)), ("i", 64),
                                           ("i", 64), ("i", 64)], grid=(1,), scratch=scratch)
    assert (code, message, calls) == (0, "", 1)
    got = fake.last_launch(mark)
    assert any(got.u64(o) == scratch for o in range(0, len(got.params) - 7, 8)), \
        "the allocator's memory is the launch's global scratch"


def test_preload_on_first_use_loads_every_variant_once_per_device(fake, api, driver):
    pack = kpack.open(KERNELS / "examplepack", driver=driver, preload="first_use")
    k = pack.vector_add
    assert pack.stats()["libraries_loaded"] == 0
    args = [("p", addr(0)), ("p", addr(1)), ("p", addr(2)), ("i", 4096)]
    before = fake.call_count("LibraryLoadData")
    assert launch(api, k, args)[0] == 0
    loaded = pack.stats()["libraries_loaded"]
    variants = sum(len(pack[name].variants) for name in pack.kernel_names)
    assert loaded == variants > 1, f"{loaded} libraries loaded for {variants} variants"
    loads = fake.call_count("LibraryLoadData")
    assert loads >= before + variants
    assert launch(api, k, args)[0] == 0
    assert fake.call_count("LibraryLoadData") == loads, "preloaded once"
    lazy = kpack.open(KERNELS / "examplepack", driver=driver)
    assert launch(api, lazy.vector_add, args)[0] == 0
    assert lazy.stats()["libraries_loaded"] == 1, "without first-use preloading: one variant"
