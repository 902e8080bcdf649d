"""The kpack Python extension against the recording fake driver: launches, argument
conversion, dispatch, grids, streams, bound launches and every error path.

Tensors are stand-ins: kpack_testing.FakeTensor (a test-only module) carries a C DLPack exchange table
on its type, as torch.Tensor does (test_dlpack.py checks the table's layout against an
independent ctypes producer). Outputs are the parameter buffers the fake driver recorded,
decoded at the offsets the manifests give.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys

import pytest

import kpack
import kpack_testing as _testing

from conftest import KERNELS

FakeTensor = _testing.FakeTensor
FLOAT16 = dict(code=2, bits=16)
BASE = 0x7F00_0000_0000


def tensor(i: int, **kw) -> FakeTensor:
    """A CUDA float32 stand-in at a 256-aligned address (so div16 holds)."""
    return FakeTensor(BASE + 0x10_0000 * (i + 1), **kw)


def addr(t) -> int:
    return BASE + 0x10_0000 * (t + 1)


# ---------------------------------------------------------------- opening


def test_open_lists_kernels_and_caches_them(open_pack):
    pack = open_pack("examplepack")
    assert pack.kernel_names == ["vector_add", "softmax", "layer_norm", "matmul_fp16",
                                 "matmul_bf16", "layer_norm_fwd", "layer_norm_bwd",
                                 "matmul_tma", "attention_fwd", "attention_fwd_causal"]
    assert list(pack) == pack.kernel_names and len(pack) == 10 and "softmax" in pack
    k = pack["vector_add"]
    assert pack.vector_add is k and pack["vector_add"] is k
    assert isinstance(k, kpack.Kernel) and k.name == "vector_add"
    assert repr(k) == "<kpack kernel 'vector_add'(x_ptr, y_ptr, out_ptr, n)>"


def test_unknown_kernel_is_key_error_and_attribute_error(open_pack):
    pack = open_pack("examplepack")
    with pytest.raises(KeyError, match="nosuch.*examplepack"):
        pack["nosuch"]
    assert not hasattr(pack, "nosuch")
    with pytest.raises(AttributeError, match="nosuch"):
        pack.nosuch  # noqa: B018


def test_open_errors_carry_status_codes(driver, tmp_path):
    with pytest.raises(kpack.NotFoundError) as e:
        kpack.open(tmp_path / "missing", driver=driver)
    assert e.value.code == "NOT_FOUND" and isinstance(e.value, LookupError)
    assert isinstance(e.value, kpack.Error) and isinstance(e.value, RuntimeError)
    with pytest.raises(kpack.UnavailableError, match="no_such_driver.so") as e:
        kpack.open(KERNELS / "testpack", driver=str(tmp_path / "no_such_driver.so"))
    assert e.value.code == "UNAVAILABLE"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text('{"format": "kpack/1", "kernels": 3}')
    with pytest.raises(kpack.InvalidArgumentError, match="kernels") as e:
        kpack.open(tmp_path / "bad", driver=driver)
    assert e.value.code == "INVALID_ARGUMENT" and isinstance(e.value, ValueError)


# ---------------------------------------------------------------- introspection


def test_params_list_every_parameter_with_its_triton_type(open_pack):
    params = open_pack("examplepack").layer_norm.params
    assert [(p.name, p.type, p.constexpr) for p in params] == [
        ("x_ptr", "*fp16", False), ("y_ptr", "*fp16", False), ("w_ptr", "*fp16", False),
        ("b_ptr", "*fp16", False), ("stride", "i32", False), ("M", "i32", False),
        ("N", "i32", False), ("eps", "fp32", False), ("BLOCK", "constexpr", True)]
    assert isinstance(params[0], kpack.Param)


def test_variants_describe_buckets_assumptions_and_launch_metadata(open_pack):
    variants = {v.name: v for v in open_pack("examplepack").matmul_fp16.variants}
    assert sorted(variants) == sorted(f"b{i}_{s}" for i in range(4) for s in ("generic", "contig"))
    b1 = variants["b1_contig"]
    assert b1.bucket == {"M": (17, 64)}
    assert variants["b0_generic"].bucket == {"M": (None, 16)}
    assert variants["b3_generic"].bucket == {"M": (257, None)}
    assert b1.assumptions["stride_ak"] == ("eq1",) and b1.assumptions["a_ptr"] == ("div16",)
    assert variants["b1_generic"].assumptions == {}
    # The tuned config is the manifest's (kernels/examplepack was tuned on the H200).
    manifest = json.loads((KERNELS / "examplepack" / "manifest.json").read_text())
    m1 = next(v for k in manifest["kernels"] if k["name"] == "matmul_fp16"
              for v in k["variants"] if v["name"] == "b1_contig")
    assert (b1.num_warps, b1.num_ctas, b1.num_stages) == \
        (m1["num_warps"], m1.get("num_ctas", 1), m1["num_stages"])
    assert b1.constexprs == m1["constexprs"] and set(b1.constexprs) == {"BLOCK_M", "BLOCK_N",
                                                                         "BLOCK_K"}
    assert variants["b1_generic"].constexprs == b1.constexprs  # one config per bucket
    assert b1.arch == 90 and b1.arg_types[0] == "*fp16"
    assert open_pack("examplepack").matmul_fp16.grid == ("cdiv(M, BLOCK_M)", "cdiv(N, BLOCK_N)")
    assert open_pack("testpack").add.grid == ()


# ---------------------------------------------------------------- launching


def test_eager_launch_packs_arguments_at_the_manifest_offsets(fake, open_pack, layouts):
    k = open_pack("examplepack").vector_add
    x, y, out = tensor(0), tensor(1), tensor(2)
    mark = fake.launch_count()
    assert k(x, y, out, 5000) is None
    launch = fake.last_launch(mark)
    off = layouts("examplepack", "vector_add", "generic")  # the div16 variant: n % 16 != 0
    assert launch.grid == (math.ceil(5000 / 1024), 1, 1) and launch.block == (128, 1, 1)
    assert launch.u64(off["x_ptr"]) == addr(0) and launch.u64(off["y_ptr"]) == addr(1)
    assert launch.u64(off["out_ptr"]) == addr(2) and launch.i32(off["n"]) == 5000
    assert k.stats()["generic"].launches >= 1


def test_dispatch_picks_the_specialized_variant_and_counts_fallbacks(fake, open_pack):
    k = open_pack("examplepack").vector_add
    before = k.stats()
    k(tensor(0), tensor(1), tensor(2), 4096)           # everything divisible by 16
    k(FakeTensor(BASE + 4), tensor(1), tensor(2), 4096)  # x misaligned: the generic variant
    after = k.stats()
    assert after["div16"].launches == before["div16"].launches + 1
    assert after["generic"].launches == before["generic"].launches + 1
    assert after["generic"].fallback_launches == before["generic"].fallback_launches + 1
    assert isinstance(after["div16"], kpack.VariantStats)
    assert k.select_variant(tensor(0), tensor(1), tensor(2), 4096) == "div16"
    assert k.select_variant(tensor(0), tensor(1), tensor(2), 4095) == "generic"


def test_raw_int_pointers_and_keyword_arguments(fake, open_pack, layouts):
    k = open_pack("examplepack").vector_add
    off = layouts("examplepack", "vector_add", "div16")
    mark = fake.launch_count()
    k(addr(3), y_ptr=addr(4), n=64, out_ptr=tensor(5))
    launch = fake.last_launch(mark)
    assert [launch.u64(off[p]) for p in ("x_ptr", "y_ptr", "out_ptr")] == [addr(3), addr(4),
                                                                           addr(5)]
    assert launch.i32(off["n"]) == 64


def test_scalar_conversions(fake, open_pack, layouts):
    k = open_pack("testpack").scalars
    off = layouts("testpack", "scalars", "default")
    mark = fake.launch_count()
    k[(1,)](tensor(0), tensor(1), 256, 1.5, -2.0, 0.1, True, -(2**40))
    launch = fake.last_launch(mark)
    assert launch.f32(off["alpha"]) == 1.5
    assert launch.u16(off["beta"]) == 0xC000                      # bf16 -2.0
    assert launch.u16(off["gamma"]) == struct.unpack("<H", struct.pack("<e", 0.1))[0]
    assert launch.u8(off["flag"]) == 1
    assert launch.i64(off["big"]) == -(2**40)
    mark = fake.launch_count()
    k[(1,)](tensor(0), tensor(1), 256, 3, 0, 1, False, 7)        # ints where floats go
    launch = fake.last_launch(mark)
    assert launch.f32(off["alpha"]) == 3.0 and launch.u8(off["flag"]) == 0


@pytest.mark.parametrize("args, error, pattern", [
    ((tensor(0), tensor(1), 256, 1.0, 1.0, 1.0, 1, 7), TypeError,
     r"argument 6 \('flag', i1\) expects a bool; got int"),
    ((tensor(0), tensor(1), 256, "1", 1.0, 1.0, True, 7), TypeError,
     r"argument 3 \('alpha', fp32\) expects a float; got str"),
    ((tensor(0), tensor(1), 256.0, 1.0, 1.0, 1.0, True, 7), TypeError,
     r"argument 2 \('n', i32\) expects an int; got float"),
    ((tensor(0), tensor(1), True, 1.0, 1.0, 1.0, True, 7), TypeError,
     r"argument 2 \('n', i32\) expects an int; got bool"),
    ((tensor(0), tensor(1), 256, 1.0, 1.0, 1.0, True, 2**63), ValueError,
     r"argument 7 \('big'\) expects i64, got an unsigned integer 9223372036854775808"),
    ((tensor(0), tensor(1), 256, 1.0, 1.0, 1.0, True, -(2**64)), ValueError,
     r"argument 7 \('big', i64\): -18446744073709551616 does not fit a 64-bit integer"),
    ((tensor(0), tensor(1), 2**31, 1.0, 1.0, 1.0, True, 7), ValueError,
     r"argument 2 \('n'\) expects i32, got a signed integer 2147483648 that does not fit"),
    ((tensor(0), -1, 256, 1.0, 1.0, 1.0, True, 7), ValueError,
     r"argument 1 \('out_ptr', \*fp32\): the int -1 is not a device address"),
    ((tensor(0), None, 256, 1.0, 1.0, 1.0, True, 7), TypeError,
     r"argument 1 \('out_ptr', \*fp32\) expects a CUDA tensor .* got NoneType"),
    ((tensor(0), 3.0, 256, 1.0, 1.0, 1.0, True, 7), TypeError, r"'out_ptr'.* got float"),
    ((tensor(0), tensor(1), 256, 1.0, 1.0, 1.0, True), TypeError,
     r"kernel 'scalars' takes 8 arguments \(x_ptr, out_ptr, n, alpha, beta, gamma, flag, big\), "
     r"got 7"),
    ((tensor(0), tensor(1), 256, 1.0, 1.0, 1.0, True, 7, 8), TypeError, r"takes 8 arguments"),
    ((tensor(0, device_type=1), tensor(1), 256, 1.0, 1.0, 1.0, True, 7), ValueError,
     r"argument 0 \('x_ptr', \*fp32\): the tensor is on the CPU"),
    ((tensor(0, device_type=3), tensor(1), 256, 1.0, 1.0, 1.0, True, 7), ValueError,
     r"the tensor is in pinned host memory"),
    ((tensor(0), tensor(1, device_id=1), 256, 1.0, 1.0, 1.0, True, 7), ValueError,
     r"argument 1 \('out_ptr', \*fp32\): the tensor is on cuda:1 but the current device is "
     r"cuda:0"),
    ((tensor(0, **FLOAT16), tensor(1), 256, 1.0, 1.0, 1.0, True, 7), TypeError,
     r"argument 0 \('x_ptr', \*fp32\): the tensor's dtype is float16 .* compiled for \*fp32"),
    ((tensor(0, lanes=4), tensor(1), 256, 1.0, 1.0, 1.0, True, 7), TypeError, r"4 lanes"),
])
def test_bad_arguments_raise_naming_the_parameter_and_launch_nothing(fake, open_pack, args,
                                                                     error, pattern):
    k = open_pack("testpack").scalars[(1,)]
    mark = fake.launch_count()
    with pytest.raises(error, match=pattern) as e:
        k(*args)
    if issubclass(error, ValueError):
        assert isinstance(e.value, kpack.InvalidArgumentError)
        assert e.value.code == "INVALID_ARGUMENT"
    assert "kernel 'scalars'" in str(e.value)
    assert fake.launch_count() == mark


def test_no_valid_variant_is_a_value_error(fake, open_pack):
    k = open_pack("examplepack").vector_add
    mark = fake.launch_count()
    with pytest.raises(kpack.InvalidArgumentError, match="'n'"):
        k(tensor(0), tensor(1), tensor(2), 2**40)  # no i64 variant
    assert fake.launch_count() == mark


def test_keyword_errors(open_pack):
    k = open_pack("examplepack").vector_add
    x = tensor(0)
    with pytest.raises(TypeError, match=r"'BLOCK' is a constexpr"):
        k(x, x, x, 16, BLOCK=1024)
    with pytest.raises(TypeError, match=r"launch options are fixed per variant"):
        k(x, x, x, 16, num_warps=8)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'z'.*x_ptr, y_ptr, out_ptr, n"):
        k(x, x, x, 16, z=1)
    with pytest.raises(TypeError, match=r"multiple values for argument 'x_ptr'"):
        k(x, x, x, 16, x_ptr=x)
    with pytest.raises(TypeError, match=r"missing 'n'"):
        k(x, x, out_ptr=x)


# ---------------------------------------------------------------- grids


def test_explicit_grids(fake, open_pack):
    k = open_pack("testpack").add
    x = tensor(0)
    for grid, expected in [((3,), (3, 1, 1)), (7, (7, 1, 1)), ((2, 3), (2, 3, 1)),
                           ([4, 5, 6], (4, 5, 6))]:
        mark = fake.launch_count()
        k[grid](x, x, x, 1024)
        assert fake.last_launch(mark).grid == expected
    mark = fake.launch_count()
    k[(0,)](x, x, x, 1024)  # an empty grid launches nothing, like Triton
    assert fake.launch_count() == mark
    assert isinstance(k[(1,)], kpack.GridLaunch)


@pytest.mark.parametrize("grid, error, pattern", [
    ((), ValueError, "1 to 3 axes"), ((1, 2, 3, 4), ValueError, "1 to 3 axes"),
    ((-1,), ValueError, r"axis 0 is -1"), ((2**32,), ValueError, r"outside \[0, 2\*\*32\)"),
    ((1.5,), TypeError, "axis 0 is float"), ("abc", TypeError, "axis 0 is str"),
    ((True,), TypeError, "axis 0 is bool"),
])
def test_bad_grids(open_pack, grid, error, pattern):
    with pytest.raises(error, match=pattern):
        open_pack("testpack").add[grid]


def test_callable_grid_gets_arguments_constexprs_and_options(fake, open_pack):
    k = open_pack("examplepack").matmul_fp16
    a = tensor(0, **FLOAT16)
    seen = {}

    def grid(meta):
        seen.update(meta)
        return (math.ceil(meta["M"] / meta["BLOCK_M"]), math.ceil(meta["N"] / meta["BLOCK_N"]))

    mark = fake.launch_count()
    k[grid](a, a, a, 100, 256, 64, 64, 1, 256, 1, 256, 1)  # M=100: bucket 2, BLOCK_M 64
    assert fake.last_launch(mark).grid == (2, 4, 1)
    assert seen["a_ptr"] is a and seen["M"] == 100 and seen["stride_cn"] == 1
    assert (seen["BLOCK_M"], seen["BLOCK_N"], seen["BLOCK_K"]) == (64, 64, 32)
    assert (seen["num_warps"], seen["num_ctas"]) == (4, 1)


def test_callable_grid_errors_propagate(fake, open_pack):
    k = open_pack("examplepack").vector_add
    x = tensor(0)
    mark = fake.launch_count()
    with pytest.raises(ZeroDivisionError):
        k[lambda meta: (1 // 0,)](x, x, x, 16)
    with pytest.raises(TypeError, match="axis 0 is str"):
        k[lambda meta: ("1",)](x, x, x, 16)
    assert fake.launch_count() == mark


def test_grid_expressions_and_their_absence(fake, open_pack):
    mm = open_pack("examplepack").matmul_fp16
    a = tensor(0, **FLOAT16)
    mark = fake.launch_count()
    mm(a, a, a, 300, 512, 64, 64, 1, 512, 1, 512, 1)  # bucket 3: 128x128 blocks
    assert fake.last_launch(mark).grid == (3, 4, 1)
    x = tensor(0)
    with pytest.raises(kpack.FailedPreconditionError) as e:
        open_pack("testpack").add(x, x, x, 16)  # no grid expressions in the manifest
    assert e.value.code == "FAILED_PRECONDITION"


# ---------------------------------------------------------------- streams


def test_stream_defaults_to_the_producers_current_stream(fake, open_pack):
    k = open_pack("examplepack").vector_add
    s = fake.stream_create()
    _testing.set_current_stream(s)
    try:
        _testing.reset_counters()
        mark = fake.launch_count()
        k(tensor(0), tensor(1), tensor(2), 64)
        assert fake.last_launch(mark).stream == s
        # One stream query per launch, one table read per tensor; no Python-level call.
        assert _testing.counters()["current_work_stream"] == 1
        assert _testing.counters()["dltensor_from_py_object"] == 3
    finally:
        _testing.set_current_stream(0)


def test_explicit_streams(fake, open_pack):
    k = open_pack("examplepack").vector_add
    s = fake.stream_create()

    class TorchLike:
        cuda_stream = s

    class Protocol:
        def __cuda_stream__(self):
            return (0, s)

    for stream in (s, TorchLike(), Protocol()):
        mark = fake.launch_count()
        k(tensor(0), tensor(1), tensor(2), 64, stream=stream)
        assert fake.last_launch(mark).stream == s
    mark = fake.launch_count()
    k(tensor(0), tensor(1), tensor(2), 64, stream=None)
    assert fake.last_launch(mark).stream == 0
    with pytest.raises(TypeError, match="stream= takes"):
        k(tensor(0), tensor(1), tensor(2), 64, stream="s")
    with pytest.raises(ValueError, match="stream handle"):
        k(tensor(0), tensor(1), tensor(2), 64, stream=-1)


def run_with_a_current_stream(driver, body):
    """Runs `body` in a child process (kpack remembers torch once it has seen it) after a
    preamble that opens examplepack as `pack` on the fake driver (`fake`) and sets `s` as
    the current stream that FakeTensor's exchange table reports; `body` prints "ok"."""
    script = f"""
import sys, types
import kpack
sys.path.insert(0, {str(KERNELS.parent / 'tests' / 'python')!r})
from conftest import Fake
import kpack_testing as _testing
pack = kpack.open({str(KERNELS / 'examplepack')!r}, driver={driver!r})
fake = Fake({driver!r})
s = fake.stream_create()
_testing.set_current_stream(s)
""" + body
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_raw_pointers_without_torch_use_the_legacy_default_stream(driver):
    # In a child process, where torch is not imported whatever this one imported.
    run_with_a_current_stream(driver, """
assert "torch" not in sys.modules
mark = fake.launch_count()
pack.vector_add(1 << 20, 2 << 20, 3 << 20, 64)
assert fake.last_launch(mark).stream == 0
print("ok")
""")


def test_with_torch_imported_raw_pointers_use_torchs_current_stream(driver):
    # The stand-in "torch" module's Tensor is FakeTensor.
    run_with_a_current_stream(driver, """
mark = fake.launch_count()
pack.vector_add(1 << 20, 2 << 20, 3 << 20, 64)
assert fake.last_launch(mark).stream == 0, "torch not imported yet: legacy stream"
torch = types.ModuleType("torch")
torch.Tensor = _testing.FakeTensor
sys.modules["torch"] = torch
mark = fake.launch_count()
pack.vector_add(1 << 20, 2 << 20, 3 << 20, 64)
assert fake.last_launch(mark).stream == s, "torch imported: its current stream"
print("ok")
""")


def test_raw_pointers_wait_for_torch_to_initialize_cuda_before_asking_its_stream(driver):
    # A stand-in torch whose torch.cuda has not initialized CUDA: its current stream is the
    # legacy default stream, and kpack must not ask for it (in real torch that initializes
    # CUDA, and raises where torch cannot use the GPU). The stand-in's exchange table
    # reports `s` (and counts the calls) so that asking would show.
    run_with_a_current_stream(driver, """
torch = types.ModuleType("torch")
torch.Tensor = _testing.FakeTensor
cuda = types.ModuleType("torch.cuda")
cuda._initialized = False
torch.cuda = cuda
sys.modules["torch"] = torch
sys.modules["torch.cuda"] = cuda
def launch_stream(x=1 << 20):
    mark = fake.launch_count()
    pack.vector_add(x, 2 << 20, 3 << 20, 64)
    return fake.last_launch(mark).stream
def asked():
    return _testing.counters()["current_work_stream"]
before = asked()
assert launch_stream() == 0, "torch has not initialized CUDA: the legacy default stream"
assert launch_stream() == 0
assert asked() == before, "torch was asked for its stream"
assert launch_stream(_testing.FakeTensor(1 << 20)) == s, "a tensor's own library is asked"
cuda._initialized = True
assert launch_stream() == s, "torch initialized CUDA: its current stream"
cuda._initialized = False  # torch never goes back; kpack no longer looks
assert launch_stream() == s
print("ok")
""")


# ---------------------------------------------------------------- bound launches


def test_bind_launches_and_set_rewrites_one_argument(fake, open_pack, layouts):
    k = open_pack("dispatchpack").axpy
    x, y, out = tensor(0), tensor(1), tensor(2)
    b = k.bind(x, y, out, 4096, 1, 2.0)
    assert isinstance(b, kpack.BoundLaunch) and b.kernel is k
    assert b.args == (x, y, out, 4096, 1, 2.0)
    mark = fake.launch_count()
    b()
    b()
    launches = fake.launches_since(mark)
    off = layouts("dispatchpack", "axpy", "b0_div16_unit")
    assert len(launches) == 2 and launches[0].params == launches[1].params
    assert launches[0].grid == (16, 1, 1) and launches[0].f32(off["alpha"]) == 2.0
    b.set("alpha", 0.5)
    b.set(3, 5000)  # n: bucket 1 (BLOCK 1024), and no longer div16
    mark = fake.launch_count()
    b()
    launch = fake.last_launch(mark)
    off = layouts("dispatchpack", "axpy", "b1_generic")
    assert launch.grid == (5, 1, 1) and launch.block == (128, 1, 1)
    assert launch.i32(off["n"]) == 5000 and launch.f32(off["alpha"]) == 0.5
    assert b.args[3] == 5000
    z = tensor(7)
    b.set("out_ptr", z)
    assert b.args[2] is z
    mark = fake.launch_count()
    b()
    assert fake.last_launch(mark).u64(off["out_ptr"]) == addr(7)


def test_bind_errors(fake, open_pack):
    k = open_pack("dispatchpack").axpy
    b = k.bind(tensor(0), tensor(1), tensor(2), 4096, 1, 2.0)
    with pytest.raises(KeyError, match="no call parameter 'nope'"):
        b.set("nope", 1)
    with pytest.raises(IndexError, match="no index 6"):
        b.set(6, 1)
    with pytest.raises(TypeError, match=r"'alpha', fp32\) expects a float; got str"):
        b.set("alpha", "x")
    with pytest.raises(ValueError, match="no variant is valid for n=-1099511627776"):
        b.set("n", -(2**40))  # bucket 0, which has no i64 variant
    with pytest.raises(TypeError, match="takes no arguments"):
        b(1)
    with pytest.raises(TypeError, match="takes 6 arguments"):
        k.bind(tensor(0))
    with pytest.raises(ValueError, match="cuda:1"):
        b.set("x_ptr", tensor(0, device_id=1))
    mark = fake.launch_count()
    b()  # still the last good arguments
    assert fake.last_launch(mark).grid == (16, 1, 1)


def test_bound_launch_follows_the_current_stream_unless_given_one(fake, open_pack):
    k = open_pack("examplepack").vector_add
    s1, s2 = fake.stream_create(), fake.stream_create()
    b = k.bind(tensor(0), tensor(1), tensor(2), 64)
    try:
        _testing.set_current_stream(s1)
        mark = fake.launch_count()
        b()
        _testing.set_current_stream(s2)
        b()
        assert [launch.stream for launch in fake.launches_since(mark)] == [s1, s2]
        b.set_stream(s1)
        _testing.set_current_stream(0)
        mark = fake.launch_count()
        b()
        assert fake.last_launch(mark).stream == s1
        b.set_stream(None)
        mark = fake.launch_count()
        b()
        assert fake.last_launch(mark).stream == 0
    finally:
        _testing.set_current_stream(0)
    fixed = k.bind(tensor(0), tensor(1), tensor(2), 64, stream=s2)
    mark = fake.launch_count()
    fixed()
    assert fake.last_launch(mark).stream == s2


def test_bound_grid(fake, open_pack):
    k = open_pack("testpack").add
    x = tensor(0)
    b = k[(2, 2)].bind(x, x, x, 16)
    mark = fake.launch_count()
    b()
    b.set_grid(9)
    b()
    assert [launch.grid for launch in fake.launches_since(mark)] == [(2, 2, 1), (9, 1, 1)]
    b = k[lambda meta: (meta["n"] // meta["BLOCK"],)].bind(x, x, x, 4096)
    mark = fake.launch_count()
    b()
    assert fake.last_launch(mark).grid == (4, 1, 1)


# ---------------------------------------------------------------- failures below


def test_driver_errors_become_exceptions_with_the_driver_message(fake, open_pack):
    k = open_pack("examplepack").vector_add
    fake.fail_next("LaunchKernelEx", fake.CUDA_ERROR_LAUNCH_FAILED)
    with pytest.raises(kpack.Error, match="CUDA_ERROR_LAUNCH_FAILED") as e:
        k(tensor(0), tensor(1), tensor(2), 64)
    assert e.value.code == "INTERNAL" and isinstance(e.value, kpack.InternalError)
    mark = fake.launch_count()
    k(tensor(0), tensor(1), tensor(2), 64)  # and the next launch works
    assert fake.launch_count() == mark + 1


def test_a_failing_tensor_export_launches_nothing(fake, open_pack):
    k = open_pack("examplepack").vector_add
    mark = fake.launch_count()
    with pytest.raises(RuntimeError, match="export refused"):
        k(tensor(0), tensor(1, fail=True), tensor(2), 64)
    assert fake.launch_count() == mark


def test_managed_export_path_releases_what_it_takes(fake, open_pack, layouts):
    k = open_pack("examplepack").vector_add
    _testing.reset_counters()
    t = _testing.FakeManagedTensor(addr(9))
    mark = fake.launch_count()
    k(t, t, t, 64)
    assert fake.last_launch(mark).u64(layouts("examplepack", "vector_add", "div16")["x_ptr"]) == \
        addr(9)
    c = _testing.counters()
    assert c["managed_tensor_from_py_object"] == 3 and c["managed_deleted"] == 3


def test_kernel_objects_keep_the_pack_alive(fake, driver):
    k = kpack.open(KERNELS / "examplepack", driver=driver).vector_add  # the Pack is gone
    mark = fake.launch_count()
    k(tensor(0), tensor(1), tensor(2), 64)
    assert fake.launch_count() == mark + 1


def test_preload_and_runtime_stats(open_pack):
    pack = open_pack("dispatchpack")
    pack.preload()
    pack.axpy.preload()
    assert pack.stats()["libraries_loaded"] == 10


# ---------------------------------------------------------------- the pack tools' fields


def test_source_readonly_and_autotune_key(open_pack):
    pack = open_pack("examplepack")
    add = pack.vector_add
    qualname, sha256 = add.source
    assert qualname == "vector_add.vector_add_kernel" and len(sha256) == 64
    assert [p.readonly for p in add.params] == [True, True, False, False, False]
    name, type_, constexpr = add.params[0]  # still unpacks as three fields
    assert (name, type_, constexpr) == ("x_ptr", "*fp32", False)
    assert add.autotune_key == ()
    assert pack.matmul_fp16.source == pack.matmul_bf16.source, "one function, two dtypes"
    assert open_pack("testpack").add.source is None


def test_scratch_is_described(open_pack):
    scratch = open_pack("testpack").scratch
    assert scratch.has_scratch and not open_pack("testpack").add.has_scratch
    v = scratch.variants[0]
    assert (v.global_scratch_size, v.profile_scratch_size) == (128, 0)
    assert not v.launch_pdl and open_pack("testpack").pdl.variants[0].launch_pdl
    assert len(tuple(v)) == 10, "the new fields are attributes, not tuple items"


# ---------------------------------------------------------------- restrict


def test_restrict_launches_one_configuration_for_every_bucket(fake, open_pack):
    axpy = open_pack("dispatchpack").axpy
    b1 = axpy.restrict(["b1_generic", "b1_div16", "b1_div16_unit"], ignore_buckets=True)
    assert isinstance(b1, kpack.Kernel) and b1.name == "axpy"
    assert [v.name for v in b1.variants] == ["b1_generic", "b1_div16", "b1_div16_unit"]
    assert all(v.bucket == {} for v in b1.variants)
    for n, stride, variant in [(16, 1, "b1_div16_unit"), (1 << 20, 3, "b1_div16")]:
        assert b1.select_variant(tensor(0), tensor(1), tensor(2), n, stride, 1.0) == variant
        mark = fake.launch_count()
        b1(tensor(0), tensor(1), tensor(2), n, stride, 1.0)
        launch = fake.last_launch(mark)
        assert launch.block == (128, 1, 1) and launch.grid[0] == -(-n // 1024), n
    # Keeping buckets: only a bucket's own variants.
    generic = axpy.restrict(["b0_generic", "b1_generic", "b2_generic"])
    assert generic.select_variant(tensor(0), tensor(1), tensor(2), 5000, 1, 1.0) == "b1_generic"
    with pytest.raises(kpack.InvalidArgumentError, match="no variant serves bucket 1"):
        axpy.restrict(["b0_generic"])
    with pytest.raises(kpack.InvalidArgumentError, match="has no variant 'nosuch'"):
        axpy.restrict(["nosuch"], ignore_buckets=True)
    with pytest.raises(TypeError, match="not a str"):
        axpy.restrict("b0_generic")


# ---------------------------------------------------------------- scratch=


class Block:
    """A scratch buffer stand-in whose release is observable (like a caching-allocator
    block freed when its owner goes)."""
    released = []

    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr

    def __del__(self):
        Block.released.append(self.ptr)


def scratch_call(open_pack):
    k = open_pack("testpack").scratch
    return k, (tensor(0), tensor(1), 64, 64, 64)


def test_scratch_callable_gets_bytes_alignment_and_stream(fake, open_pack, layouts):
    k, args = scratch_call(open_pack)
    stream = fake.stream_create()
    calls = []

    def alloc(nbytes, align, s):
        calls.append((nbytes, align, s))
        return 0x7E00_0000_0000

    mark = fake.launch_count()
    k[(2, 3)](*args, stream=stream, scratch=alloc)
    assert calls == [(2 * 3 * 128, 128, stream)], "grid programs x scratch bytes, one kind"
    off = layouts("testpack", "scratch", "default")
    assert fake.last_launch(mark).u64(off["$global_scratch"]) == 0x7E00_0000_0000
    assert pack_stats(open_pack)["scratch_arenas"] == 0, "kpack's arenas untouched"


def pack_stats(open_pack):
    return open_pack("testpack").stats()


def test_scratch_objects_are_held_until_the_launch_is_issued(fake, open_pack, layouts):
    k, args = scratch_call(open_pack)
    Block.released.clear()
    seen = []

    def alloc(nbytes, align, s):
        seen.append(fake.launch_count())
        return Block(0x7E00_0000_1000)

    mark = fake.launch_count()
    k[(1,)](*args, scratch=alloc)
    assert seen == [mark] and Block.released == [0x7E00_0000_1000], "released after the launch"
    off = layouts("testpack", "scratch", "default")
    assert fake.last_launch(mark).u64(off["$global_scratch"]) == 0x7E00_0000_1000
    # A default allocator for every launch of one kernel object; scratch=None overrides.
    with_alloc = k.with_scratch(alloc)
    assert with_alloc.scratch is alloc and k.scratch is None
    with_alloc[(1,)](*args)
    assert len(seen) == 2
    arenas = pack_stats(open_pack)["scratch_arenas"]
    with_alloc[(1,)](*args, scratch=None)  # kpack's own arena
    assert len(seen) == 2 and pack_stats(open_pack)["scratch_arenas"] == arenas + 1
    # Bound launches ask at every launch.
    b = with_alloc[(1,)].bind(*args)
    b()
    b()
    assert len(seen) == 4 and Block.released.count(0x7E00_0000_1000) == 4
    # restrict() keeps the default.
    assert k.with_scratch(alloc).restrict(["default"]).scratch is alloc


@pytest.mark.parametrize("result, error, pattern", [
    (ZeroDivisionError("boom"), ZeroDivisionError, "boom"),
    ("nope", TypeError, "returned str; expected an int device address or an object with data_ptr"),
    (0, kpack.ResourceExhaustedError, "returned null for 8192 bytes"),
    (0x7E00_0000_0001, kpack.ResourceExhaustedError, "misaligned"),
])
def test_scratch_errors_launch_nothing(fake, open_pack, result, error, pattern):
    k, args = scratch_call(open_pack)

    def alloc(nbytes, align, s):
        if isinstance(result, Exception):
            raise result
        return result

    mark = fake.launch_count()
    with pytest.raises(error, match=pattern):
        k[(8, 8)](*args, scratch=alloc)
    assert fake.launch_count() == mark
    with pytest.raises(TypeError, match="with_scratch"):
        k.with_scratch(3)


# ---------------------------------------------------------------- preload="first_use"


def test_preload_first_use_loads_every_variant_at_the_first_launch(fake, driver):
    pack = kpack.open(KERNELS / "dispatchpack", driver=driver, preload="first_use")
    assert pack.stats()["libraries_loaded"] == 0
    pack.axpy(tensor(0), tensor(1), tensor(2), 64, 1, 1.0)
    assert pack.stats()["libraries_loaded"] == 10, "all ten variants, not just the one launched"
    lazy = kpack.open(KERNELS / "dispatchpack", driver=driver)
    lazy.axpy(tensor(0), tensor(1), tensor(2), 64, 1, 1.0)
    assert lazy.stats()["libraries_loaded"] == 1
    with pytest.raises(ValueError, match="preload must be"):
        kpack.open(KERNELS / "dispatchpack", driver=driver, preload="yes")


def test_preload_first_use_without_tensors_preloads_the_current_device(fake, driver):
    # Raw int pointers name no device: the current context's is the one to preload, at
    # the first launch and at a bound launch's first call alike.
    fake.use_primary_context()
    for launch in ("call", "bind"):
        pack = kpack.open(KERNELS / "dispatchpack", driver=driver, preload="first_use")
        args = (0x7F00_0010_0000, 0x7F00_0020_0000, 0x7F00_0030_0000, 64, 1, 1.0)
        if launch == "call":
            pack.axpy(*args)
        else:
            pack.axpy.bind(*args)()
        assert pack.stats()["libraries_loaded"] == 10, launch


# ---------------------------------------------------------------- contexts and devices


def run_child(driver, body: str) -> None:
    script = f"""
import sys, ctypes
import kpack
sys.path.insert(0, {str(KERNELS.parent / 'tests' / 'python')!r})
from conftest import Fake
import kpack_testing as _testing
fake = Fake({driver!r})
pack = kpack.open({str(KERNELS / 'examplepack')!r}, driver={driver!r})
add = pack.vector_add
def t(i, device=0):
    return _testing.FakeTensor(0x7F00_0000_0000 + 0x10_0000 * (i + 1), device_id=device)
""" + body + "\nprint('ok')\n"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_device_handles_are_mapped_to_ordinals(driver):
    # CUdevice handles need not be ordinals: with the fake's handles at ordinal + 100, the
    # current device is still cuda:1 for a tensor on cuda:1.
    run_child(driver, """
fake.lib.kpack_fake_set_devices(2)
fake.lib.kpack_fake_set_device_handle_offset(100)
fake.use_primary_context(1)
mark = fake.launch_count()
add(t(0, 1), t(1, 1), t(2, 1), 64)
assert fake.launch_count() == mark + 1
try:
    add(t(0, 0), t(1, 0), t(2, 0), 64)
    raise SystemExit("a tensor on cuda:0 launched on cuda:1")
except ValueError as e:
    assert "is on cuda:0 but the current device is cuda:1" in str(e), e
""")


def test_a_bound_launch_refuses_another_current_device(driver):
    # Its tensors are on cuda:0: under cuda:1 it would run there on cuda:0 addresses.
    run_child(driver, """
fake.lib.kpack_fake_set_devices(2)
fake.use_primary_context(0)
b = add.bind(t(0), t(1), t(2), 64)
b()
fake.use_primary_context(1)
mark = fake.launch_count()
try:
    b()
    raise SystemExit("a bound launch of cuda:0 tensors ran on cuda:1")
except ValueError as e:
    assert "the bound launch's tensors are on cuda:0 but the current device is cuda:1" in str(e), e
assert fake.launch_count() == mark
fake.use_primary_context(0)
b()
assert fake.launch_count() == mark + 1
""")


def test_a_context_replaced_at_the_same_address_is_a_new_context(driver):
    # The fake hands a destroyed context's handle to the next one (as a driver may); the
    # extension tells them apart by cuCtxGetId, so the new one's device is read again.
    run_child(driver, """
fake.lib.kpack_fake_set_devices(2)
fake.lib.kpack_fake_set_handle_reuse(1)
first = fake.ctx_create(0)
add(t(0, 0), t(1, 0), t(2, 0), 64)
fake.ctx_destroy(first)
second = fake.ctx_create(1)
assert second == first, "the fake reused the handle"
mark = fake.launch_count()
add(t(0, 1), t(1, 1), t(2, 1), 64)
assert fake.launch_count() == mark + 1
""")
