"""kpack.torch without torch: the op schemas made from the manifests (torch itself only
checks them on the GPU machine, tests/gpu/torch_ops_check.py), and the grid= keyword the
op implementation relies on (torch passes the op's grid argument as `grid=[...]`)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

import kpack
import kpack.torch as kt
import kpack_testing as _testing


def test_importing_kpack_torch_does_not_import_torch():
    script = "import sys, kpack, kpack.torch; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr


def test_schemas_of_the_example_pack(open_pack):
    pack = open_pack("examplepack")
    assert kt.op_schema(pack.vector_add) == (
        "vector_add(Tensor x_ptr, Tensor y_ptr, Tensor(a!) out_ptr, SymInt n, *, "
        "SymInt[]? grid=None) -> ()")
    # Every written pointer its own alias set; no grid expressions: the grid is required.
    assert kt.op_schema(pack.layer_norm_fwd) == (
        "layer_norm_fwd(Tensor X, Tensor(a!) Y, Tensor W, Tensor B, Tensor(b!) Mean, "
        "Tensor(c!) Rstd, SymInt stride_x_row, SymInt stride_y_row, SymInt N, float eps, *, "
        "SymInt[] grid) -> ()")
    assert kt.op_schema(pack.matmul_fp16, "mm").startswith(
        "mm(Tensor a_ptr, Tensor b_ptr, Tensor(a!) c_ptr, SymInt M,")


def test_scalar_types_and_pointers_without_readonly(open_pack):
    # A kpack/1 pack has no readonly: every pointer may be written.
    assert kt.op_schema(open_pack("testpack").scalars) == (
        "scalars(Tensor(a!) x_ptr, Tensor(b!) out_ptr, SymInt n, float alpha, float beta, "
        "float gamma, bool flag, SymInt big, *, SymInt[] grid) -> ()")


def test_descriptors_and_tuple_elements(open_pack):
    # A tensordesc parameter takes a tensor (described whole); a tuple element `ptrs.0` is
    # argument `ptrs_0`.
    desc = open_pack("descpack")
    assert kt.op_schema(desc.copy_tma) == (
        "copy_tma(Tensor(a!) in_desc, Tensor(b!) out_desc, SymInt M, SymInt N, *, "
        "SymInt[]? grid=None) -> ()")
    assert kt.op_schema(desc.axpy_pair) == (
        "axpy_pair(Tensor(a!) ptrs_0, Tensor(b!) ptrs_1, SymInt n, float coefs_0, "
        "float coefs_1, *, SymInt[]? grid=None) -> ()")
    clash = SimpleNamespace(name="k", grid=(), params=[param("p.0", "*fp32"),
                                                       param("p_0", "*fp32")])
    with pytest.raises(ValueError, match="'p.0' and parameter 'p_0'"):
        kt.op_schema(clash)


class StandInTensor:
    """What the op implementation reads of a torch tensor: shape and stride() to describe
    it, data_ptr() for the descriptor's base."""

    def __init__(self, address, shape):
        self.shape = shape
        self._address = address

    def data_ptr(self):
        return self._address

    def stride(self):
        return (self.shape[1], 1)


def test_op_implementation_describes_whole_tensors(fake, open_pack):
    k = open_pack("descpack").copy_tma
    impl = kt._whole_tensor_descriptors(k, [0, 1])
    fake.use_primary_context()
    a = StandInTensor(0x7F00_0010_0000, (100, 200))
    b = StandInTensor(0x7F00_0020_0000, (100, 200))
    mark, encodes = fake.launch_count(), fake.tensor_map_encode_count()
    impl(a, b, 100, 200, grid=None)
    assert fake.launch_count() == mark + 1
    got = fake.tensor_map_encodes_since(encodes)
    assert [(e.address, e.dims, e.strides) for e in got] == [
        (0x7F00_0010_0000, (200, 100), (400,)), (0x7F00_0020_0000, (200, 100), (400,))]
    assert all(e.oob_fill == 0 and e.ok for e in got)  # zero padding


def param(name, type_, constexpr=False, readonly=False):
    return SimpleNamespace(name=name, type=type_, constexpr=constexpr, readonly=readonly)


def test_names_and_refusals():
    assert kt.op_name("attention.fwd") == "attention_fwd"
    assert kt.op_name("2mm") == "_2mm"
    many = SimpleNamespace(name="k", grid=("n",),
                           params=[param(f"p{i}", "*fp32") for i in range(28)])
    schema = kt.op_schema(many)
    assert "Tensor(z!) p25" in schema and "Tensor(a1!) p26" in schema
    for bad, match in [(param("grid", "i32"), "clashes with the op's grid= keyword"),
                       (param("desc", "nvTmaDesc"), "nvTmaDesc, which a torch op schema"),
                       (param("t", "i32[2]"), "i32\\[2\\], which a torch op schema"),
                       (param("lambda", "i32"), "Python keyword")]:
        with pytest.raises(ValueError, match=match):
            kt.op_schema(SimpleNamespace(name="k", grid=(), params=[bad]))


def test_grid_keyword_is_kernel_subscript(fake, open_pack):
    k = open_pack("testpack").add
    t = [_testing.FakeTensor(0x7F00_0000_0000 + 0x10_0000 * i) for i in (1, 2, 3)]
    for grid, expected in [([3], (3, 1, 1)), ((2, 5), (2, 5, 1)), (lambda meta: (9,), (9, 1, 1))]:
        mark = fake.launch_count()
        k(*t, 64, grid=grid)
        assert fake.last_launch(mark).grid == expected
    mark = fake.launch_count()
    with pytest.raises(kpack.FailedPreconditionError, match="no grid expression"):
        k(*t, 64, grid=None)
    with pytest.raises(TypeError, match="grid given twice"):
        k[(1,)](*t, 64, grid=[2])
    with pytest.raises(TypeError, match="grid given twice"):
        k[(1,)].bind(*t, 64, grid=[2])
    assert fake.launch_count() == mark
    b = k.bind(*t, 64, grid=(4, 2))
    b()
    assert fake.last_launch(mark).grid == (4, 2, 1)
