"""Tensor-like objects from outside kpack: a DLPack exchange table built with ctypes from the
layout in DLPack's dlpack.h (v1.3), independently of src/python/dlpack.h; objects with
only data_ptr(), with data_ptr() and __dlpack_device__(), and with only __dlpack__()."""

from __future__ import annotations

import ctypes

import pytest

import kpack

BASE = 0x7E00_0000_0000
kDLCPU, kDLCUDA = 1, 2


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class Header(ctypes.Structure):
    pass


Header._fields_ = [("version", DLPackVersion), ("prev_api", ctypes.POINTER(Header))]

FROM_PY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))
STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32,
                          ctypes.POINTER(ctypes.c_void_p))


class ExchangeAPI(ctypes.Structure):
    _fields_ = [("header", Header), ("managed_tensor_allocator", ctypes.c_void_p),
                ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
                ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
                ("dltensor_from_py_object_no_sync", FROM_PY),
                ("current_work_stream", STREAM)]


assert ctypes.sizeof(DLTensor) == 48 and ctypes.sizeof(ExchangeAPI) == 56

# A capsule keeps a pointer to its name: the names must outlive the capsules.
EXCHANGE_NAME = b"dlpack_exchange_api"
DLTENSOR_NAME = b"dltensor"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

calls = {"from_py": 0, "stream": 0}
current_stream = {"value": 0}


@FROM_PY
def _from_py(obj, out):
    calls["from_py"] += 1
    t = out.contents
    t.data = obj.base
    t.byte_offset = obj.offset
    t.device = DLDevice(kDLCUDA, 0)
    t.ndim = 0
    t.dtype = DLDataType(*obj.dtype)
    return 0


@STREAM
def _stream(device_type, device_id, out):
    calls["stream"] += 1
    out[0] = current_stream["value"]
    return 0


_API = ExchangeAPI()
_API.header.version = DLPackVersion(1, 3)
_API.dltensor_from_py_object_no_sync = _from_py
_API.current_work_stream = _stream
# A newer major version in front, pointing back at the 1.x table, as a producer serving
# several versions would: kpack must walk to the one it understands.
_NEWER = ExchangeAPI()
_NEWER.header.version = DLPackVersion(2, 0)
_NEWER.header.prev_api = ctypes.pointer(_API.header)


class CtypesTensor:
    """A tensor type with a ctypes exchange table (version 2.0 linking to 1.3)."""
    __dlpack_c_exchange_api__ = _capsule_new(ctypes.addressof(_NEWER), EXCHANGE_NAME, None)

    def __init__(self, base, offset=0, dtype=(2, 32, 1)):
        self.base, self.offset, self.dtype = base, offset, dtype


def test_ctypes_exchange_table_pointer_offset_dtype_and_stream(fake, open_pack, layouts):
    k = open_pack("examplepack").vector_add
    off = layouts("examplepack", "vector_add", "div16")
    s = fake.stream_create()
    current_stream["value"] = s
    calls.update(from_py=0, stream=0)
    mark = fake.launch_count()
    k(CtypesTensor(BASE, 0x100), CtypesTensor(BASE + 0x1000), CtypesTensor(BASE + 0x2000), 64)
    launch = fake.last_launch(mark)
    assert launch.u64(off["x_ptr"]) == BASE + 0x100  # data + byte_offset
    assert launch.u64(off["y_ptr"]) == BASE + 0x1000
    assert launch.stream == s
    assert calls == {"from_py": 3, "stream": 1}
    with pytest.raises(TypeError, match=r"'y_ptr', \*fp32\): the tensor's dtype is bfloat16"):
        k(CtypesTensor(BASE), CtypesTensor(BASE, dtype=(4, 16, 1)), CtypesTensor(BASE), 64)


class DataPtrOnly:
    def __init__(self, ptr):
        self.ptr = ptr
        self.calls = 0

    def data_ptr(self):
        self.calls += 1
        return self.ptr


class DataPtrWithDevice(DataPtrOnly):
    def __init__(self, ptr, device):
        super().__init__(ptr)
        self.device = device

    def __dlpack_device__(self):
        return self.device


def test_data_ptr_objects(fake, open_pack, layouts):
    k = open_pack("examplepack").vector_add
    off = layouts("examplepack", "vector_add", "div16")
    x = DataPtrOnly(BASE + 0x4000)
    y = DataPtrWithDevice(BASE + 0x5000, (kDLCUDA, 0))
    mark = fake.launch_count()
    k(x, y, x, 64)
    launch = fake.last_launch(mark)
    assert (launch.u64(off["x_ptr"]), launch.u64(off["y_ptr"])) == (BASE + 0x4000, BASE + 0x5000)
    assert launch.stream == 0 and x.calls == 2
    mark = fake.launch_count()
    with pytest.raises(ValueError, match=r"'y_ptr', \*fp32\): the tensor is on the CPU"):
        k(x, DataPtrWithDevice(BASE, (kDLCPU, 0)), x, 64)
    with pytest.raises(ValueError, match=r"cuda:3 but the current device is cuda:0"):
        k(x, DataPtrWithDevice(BASE, (kDLCUDA, 3)), x, 64)

    class BadPtr:
        def data_ptr(self):
            return "nope"

    with pytest.raises(TypeError, match=r"data_ptr\(\) returned str"):
        k(x, BadPtr(), x, 64)
    assert fake.launch_count() == mark


class DLPackOnly:
    """Exports a legacy "dltensor" capsule whose deleter counts its calls."""
    deleted = 0

    def __init__(self, ptr, device=(kDLCUDA, 0), dtype=(2, 32, 1)):
        self.ptr, self.device, self.dtype = ptr, device, dtype
        self.streams = []

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        managed = DLManagedTensor()
        managed.dl_tensor.data = self.ptr
        managed.dl_tensor.device = DLDevice(*self.device)
        managed.dl_tensor.dtype = DLDataType(*self.dtype)
        managed.deleter = _deleter
        _keep[ctypes.addressof(managed)] = managed
        destructor = _CAPSULE_DESTRUCTOR(_capsule_destructor)
        _keep[id(destructor)] = destructor
        return _capsule_new(ctypes.addressof(managed), DLTENSOR_NAME,
                            ctypes.cast(destructor, ctypes.c_void_p))


_keep = {}
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


def _capsule_destructor(capsule):
    # An unconsumed capsule deletes its tensor (the protocol's producer side).
    if _capsule_is_valid(capsule, DLTENSOR_NAME):
        managed = ctypes.cast(_capsule_get_pointer(capsule, DLTENSOR_NAME),
                              ctypes.POINTER(DLManagedTensor))
        managed.contents.deleter(managed)


@DELETER
def _deleter(managed):
    DLPackOnly.deleted += 1
    _keep.pop(ctypes.addressof(managed.contents), None)


def test_dlpack_only_objects(fake, open_pack, layouts):
    k = open_pack("examplepack").vector_add
    off = layouts("examplepack", "vector_add", "div16")
    x = DLPackOnly(BASE + 0x8000)
    DLPackOnly.deleted = 0
    mark = fake.launch_count()
    k(x, x, x, 64)
    assert fake.last_launch(mark).u64(off["out_ptr"]) == BASE + 0x8000
    assert x.streams == [None, None, None] and DLPackOnly.deleted == 3  # read, not kept
    s = fake.stream_create()
    mark = fake.launch_count()
    k(x, x, x, 64, stream=s)
    assert fake.last_launch(mark).stream == s and x.streams[-1] == s  # the consumer's stream
    mark = fake.launch_count()
    with pytest.raises(ValueError, match=r"'x_ptr', \*fp32\): the tensor is on the CPU"):
        k(DLPackOnly(BASE, device=(kDLCPU, 0)), x, x, 64)
    with pytest.raises(TypeError, match=r"dtype is int32"):
        k(DLPackOnly(BASE, dtype=(0, 32, 1)), x, x, 64)
    assert fake.launch_count() == mark


def test_objects_with_nothing_to_offer(open_pack):
    k = open_pack("examplepack").vector_add
    with pytest.raises(TypeError, match=r"'x_ptr', \*fp32\) expects a CUDA tensor.*got object"):
        k(object(), 0, 0, 64)
    assert isinstance(kpack.InvalidArgumentError("x"), ValueError)
