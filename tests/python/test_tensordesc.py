"""Tensor descriptor arguments (Triton's TensorDescriptor) and flattened tuple parameters,
against the recording fake driver: what cuTensorMapEncodeTiled was asked, the slots of
the launch, and every error path (nothing launched)."""

from __future__ import annotations

import pytest

import kpack
import kpack_testing as _testing

FakeTensor = _testing.FakeTensor
BASE = 0x7F00_0000_0000
FLOAT16 = dict(code=2, bits=16)


def half(i: int, **kw) -> FakeTensor:
    return FakeTensor(BASE + 0x10_0000 * (i + 1), **{**FLOAT16, **kw})


def addr(i: int) -> int:
    return BASE + 0x10_0000 * (i + 1)


class Desc:
    """Duck-typed like triton.tools.tensor_descriptor.TensorDescriptor."""

    def __init__(self, base, shape, strides, block_shape=(1, 1), padding="zero"):
        self.base, self.shape, self.strides = base, shape, strides
        self.block_shape, self.padding = block_shape, padding


def test_descriptors_are_encoded_with_the_variants_block(fake, open_pack, layouts):
    k = open_pack("descpack").copy_tma
    assert [(p.name, p.type) for p in k.params][:2] == [
        ("in_desc", "tensordesc<fp16[64, 128]>"), ("out_desc", "tensordesc<fp16[64, 128]>")]
    mark, encodes = fake.launch_count(), fake.tensor_map_encode_count()
    # block_shape is not read: the variant's [64, 128] is used whatever it says.
    k(Desc(half(0), [100, 200], (256, 1), [16, 16]), Desc(half(1), (100, 200), [200, 1],
                                                          padding="nan"), 100, 200)
    launch = fake.last_launch(mark)
    a, b = fake.tensor_map_encodes_since(encodes)
    assert (a.address, a.dims, a.strides, a.box) == (addr(0), (200, 100), (512,), (64, 64))
    assert (a.data_type, a.swizzle, a.oob_fill, a.ok) == (6, 3, 0, True)
    assert (b.address, b.strides, b.oob_fill) == (addr(1), (400,), 1)  # NaN fill
    off = layouts("descpack", "copy_tma", "default")
    assert launch.grid == (2, 2, 1)
    assert launch.i32(176) == 100 and launch.i32(180) == 200 and launch.i64(184) == 256
    assert launch.i32(off["M"]) == 100


def test_a_triton_tensor_descriptor(fake, open_pack):
    triton_desc = pytest.importorskip("triton.tools.tensor_descriptor")
    k = open_pack("descpack").copy_tma
    # The real class; constructed without __post_init__, which reads torch-only attributes.
    d = object.__new__(triton_desc.TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape, d.padding = half(3), [64, 128], [128, 1], \
        [64, 128], "zero"
    encodes = fake.tensor_map_encode_count()
    k(d, d, 64, 128)
    assert [e.address for e in fake.tensor_map_encodes_since(encodes)] == [addr(3), addr(3)]


@pytest.mark.parametrize("arg, error, pattern", [
    (half(0), TypeError, r"argument 0 \('in_desc', tensordesc<fp16\[64, 128\]>\) expects a "
                         r"tensor descriptor"),
    (Desc(half(0), [2, 100, 200], [1, 200, 1]), ValueError,
     r"the descriptor's shape has 3 dimensions, the parameter's block 2"),
    (Desc(half(0), [100, "x"], [200, 1]), TypeError, r"the descriptor's shape\[1\] is str"),
    (Desc(half(0), [100, 200], [200, 1], padding="ones"), ValueError,
     r"padding must be \"zero\" or \"nan\""),
    (Desc(FakeTensor(addr(0)), [100, 200], [200, 1]), TypeError,
     r"the tensor's dtype is float32 .* compiled for tensordesc<fp16"),
    (Desc(half(0, device_id=1), [100, 200], [200, 1]), ValueError, "cuda:1"),
    (Desc(half(0), [100, 200], [100, 1]), kpack.InvalidArgumentError,
     r"strides\[0\] = 100 elements of 2 bytes is not a multiple of 16 bytes"),
    (Desc(FakeTensor(addr(0) + 8, **FLOAT16), [100, 200], [200, 1]),
     kpack.InvalidArgumentError, r"base 0x[0-9a-f]+ is not 16-byte aligned"),
])
def test_bad_descriptors_raise_and_launch_nothing(fake, open_pack, arg, error, pattern):
    k = open_pack("descpack").copy_tma
    mark = fake.launch_count()
    with pytest.raises(error, match=pattern):
        k(arg, Desc(half(1), [100, 200], [200, 1]), 100, 200)
    assert fake.launch_count() == mark


def test_bind_keeps_descriptors_and_set_re_encodes_one(fake, open_pack):
    k = open_pack("descpack").copy_tma
    encodes = fake.tensor_map_encode_count()
    b = k.bind(Desc(half(0), [64, 128], [128, 1]), Desc(half(1), [64, 128], [128, 1]), 64, 128)
    b()
    b()
    assert len(fake.tensor_map_encodes_since(encodes)) == 2
    b.set("out_desc", Desc(half(2), [64, 128], [128, 1]))
    new = fake.tensor_map_encodes_since(encodes)[2:]
    assert [e.address for e in new] == [addr(2)]
    with pytest.raises(kpack.InvalidArgumentError, match="last dimension must be contiguous"):
        b.set(1, Desc(half(3), [64, 128], [128, 2]))
    mark = fake.launch_count()
    b()
    assert fake.last_launch(mark).i32(176) == 64


def test_tuple_parameters_take_their_elements_flattened(fake, open_pack, layouts):
    k = open_pack("descpack").axpy_pair
    assert [p.name for p in k.params] == ["ptrs.0", "ptrs.1", "n", "coefs.0", "coefs.1", "BLOCK"]
    mark = fake.launch_count()
    k(FakeTensor(addr(0)), FakeTensor(addr(1)), 4096, 2.0, 0.5)
    launch = fake.last_launch(mark)
    off = layouts("descpack", "axpy_pair", "default")
    assert launch.u64(off["ptrs.1"]) == addr(1) and launch.f32(off["coefs.0"]) == 2.0
    assert launch.grid == (4, 1, 1)
