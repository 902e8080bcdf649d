"""kpack.torch's C++ op implementations (libkpack_torch_ops.so) where torch imports but no
GPU runs: whether register uses them, the fallback to Python implementations and its
warning, and the C++ implementation's checks that need no CUDA tensor. Skipped without
torch (CI has none); the launches themselves are checked on the GPU
(tests/gpu/torch_ops_check.py, section `native`).
"""

from __future__ import annotations

import ctypes
import itertools
import warnings

import pytest

torch = pytest.importorskip("torch")

import kpack  # noqa: E402
import kpack.torch as kt  # noqa: E402
from kpack import _build_config  # noqa: E402

from conftest import KERNELS  # noqa: E402

BUILT = bool(getattr(_build_config, "TORCH_OPS", ""))
_names = itertools.count()


def namespace() -> str:
    return f"kpack_native_test_{next(_names)}"


@pytest.fixture
def open_pack(driver, monkeypatch):
    """Packs of this test's own, registered only for it: kpack.torch's table of
    registrations (which install() routes torch.compile calls through) is restored after."""
    monkeypatch.setattr(kt, "_registered", dict(kt._registered))
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = kpack.open(KERNELS / name, driver=driver)
        return cache[name]
    return get


@pytest.fixture
def native_state(monkeypatch):
    """Lets a test replace what kpack.torch found (restored afterwards)."""
    monkeypatch.setattr(kt, "_native_warned", False)
    monkeypatch.setattr(kt, "_native_state", kt._native_state)
    return monkeypatch


@pytest.mark.skipif(not BUILT, reason="kpack was installed without torch in the build")
def test_register_gives_cpp_implementations_when_the_library_loads(open_pack):
    assert kt.native_ops_available() and kt.native_ops_error() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", kt.NativeOpsWarning)
        ops = kt.register(open_pack("examplepack"), namespace())
    assert ops.native and len(ops._impls) == len(ops.names)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(
        f"{ops.namespace}::vector_add", "CUDA")
    python = kt.register(open_pack("examplepack"), namespace(), native=False)
    assert not python.native and python._impls == []
    assert kt.register(open_pack("examplepack"), ops.namespace) is ops
    assert kt.register(open_pack("examplepack"), ops.namespace, native=True) is ops
    with pytest.raises(ValueError, match="already holds this pack's kernels with C\\+\\+ "
                                         "implementations"):
        kt.register(open_pack("examplepack"), ops.namespace, native=False)
    with pytest.raises(ValueError, match="with Python implementations"):
        kt.register(open_pack("examplepack"), python.namespace, native=True)


@pytest.mark.skipif(BUILT, reason="kpack was installed with torch in the build")
def test_without_the_library_register_warns_and_says_why(open_pack):
    assert not kt.native_ops_available()
    assert "libkpack_torch_ops.so was not built" in kt.native_ops_error()


def test_unavailable_native_ops_fall_back_with_a_warning_once(native_state, open_pack):
    native_state.setattr(kt, "_native_state", "the reason it is missing")
    with pytest.warns(kt.NativeOpsWarning, match="Python implementations.*the reason it is "
                                                 "missing"):
        ops = kt.register(open_pack("examplepack"), namespace())
    assert not ops.native and not kt.native_ops_available()
    assert kt.native_ops_error() == "the reason it is missing"
    with warnings.catch_warnings():
        warnings.simplefilter("error", kt.NativeOpsWarning)  # once per process
        kt.register(open_pack("testpack"), namespace())
    with pytest.raises(RuntimeError, match="unavailable: the reason it is missing"):
        kt.register(open_pack("examplepack"), namespace(), native=True)


def test_another_torch_or_the_switch_turns_them_off(native_state, monkeypatch):
    monkeypatch.setattr(_build_config, "TORCH_OPS_TORCH_VERSION", "0.0.1", raising=False)
    monkeypatch.setattr(_build_config, "TORCH_OPS", "libkpack_torch_ops.so", raising=False)
    reason = kt._load_native()
    assert isinstance(reason, str) and "built against torch 0.0.1" in reason
    assert torch.__version__ in reason
    monkeypatch.setenv("KPACK_TORCH_NATIVE", "0")
    assert kt._load_native() == "turned off by KPACK_TORCH_NATIVE=0"
    monkeypatch.setattr(_build_config, "TORCH_OPS", "", raising=False)
    monkeypatch.setattr(_build_config, "TORCH_OPS_WHY", "torch does not import", raising=False)
    monkeypatch.delenv("KPACK_TORCH_NATIVE")
    reason = kt._load_native()
    assert "not built when kpack was installed (torch does not import)" in reason


@pytest.mark.skipif(not BUILT, reason="kpack was installed without torch in the build")
def test_a_native_entry_of_another_build_is_refused(open_pack):
    native = kt._native()
    fake_api = ctypes.create_string_buffer(64)  # version 0: not this build's table
    error = ctypes.create_string_buffer(256)
    handle = native.lib.kpack_torch_ops_register(
        b"kpack_native_test_abi", b"vector_add", b"CUDA", ctypes.addressof(fake_api),
        open_pack("examplepack").vector_add._native_handle(), error, len(error))
    assert not handle and b"another build" in error.value


@pytest.mark.skipif(not BUILT, reason="kpack was installed without torch in the build")
def test_the_cpp_implementation_refuses_tensors_off_cuda_naming_the_argument(open_pack):
    # Registered for the CPU key here (only a test does), so that a CPU tensor reaches it.
    pack = open_pack("examplepack")
    ns = namespace()
    library = torch.library.Library(ns, "DEF")
    library.define(kt.op_schema(pack.vector_add, "vector_add"))
    native = kt._native()
    handle = native.register(ns, "vector_add", pack.vector_add, dispatch_key="CPU")
    try:
        x = torch.zeros(16)
        with pytest.raises(ValueError, match=r"kernel 'vector_add': argument 0 \('x_ptr', "
                                             r"\*fp32\): the tensor is on cpu; kpack launches "
                                             r"on CUDA devices"):
            getattr(torch.ops, ns).vector_add(x, x, x, 16)
    finally:
        native.release(handle)
    with pytest.raises(NotImplementedError):  # released: no CPU kernel any more
        getattr(torch.ops, ns).vector_add(x, x, x, 16)


@pytest.mark.skipif(not BUILT, reason="kpack was installed without torch in the build")
def test_fake_tensors_go_to_the_python_fake_implementation(open_pack):
    ops = kt.register(open_pack("examplepack"), namespace())
    m = torch.empty(64, device="meta")
    assert ops.vector_add(m, m, m, 64) is None
    assert ops.matmul_tma.default._schema.arguments[0].type.kind() == "TensorType"


@pytest.mark.skipif(not BUILT, reason="kpack was installed without torch in the build")
def test_the_benchmarks_do_nothing_op_takes_its_arguments_and_returns(open_pack):
    pack = open_pack("examplepack")
    ns = namespace()
    library = torch.library.Library(ns, "DEF")
    library.define(kt.op_schema(pack.vector_add, "vector_add"))
    native = kt._native()
    handle = native.register_noop(ns, "vector_add", 5, dispatch_key="CPU")  # 4 + grid
    try:
        x = torch.zeros(16)
        assert getattr(torch.ops, ns).vector_add(x, x, x, 16) is None
        assert getattr(torch.ops, ns).vector_add(x, x, x, 16, grid=[2]) is None
        assert not x.any()
    finally:
        native.release(handle)
    with pytest.raises(RuntimeError, match="registering op .*::vector_add"):
        native.register_noop(ns, "vector_add", 5, dispatch_key="NoSuchKey")
