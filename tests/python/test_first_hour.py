"""What a new user meets first, against the fake driver: making a CUDA context current
without torch, errors that speak Python rather than C++, a clean ``dir(kpack)``, and
counters that are complete."""

from __future__ import annotations

import threading

import pytest

import kpack

from conftest import KERNELS
from test_launch import addr


def on_new_thread(fn):
    """fn() on a new thread (which, with the fake as with libcuda, has no current context);
    its result, or the exception it raised."""
    out = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as e:  # noqa: BLE001 (handed back to the test)
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_use_device_makes_a_context_current_without_torch(fake, open_pack):
    pack = open_pack("examplepack")
    pack.use_device(0)

    def body():
        assert pack.current_device() is None
        mark = fake.launch_count()
        with pytest.raises(kpack.FailedPreconditionError,
                           match=r"no CUDA context is current on this thread; make one current "
                                 r"\(pack\.use_device\(ordinal\), or any CUDA runtime call\)"):
            pack.vector_add(addr(0), addr(1), addr(2), 64)
        assert fake.launch_count() == mark
        pack.use_device(0)
        assert pack.current_device() == 0
        pack.vector_add(addr(0), addr(1), addr(2), 64)
        return fake.launch_count() - mark
    assert on_new_thread(body) == 1
    assert pack.current_device() == 0, "the other thread's context was its own"


def test_use_device_refuses_a_device_that_does_not_exist(fake, open_pack):
    with pytest.raises(kpack.InvalidArgumentError,
                       match=r"there is no CUDA device 3: the driver has 1 device \(ordinal 0\)"):
        open_pack("examplepack").use_device(3)


def test_a_missing_driver_is_reported_in_python_terms(fake):
    with pytest.raises(kpack.UnavailableError) as e:
        kpack.open(KERNELS / "testpack", driver="/nonexistent/libcuda.so.1")
    message = str(e.value)
    assert "the path was given explicitly (kpack.open(..., driver=...))" in message, message
    assert "Options::" not in message and e.value.code == "UNAVAILABLE"


def errors_in_python_terms(fake, driver, open_pack):
    """(what, exception) for library errors whose C++ message names C++ API."""
    out = []
    pack = kpack.open(KERNELS / "testpack", driver=driver)
    k, args = pack.scratch, (addr(0), addr(1), 64, 64, 64)
    s = fake.stream_create()
    for what, call in [("a load in a capture", lambda: k[(4,)](*args, stream=s)),
                       ("reserve_scratch during a capture", lambda: pack.reserve_scratch(64, s)),
                       ("scratch without a reservation in a capture",
                        lambda: k[(4,)](*args, stream=s))]:
        fake.begin_capture(s)
        try:
            with pytest.raises(kpack.FailedPreconditionError) as e:
                call()
        finally:
            fake.end_capture(s)
        out.append((what, e.value))
        pack.preload()
    va = open_pack("graphpack").vector_add
    g = kpack.graph([va.bind(addr(0), addr(1), addr(2), 100)], unseen="error")
    with pytest.raises(kpack.FailedPreconditionError) as e:
        g.replay(stream=s)
    out.append(("unseen signature", e.value))
    with pytest.raises(kpack.InvalidArgumentError) as e:
        g.pin_grid(3, 1)
    out.append(("pin_grid", e.value))
    return out


def test_library_errors_name_the_python_api(fake, driver, open_pack):
    errors = dict(errors_in_python_terms(fake, driver, open_pack))
    assert "call pack.preload() or kernel.preload() in this context before beginning" in str(
        errors["a load in a capture"])
    assert "reserve_scratch on a stream that is being captured" in str(
        errors["reserve_scratch during a capture"])
    assert "call pack.reserve_scratch(512, stream) before beginning each capture" in str(
        errors["scratch without a reservation in a capture"])
    assert "(unseen='error')" in str(errors["unseen signature"])
    assert "declare the shapes with build() first" in str(errors["unseen signature"])
    assert str(errors["pin_grid"]).startswith("pin_grid: ")
    for what, e in errors.items():
        assert "::" not in str(e), f"{what}: {e}"


def test_dir_lists_only_kpacks_api():
    names = set(dir(kpack))
    assert names <= set(kpack.__all__) | {"__version__", "torch"}, names - set(kpack.__all__)
    assert {"open", "Pack", "Kernel", "graph", "Error", "install"} <= names
    for helper in ("List", "Optional", "Iterator", "annotations", "_kpack", "_os"):
        assert helper not in names
    for name in kpack.__all__:
        assert hasattr(kpack, name), name


def test_stats_give_every_counter(fake, driver):
    pack = kpack.open(KERNELS / "testpack", driver=driver)
    assert set(pack.stats()) == {"libraries_loaded", "scratch_arenas", "scratch_reserved",
                                 "scratch_in_graphs", "scratch_idle", "scratch_bytes"}
    s = fake.stream_create()
    pack.reserve_scratch(4096, s)
    stats = pack.stats()
    assert stats["scratch_arenas"] == 1 and stats["scratch_reserved"] == 1
    assert stats["scratch_bytes"] >= 2 * 4096
