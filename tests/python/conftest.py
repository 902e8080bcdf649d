"""Fixtures for the Python extension's CPU tests: the installed `kpack` package against the
tests' recording fake CUDA driver (tests/fake_driver, built by CMake), with tensor stand-ins
from the test-only module kpack_testing (kpack_testing_path.py says where it is).

The fake is found at $KPACK_FAKE_DRIVER, else build/tests/fake_driver/libkpack_fake_cuda.so;
without it the tests error (they never skip). `fake` reads what the driver recorded through
the C functions of tests/fake_driver/fake_driver_c.cc; it is the same loaded library as the
one kpack dlopens (dlopen returns the already loaded object).
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

import kpack_testing_path

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "kernels"

# The tensor stand-ins (import kpack_testing) are a test-only module, not in the wheel.
kpack_testing_path.add_to_sys_path()


def fake_driver_path() -> str:
    path = os.environ.get("KPACK_FAKE_DRIVER") or str(
        REPO / "build" / "tests" / "fake_driver" / "libkpack_fake_cuda.so")
    if not Path(path).is_file():
        raise RuntimeError(f"the fake CUDA driver {path} is missing: build the CMake target "
                           "kpack_fake_cuda (tools/setup.sh does) or set KPACK_FAKE_DRIVER")
    return path


class _Launch(ctypes.Structure):
    _fields_ = [("entry", ctypes.c_char * 256), ("grid", ctypes.c_uint32 * 3),
                ("block", ctypes.c_uint32 * 3), ("shared_bytes", ctypes.c_uint32),
                ("num_attrs", ctypes.c_uint32), ("stream", ctypes.c_uint64),
                ("context", ctypes.c_uint64), ("param_size", ctypes.c_uint64),
                ("params", ctypes.c_uint8 * 4096), ("captured", ctypes.c_uint32),
                ("graph_replay", ctypes.c_uint32)]


@dataclass
class Launch:
    """One launch the fake driver accepted."""
    entry: str
    grid: tuple
    block: tuple
    shared_bytes: int
    stream: int
    params: bytes
    captured: bool = False      # issued into a capturing stream
    graph_replay: bool = False  # issued by cuGraphLaunch

    def u64(self, offset: int) -> int:
        return struct.unpack_from("<Q", self.params, offset)[0]

    def i32(self, offset: int) -> int:
        return struct.unpack_from("<i", self.params, offset)[0]

    def i64(self, offset: int) -> int:
        return struct.unpack_from("<q", self.params, offset)[0]

    def f32(self, offset: int) -> float:
        return struct.unpack_from("<f", self.params, offset)[0]

    def u16(self, offset: int) -> int:
        return struct.unpack_from("<H", self.params, offset)[0]

    def u8(self, offset: int) -> int:
        return self.params[offset]


class _TensorMapEncode(ctypes.Structure):
    _fields_ = [("tensor_map", ctypes.c_uint64), ("address", ctypes.c_uint64),
                ("dims", ctypes.c_uint64 * 5), ("strides", ctypes.c_uint64 * 4),
                ("box", ctypes.c_uint32 * 5), ("element_strides", ctypes.c_uint32 * 5),
                ("data_type", ctypes.c_uint32), ("rank", ctypes.c_uint32),
                ("interleave", ctypes.c_uint32), ("swizzle", ctypes.c_uint32),
                ("l2_promotion", ctypes.c_uint32), ("oob_fill", ctypes.c_uint32),
                ("ok", ctypes.c_uint32)]


@dataclass
class TensorMapEncode:
    """One cuTensorMapEncodeTiled the fake driver received (arrays innermost first)."""
    address: int
    dims: tuple
    strides: tuple
    box: tuple
    data_type: int
    swizzle: int
    oob_fill: int
    ok: bool


class Fake:
    CUDA_ERROR_LAUNCH_FAILED = 719
    CUDA_ERROR_OUT_OF_MEMORY = 2

    def __init__(self, path: str):
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.lib.kpack_fake_launch_count.restype = ctypes.c_int64
        self.lib.kpack_fake_get_launch.argtypes = [ctypes.c_int64, ctypes.POINTER(_Launch)]
        self.lib.kpack_fake_call_count.argtypes = [ctypes.c_char_p]
        self.lib.kpack_fake_call_count.restype = ctypes.c_int64
        self.lib.kpack_fake_fail_next.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.lib.cuGetProcAddress_v2.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                                 ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p]

    def launch_count(self) -> int:
        return self.lib.kpack_fake_launch_count()

    def launches_since(self, mark: int) -> list:
        out = []
        for i in range(mark, self.launch_count()):
            rec = _Launch()
            assert self.lib.kpack_fake_get_launch(i, ctypes.byref(rec)) == 0
            out.append(Launch(rec.entry.decode(), tuple(rec.grid), tuple(rec.block),
                              rec.shared_bytes, rec.stream, bytes(rec.params)[:rec.param_size],
                              bool(rec.captured), bool(rec.graph_replay)))
        return out

    def last_launch(self, mark: int) -> Launch:
        launches = self.launches_since(mark)
        assert len(launches) == 1, f"expected one launch, got {len(launches)}"
        return launches[0]

    def tensor_map_encodes_since(self, mark: int) -> list:
        lib = self.lib
        lib.kpack_fake_tensor_map_encode_count.restype = ctypes.c_int64
        lib.kpack_fake_get_tensor_map_encode.argtypes = [ctypes.c_int64,
                                                         ctypes.POINTER(_TensorMapEncode)]
        out = []
        for i in range(mark, lib.kpack_fake_tensor_map_encode_count()):
            e = _TensorMapEncode()
            assert lib.kpack_fake_get_tensor_map_encode(i, ctypes.byref(e)) == 0
            out.append(TensorMapEncode(e.address, tuple(e.dims[:e.rank]),
                                       tuple(e.strides[:e.rank - 1]), tuple(e.box[:e.rank]),
                                       e.data_type, e.swizzle, e.oob_fill, bool(e.ok)))
        return out

    def tensor_map_encode_count(self) -> int:
        self.lib.kpack_fake_tensor_map_encode_count.restype = ctypes.c_int64
        return self.lib.kpack_fake_tensor_map_encode_count()

    def call_count(self, fn: str) -> int:
        return self.lib.kpack_fake_call_count(fn.encode())

    def fail_next(self, fn: str, code: int, skip: int = 0) -> None:
        self.lib.kpack_fake_fail_next_skip.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
        self.lib.kpack_fake_fail_next_skip(fn.encode(), code, skip)

    def cancel_failures(self) -> int:
        """Drops the failures not yet due; how many there were (0: all fired)."""
        return self.lib.kpack_fake_cancel_failures()

    def allocation_id(self, pointer: int) -> int:
        """The process-unique id of the live allocation holding `pointer`, 0 if none."""
        self.lib.kpack_fake_allocation_id.argtypes = [ctypes.c_uint64]
        self.lib.kpack_fake_allocation_id.restype = ctypes.c_uint64
        return self.lib.kpack_fake_allocation_id(pointer)

    def capture_status(self, stream: int) -> int:
        """The stream's CUstreamCaptureStatus (0 none, 1 active, 2 invalidated), read
        without a driver call."""
        self.lib.kpack_fake_capture_status.argtypes = [ctypes.c_uint64]
        return self.lib.kpack_fake_capture_status(stream)

    def live(self) -> dict:
        """Live allocations, graphs plus executables, and user objects."""
        self.lib.kpack_fake_live_allocations.restype = ctypes.c_int64
        return {"allocations": self.lib.kpack_fake_live_allocations(),
                "graphs": self.lib.kpack_fake_live_graphs(),
                "user_objects": self.lib.kpack_fake_live_user_objects()}

    def _proc(self, name: str, version: int, *argtypes):
        fn = ctypes.c_void_p()
        assert self.lib.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), version, 0,
                                            None) == 0, name
        return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(fn.value)

    def device(self, ordinal: int) -> int:
        """cuDeviceGet's CUdevice handle for a device ordinal."""
        get = self._proc("cuDeviceGet", 2000, ctypes.POINTER(ctypes.c_int), ctypes.c_int)
        dev = ctypes.c_int()
        assert get(ctypes.byref(dev), ordinal) == 0
        return dev.value

    def use_primary_context(self, ordinal: int = 0) -> None:
        """Makes a device's primary context current on this thread, as a CUDA runtime call
        (or kpack's first launch of a tensor on that device) would; like libcuda, the fake
        gives a fresh thread no current context."""
        retain = self._proc("cuDevicePrimaryCtxRetain", 7000, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.c_int)
        set_current = self._proc("cuCtxSetCurrent", 4000, ctypes.c_void_p)
        ctx = ctypes.c_void_p()
        assert retain(ctypes.byref(ctx), self.device(ordinal)) == 0
        assert set_current(ctx) == 0

    def ctx_create(self, ordinal: int) -> int:
        """A new (non-primary) context of a device, made current (cuCtxCreate)."""
        create = self._proc("cuCtxCreate", 12050, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.c_void_p, ctypes.c_uint, ctypes.c_int)
        ctx = ctypes.c_void_p()
        assert create(ctypes.byref(ctx), None, 0, self.device(ordinal)) == 0
        return ctx.value

    def ctx_destroy(self, ctx: int) -> None:
        assert self._proc("cuCtxDestroy", 4000, ctypes.c_void_p)(ctx) == 0

    def stream_create(self) -> int:
        """A new stream of device 0's primary context (made current), as an int."""
        self.use_primary_context()
        create = self._proc("cuStreamCreate", 2000, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.c_uint)
        s = ctypes.c_void_p()
        assert create(ctypes.byref(s), 0) == 0
        return s.value

    def stream_destroy(self, stream: int) -> None:
        assert self._proc("cuStreamDestroy", 4000, ctypes.c_void_p)(stream) == 0

    def begin_capture(self, stream: int, mode: int = 0) -> None:
        """cuStreamBeginCapture (mode 0 global, 1 thread-local, 2 relaxed)."""
        begin = self._proc("cuStreamBeginCapture", 10010, ctypes.c_void_p, ctypes.c_int)
        assert begin(stream, mode) == 0

    def end_capture_keep(self, stream: int) -> tuple:
        """cuStreamEndCapture: (its result, the captured graph or None)."""
        end = self._proc("cuStreamEndCapture", 10000, ctypes.c_void_p,
                         ctypes.POINTER(ctypes.c_void_p))
        graph = ctypes.c_void_p()
        return end(stream, ctypes.byref(graph)), graph.value

    def end_capture(self, stream: int) -> None:
        """cuStreamEndCapture, and the captured graph destroyed."""
        r, graph = self.end_capture_keep(stream)
        assert r == 0
        self.graph_destroy(graph)

    def _relaxed(self, call):
        """``call()`` in RELAXED capture interaction mode (cuThreadExchangeStreamCaptureMode),
        as a program instantiates or destroys graphs while one of its streams captures."""
        exchange = self._proc("cuThreadExchangeStreamCaptureMode", 10010,
                              ctypes.POINTER(ctypes.c_int))
        mode = ctypes.c_int(2)
        assert exchange(ctypes.byref(mode)) == 0
        try:
            return call()
        finally:
            assert exchange(ctypes.byref(mode)) == 0

    def graph_instantiate(self, graph: int) -> int:
        e = ctypes.c_void_p()
        instantiate = self._proc("cuGraphInstantiateWithFlags", 11040,
                                 ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                 ctypes.c_uint64)
        assert self._relaxed(lambda: instantiate(ctypes.byref(e), graph, 0)) == 0
        return e.value

    def graph_launch(self, exec_: int, stream: int) -> int:
        return self._proc("cuGraphLaunch", 10000, ctypes.c_void_p, ctypes.c_void_p)(exec_, stream)

    def graph_destroy(self, graph: int) -> None:
        destroy = self._proc("cuGraphDestroy", 10000, ctypes.c_void_p)
        assert self._relaxed(lambda: destroy(graph)) == 0

    def graph_exec_destroy(self, exec_: int) -> None:
        destroy = self._proc("cuGraphExecDestroy", 10000, ctypes.c_void_p)
        assert self._relaxed(lambda: destroy(exec_)) == 0

    def mem_alloc(self, size: int) -> int:
        alloc = self._proc("cuMemAlloc", 3020, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
        p = ctypes.c_uint64()
        assert alloc(ctypes.byref(p), size) == 0
        return p.value


@pytest.fixture(scope="session")
def driver() -> str:
    return fake_driver_path()


@pytest.fixture(scope="session")
def fake(driver) -> Fake:
    import kpack  # noqa: F401,PLC0415  (kpack loads the driver: cuInit first)
    kpack.open(KERNELS / "testpack", driver=driver)
    return Fake(driver)


@pytest.fixture(scope="session")
def open_pack(driver):
    import kpack  # noqa: PLC0415
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = kpack.open(KERNELS / name, driver=driver)
        return cache[name]
    return get


@pytest.fixture(scope="session")
def layouts():
    """{pack: {kernel: {variant: {param: offset}}}} from the manifests, read with json."""
    def get(pack: str, kernel: str, variant: str) -> dict:
        manifest = json.loads((KERNELS / pack / "manifest.json").read_text())
        k = next(k for k in manifest["kernels"] if k["name"] == kernel)
        v = next(v for v in k["variants"] if v["name"] == variant)
        return {slot["param"]: slot["offset"] for slot in v["layout"]}
    return get
