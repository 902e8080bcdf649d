"""kpack.install, the drop-in for Triton's ``kernel[grid](...)``, against the fake driver.

The Triton functions are the real ``@triton.jit`` functions the committed example pack was
built from (kernels/examples, imported as top-level modules, as a program imports its
kernel module); the tensors are C stand-ins with a DLPack exchange table and a dtype.
Triton's own launch cannot run without a GPU, so the fallback path is observed through a
recording ``JITFunction.run`` (what Triton's ``__getitem__`` calls).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import textwrap
import warnings

import pytest
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction, KernelInterface

import kpack
import kpack_testing as _testing

from conftest import KERNELS

sys.path.insert(0, str(KERNELS / "examples"))
from layer_norm_train import layer_norm_fwd_kernel  # noqa: E402
from matmul import matmul_kernel  # noqa: E402
from matmul_autotuned import matmul_autotuned_kernel  # noqa: E402
from matmul_tma import matmul_tma_persistent  # noqa: E402
from vector_add import vector_add_kernel  # noqa: E402

BASE = 0x7F00_0000_0000
FP16, BF16 = dict(code=2, bits=16), dict(code=4, bits=16)
ORIGINAL_GETITEM = KernelInterface.__dict__["__getitem__"]


def tensor(i: int, **kw):
    return _testing.FakeTensor(BASE + 0x10_0000 * (i + 1), **kw)


@pytest.fixture
def jit_runs(monkeypatch):
    """What reached Triton's launcher: (function, args, grid, kwargs) per call."""
    runs = []

    def run(self, *args, grid, warmup, **kwargs):
        runs.append((self, args, grid, kwargs))
    monkeypatch.setattr(JITFunction, "run", run)
    return runs


@pytest.fixture
def pack(open_pack):
    yield open_pack("examplepack")
    kpack.uninstall()


def test_a_jit_call_launches_the_pack_variant_of_its_constexprs(fake, pack, layouts, jit_runs):
    inst = kpack.install(pack)
    assert KernelInterface.__dict__["__getitem__"] is not ORIGINAL_GETITEM
    x, y, out = tensor(0), tensor(1), tensor(2)
    mark = fake.launch_count()
    assert vector_add_kernel[(5,)](x, y, out, 5000, BLOCK=1024) is None
    launch = fake.last_launch(mark)
    off = layouts("examplepack", "vector_add", "generic")
    assert launch.entry == "vector_add_kernel" and launch.grid == (5, 1, 1)
    assert launch.block == (128, 1, 1), "the pack's num_warps, Triton's default 4"
    assert [launch.u64(off[p]) for p in ("x_ptr", "y_ptr", "out_ptr")] == \
        [BASE + 0x10_0000 * i for i in (1, 2, 3)]
    assert launch.i32(off["n"]) == 5000
    # Positional constexprs, a callable grid (it sees the call's arguments and constexprs)
    # and keyword parameters bind as in Triton.
    metas = []
    mark = fake.launch_count()
    vector_add_kernel[lambda meta: metas.append(meta) or (triton.cdiv(meta["n"],
                                                                      meta["BLOCK"]),)](
        x, y, n=4096, out_ptr=out, BLOCK=1024)
    launch = fake.last_launch(mark)
    assert launch.grid == (4, 1, 1) and metas[0]["BLOCK"] == 1024 and metas[0]["out_ptr"] is out
    mark = fake.launch_count()
    vector_add_kernel[(1,)](x, y, out, 4096, 1024)
    assert fake.launch_count() == mark + 1
    assert pack.vector_add.stats()["div16"].launches >= 2, "aligned and n % 16 == 0"
    assert jit_runs == [], "nothing reached Triton"
    assert inst.stats()["vector_add.vector_add_kernel"] == {"kpack": 3, "triton": 0,
                                                            "reasons": []}


def test_repeated_calls_ask_the_resolver_nothing(fake, pack, jit_runs):
    inst = kpack.install(pack)
    asked = []
    resolver = inst._resolver
    for name in ("function", "shape", "target"):
        method = getattr(resolver, name)
        setattr(resolver, name, lambda *a, _m=method, _n=name: asked.append(_n) or _m(*a))
    x, y, out = tensor(0), tensor(1), tensor(2)
    for n in (5000, 6000, 7000):
        vector_add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    assert asked == ["function", "shape", "target"]
    block = 1024
    vector_add_kernel[(1,)](x, y, out, 16, BLOCK=block + 0)  # another int object, same value
    assert asked == ["function", "shape", "target"]
    vector_add_kernel[(1,)](x, y, out, 16, block)  # another call shape
    assert asked == ["function", "shape", "target", "shape", "target"]


def test_calls_the_pack_cannot_serve_run_on_triton_once_warned(fake, pack, jit_runs):
    inst = kpack.install(pack)
    x, y, out = tensor(0), tensor(1), tensor(2)
    mark = fake.launch_count()
    with pytest.warns(kpack.DropInWarning, match=r"vector_add\.vector_add_kernel runs on "
                      r"Triton's JIT.*no variant with BLOCK=2048, num_warps=4.*it has "
                      r"BLOCK=1024, num_warps=4") as record:
        vector_add_kernel[(3,)](x, y, out, 5000, BLOCK=2048)
    assert record[0].filename == __file__, "the warning points at the caller's line"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per function and reason
        vector_add_kernel[(3,)](x, y, out, 5000, BLOCK=2048)
    assert fake.launch_count() == mark
    assert [(fn, args[3], grid, kw) for fn, args, grid, kw in jit_runs] == \
        [(vector_add_kernel, 5000, (3,), {"BLOCK": 2048})] * 2
    with pytest.warns(kpack.DropInWarning, match="num_warps=8"):
        vector_add_kernel[(3,)](x, y, out, 5000, BLOCK=1024, num_warps=8)
    with pytest.warns(kpack.DropInWarning, match=r"launch option maxnreg=128 is not recorded"):
        vector_add_kernel[(3,)](x, y, out, 5000, BLOCK=1024, maxnreg=128)
    with pytest.warns(kpack.DropInWarning, match=r"takes x_ptr: \*fp32, y_ptr: \*fp32, out_ptr"):
        vector_add_kernel[(3,)](tensor(0, **FP16), tensor(1, **FP16), tensor(2, **FP16), 64,
                                BLOCK=1024)
    row = inst.stats()["vector_add.vector_add_kernel"]
    assert row["kpack"] == 0 and row["triton"] == 5 and len(row["reasons"]) == 4


def test_equal_constexprs_of_another_type_are_another_target(fake, pack, jit_runs):
    # 1024 and 1024.0 are equal and hash alike, but are different constexprs (Triton
    # compiles each apart): the float one runs on Triton whichever came first.
    kpack.install(pack)
    x, y, out = tensor(0), tensor(1), tensor(2)
    mark = fake.launch_count()
    vector_add_kernel[(5,)](x, y, out, 5000, BLOCK=1024)
    assert fake.launch_count() == mark + 1
    with pytest.warns(kpack.DropInWarning, match="BLOCK=1024.0"):
        vector_add_kernel[(5,)](x, y, out, 5000, BLOCK=1024.0)
    assert fake.launch_count() == mark + 1
    assert [kw for _, _, _, kw in jit_runs] == [{"BLOCK": 1024.0}]
    assert type(jit_runs[0][3]["BLOCK"]) is float


def test_strict_raises_instead(fake, pack, jit_runs):
    kpack.install(pack, strict=True)
    mark = fake.launch_count()
    with pytest.raises(kpack.DropInError, match="no variant with BLOCK=2048"):
        vector_add_kernel[(3,)](tensor(0), tensor(1), tensor(2), 5000, BLOCK=2048)
    assert fake.launch_count() == mark and jit_runs == []


def config_of(v):
    return v.constexprs, v.num_warps, v.num_stages


def launches(kernel, names):
    stats = kernel.stats()
    return sum(stats[n].launches for n in names)


def test_options_and_dtypes_select_the_variant_and_the_kernel(fake, pack, jit_runs):
    # The configs are the committed pack's (tuned on the H200): the call names one that is
    # not the own config of M's bucket, with its options.
    inst = kpack.install(pack)
    fp16, bf16 = pack.matmul_fp16, pack.matmul_bf16
    m, n, k = 1000, 64, 64  # M in the last bucket
    own = config_of(next(v for v in fp16.variants if v.bucket == {"M": (257, None)}))
    other = next(v for v in fp16.variants if config_of(v) != own)
    same = [v.name for v in fp16.variants if config_of(v) == config_of(other)]
    a, b, c = tensor(0, **FP16), tensor(1, **FP16), tensor(2, **FP16)
    args = (a, b, c, m, n, k, k, 1, n, 1, n, 1)
    options = dict(other.constexprs, num_warps=other.num_warps, num_stages=other.num_stages)
    mark = fake.launch_count()
    matmul_kernel[(16, 1)](*args, **options)
    launch = fake.last_launch(mark)
    assert launch.block == (32 * other.num_warps, 1, 1) and launch.grid == (16, 1, 1)
    assert launches(fp16, same) == 1, "the call's configuration, whichever bucket M is in"
    # num_stages selects too: the same tile with other stages is not in the pack.
    stages = other.num_stages + 1
    assert all(config_of(v) != (other.constexprs, other.num_warps, stages)
               for v in fp16.variants)
    with pytest.warns(kpack.DropInWarning, match=f"num_stages={stages}"):
        matmul_kernel[(16, 1)](*args, **dict(options, num_stages=stages))
    # bf16 tensors: the bf16 kernel compiled from the same function, with its own configs.
    bf = (tensor(0, **BF16), tensor(1, **BF16), tensor(2, **BF16))
    other16 = bf16.variants[0]
    matmul_kernel[(16, 1)](*bf, *args[3:], **dict(other16.constexprs,
                                                  num_warps=other16.num_warps,
                                                  num_stages=other16.num_stages))
    assert launches(bf16, [v.name for v in bf16.variants
                           if config_of(v) == config_of(other16)]) == 1
    with pytest.warns(kpack.DropInWarning, match=r"'matmul_fp16' takes a_ptr: \*fp16.*"
                      r"'matmul_bf16' takes a_ptr: \*bf16"):
        matmul_kernel[(16, 1)](tensor(0), tensor(1), tensor(2), *args[3:], **options)
    assert inst.stats()["matmul.matmul_kernel"]["kpack"] == 2


def test_a_kernel_without_grid_expressions_takes_the_callers_grid(fake, pack, jit_runs):
    kpack.install(pack)
    v = pack.layer_norm_fwd.variants[0]
    t = [tensor(i, **FP16) for i in range(4)] + [tensor(4), tensor(5)]
    mark = fake.launch_count()
    layer_norm_fwd_kernel[(7,)](*t, 1024, 1024, 1000, 1e-5, num_warps=v.num_warps,
                                num_stages=v.num_stages, **v.constexprs)
    assert fake.last_launch(mark).grid == (7, 1, 1)


def test_functions_the_pack_does_not_have(fake, pack, jit_runs, tmp_path):
    kpack.install(pack)

    @triton.jit
    def other_kernel(x_ptr, n, BLOCK: tl.constexpr):
        pass

    with pytest.warns(kpack.DropInWarning, match="no kernel of the installed packs was "
                      "compiled from it"):
        other_kernel[(1,)](tensor(0), 4, BLOCK=4)
    # The example's vector_add, edited after the pack was built, in a package.
    source = (KERNELS / "examples" / "vector_add.py").read_text()
    edited = source.replace("x + y, mask=mask", "x - y, mask=mask")
    assert edited != source
    (tmp_path / "edited").mkdir()
    (tmp_path / "edited" / "__init__.py").write_text("")
    (tmp_path / "edited" / "vector_add.py").write_text(edited)
    sys.path.insert(0, str(tmp_path))
    try:
        from edited.vector_add import vector_add_kernel as changed  # noqa: PLC0415
    finally:
        sys.path.remove(str(tmp_path))
    with pytest.warns(kpack.DropInWarning, match=r"edited\.vector_add\.vector_add_kernel runs "
                      r"on Triton's JIT.*source changed since the pack was built"):
        changed[(1,)](tensor(0), tensor(1), tensor(2), 64, BLOCK=1024)
    assert len(jit_runs) == 2


def test_pre_run_hooks_and_heuristics_fall_back(fake, pack, jit_runs, monkeypatch):
    kpack.install(pack)
    monkeypatch.setattr(vector_add_kernel, "pre_run_hooks", [])
    x, y, out = tensor(0), tensor(1), tensor(2)
    vector_add_kernel[(1,)](x, y, out, 64, BLOCK=1024)
    vector_add_kernel.pre_run_hooks.append(lambda *a, **k: None)
    with pytest.warns(kpack.DropInWarning, match="pre-run hooks"):
        vector_add_kernel[(1,)](x, y, out, 64, BLOCK=1024)
    assert len(jit_runs) == 1
    wrapped = triton.heuristics({"BLOCK": lambda args: 1024})(vector_add_kernel)
    with pytest.warns(kpack.DropInWarning, match="triton.heuristics"):
        wrapped[(1,)](x, y, out, 64)
    assert len(jit_runs) == 2


def test_uninstall_gives_triton_its_getitem_back(fake, pack, jit_runs):
    kpack.install(pack)
    kpack.uninstall()
    assert KernelInterface.__dict__["__getitem__"] is ORIGINAL_GETITEM
    assert kpack.installed() is None
    mark = fake.launch_count()
    vector_add_kernel[(5,)](tensor(0), tensor(1), tensor(2), 5000, BLOCK=1024)
    assert fake.launch_count() == mark and len(jit_runs) == 1


@pytest.fixture
def autotuned_pack(tmp_path, driver):
    """The example pack's fp16 matmul relabelled as the recording of the autotuned example
    (same call parameters, plus its GROUP_M constexpr): buckets over M, a config each. The
    fake driver runs no cubin, so only the dispatch matters."""
    shutil.copytree(KERNELS / "examplepack", tmp_path / "pack")
    manifest_path = tmp_path / "pack" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    kernel = next(k for k in manifest["kernels"] if k["name"] == "matmul_fp16")
    kernel["name"] = "matmul_autotuned"
    kernel["params"].append({"name": "GROUP_M", "type": "constexpr"})
    for v in kernel["variants"]:
        v["constexprs"]["GROUP_M"] = 8
    sha = hashlib.sha256(matmul_autotuned_kernel.fn.src.encode()).hexdigest()
    kernel["source"] = {"qualname": "matmul_autotuned.matmul_autotuned_kernel", "sha256": sha}
    kernel["autotune_key"] = ["M", "N", "K"]
    manifest["kernels"] = [kernel]
    manifest_path.write_text(json.dumps(manifest))
    yield kpack.open(tmp_path / "pack", driver=driver)
    kpack.uninstall()


def test_an_autotuned_function_dispatches_through_the_buckets(fake, autotuned_pack, jit_runs):
    assert autotuned_pack.matmul_autotuned.autotune_key == ("M", "N", "K")
    kpack.install(autotuned_pack)
    a, b, c = tensor(0, **FP16), tensor(1, **FP16), tensor(2, **FP16)
    metas = []

    def grid(meta):
        metas.append(meta)
        return (triton.cdiv(meta["M"], meta["BLOCK_M"]) * triton.cdiv(meta["N"], meta["BLOCK_N"]),)

    for m, variant, block_m, block_n, warps in [(10, "b0_contig", 16, 64, 4),
                                                (1000, "b3_contig", 128, 128, 8)]:
        mark = fake.launch_count()
        matmul_autotuned_kernel[grid](a, b, c, m, 256, 64, 64, 1, 256, 1, 256, 1)
        launch = fake.last_launch(mark)
        assert metas[-1]["BLOCK_M"] == block_m and metas[-1]["GROUP_M"] == 8
        assert launch.grid[0] == triton.cdiv(m, block_m) * triton.cdiv(256, block_n)
        assert launch.block == (32 * warps, 1, 1)
        assert autotuned_pack.matmul_autotuned.stats()[variant].launches == 1
    assert jit_runs == [], "no autotuning, no JIT: the pack's buckets chose"
    # What Triton refuses goes to Triton, which says so.
    with pytest.warns(kpack.DropInWarning, match="BLOCK_M, which the autotuner's configs set"), \
            pytest.raises(ValueError, match="Conflicting meta-parameters: BLOCK_M"):
        matmul_autotuned_kernel[grid](a, b, c, 10, 256, 64, 64, 1, 256, 1, 256, 1, BLOCK_M=16)


def test_installing_a_second_pack_adds_it(fake, pack, autotuned_pack, jit_runs):
    kpack.install(pack)
    inst = kpack.install(autotuned_pack)
    assert inst.packs == [pack, autotuned_pack]
    vector_add_kernel[(1,)](tensor(0), tensor(1), tensor(2), 64, BLOCK=1024)
    assert jit_runs == []


def test_the_resolver_binds_like_triton(pack):
    # Pure-Python pieces, without a call.
    from kpack import _dropin  # noqa: PLC0415
    assert _dropin.qualname_matches("vector_add.vector_add_kernel",
                                    "examples.vector_add.vector_add_kernel")
    assert not _dropin.qualname_matches("vector_add.vector_add_kernel",
                                        "examples.my_vector_add.vector_add_kernel")
    assert _dropin.constexpr_value(tl.constexpr(64)) == 64
    assert _dropin.constexpr_value(tl.float16) == "fp16"
    assert _dropin.source_sha256(vector_add_kernel) == pack.vector_add.source[1], \
        "the drop-in hashes JITFunction.src as the pack builder did"
    src = textwrap.dedent(vector_add_kernel.src)
    assert src.startswith("def vector_add_kernel(")


# ---------------------------------------------------------------------------
# A pack recorded from the same program: None arguments, descriptor pre-hooks, warmup()
# ---------------------------------------------------------------------------

@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, scale_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if scale_ptr is not None:
        x = x * tl.load(scale_ptr)
    tl.store(out_ptr + offs, x + tl.load(y_ptr + offs, mask=mask), mask=mask)


def _relabelled(tmp_path, driver, name, edit):
    """A copy of the example pack holding only kernel `name`, edited by `edit(kernel)`."""
    out = tmp_path / f"{name}_pack"
    shutil.copytree(KERNELS / "examplepack", out)
    manifest = json.loads((out / "manifest.json").read_text())
    kernel = next(k for k in manifest["kernels"] if k["name"] == name)
    edit(kernel)
    manifest["kernels"] = [kernel]
    (out / "manifest.json").write_text(json.dumps(manifest))
    return kpack.open(out, driver=driver)


@pytest.fixture
def none_pack(tmp_path, driver):
    """What the recorder writes for `scaled_add_kernel[grid](x, y, out, n, None, ...)`
    (tools/tests/test_record.py checks the shape): the None argument a constexpr of the
    kernel, null in every variant. The cubins are the example vector_add's, whose call
    parameters these are; the fake driver runs no cubin."""
    def edit(kernel):
        kernel["name"] = "scaled_add"
        kernel["params"].insert(4, {"name": "scale_ptr", "type": "constexpr"})
        for v in kernel["variants"]:
            v["constexprs"] = {"scale_ptr": None, **v["constexprs"]}
        kernel["source"] = {"qualname": "test_dropin.scaled_add_kernel",
                            "sha256": hashlib.sha256(scaled_add_kernel.src.encode()).hexdigest()}
    yield _relabelled(tmp_path, driver, "vector_add", edit)
    kpack.uninstall()


def test_a_none_argument_is_served_by_the_kernel_compiled_with_it(fake, none_pack, layouts,
                                                                    jit_runs):
    inst = kpack.install(none_pack)
    x, y, out = tensor(0), tensor(1), tensor(2)
    off = layouts("examplepack", "vector_add", "generic")
    for call in (lambda: scaled_add_kernel[(5,)](x, y, out, 5000, None, BLOCK=1024),
                 lambda: scaled_add_kernel[(5,)](x, y, out, 5000, scale_ptr=None, BLOCK=1024),
                 lambda: scaled_add_kernel[(5,)](x, y, out, 5000, None, 1024)):
        mark = fake.launch_count()
        call()
        launch = fake.last_launch(mark)
        assert launch.grid == (5, 1, 1)
        assert [launch.u64(off[p]) for p in ("x_ptr", "y_ptr", "out_ptr")] == \
            [BASE + 0x10_0000 * i for i in (1, 2, 3)]
        assert launch.i32(off["n"]) == 5000
    assert jit_runs == []
    # A tensor where the pack has None is another configuration: Triton's, said once.
    with pytest.warns(kpack.DropInWarning, match=r"'scaled_add' was compiled with "
                                                  r"scale_ptr=None; the call passes a value"):
        scaled_add_kernel[(5,)](x, y, out, 5000, tensor(3), BLOCK=1024)
    assert len(jit_runs) == 1
    # ... and None again is the pack's.
    scaled_add_kernel[(5,)](x, y, out, 5000, None, BLOCK=1024)
    row = inst.stats()["test_dropin.scaled_add_kernel"]
    assert (row["kpack"], row["triton"]) == (4, 1)


def test_none_for_a_pointer_the_pack_takes_goes_to_triton_with_the_reason(fake, pack, jit_runs):
    kpack.install(pack)
    with pytest.warns(kpack.DropInWarning, match=r"'vector_add' takes y_ptr: \*fp32, the call "
                                                  r"passes None"):
        vector_add_kernel[(1,)](tensor(0), None, tensor(2), 64, BLOCK=1024)
    assert len(jit_runs) == 1


def _set_tma_blocks(nargs):
    # Triton's tutorial 09 (persistent matmul): the config's tile is the descriptors' block.
    nargs["a_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["b_desc"].block_shape = [nargs["BLOCK_K"], nargs["BLOCK_N"]]
    nargs["c_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_N"]]


def _tma_configs(hook):
    return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
                          num_warps=4, num_stages=4, pre_hook=hook),
            triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8},
                          num_warps=8, num_stages=3, pre_hook=hook)]


@pytest.fixture
def tma_pack(tmp_path, driver):
    """The example's persistent TMA matmul as the recording of an autotuned program: its two
    configs bucketed on M (the example pack's), with the key recorded."""
    def edit(kernel):
        kernel["autotune_key"] = ["M", "N", "K"]
    yield _relabelled(tmp_path, driver, "matmul_tma", edit)
    kpack.uninstall()


class Desc:
    """Duck-typed like triton.tools.tensor_descriptor.TensorDescriptor."""

    def __init__(self, base, shape, block_shape=(1, 1)):
        self.base, self.shape, self.strides = base, list(shape), [shape[1], 1]
        self.block_shape, self.padding = list(block_shape), "zero"


def _tma_args(m, n, k):
    return (Desc(tensor(0, **FP16), (m, k)), Desc(tensor(1, **FP16), (k, n)),
            Desc(tensor(2, **FP16), (m, n)), m, n, k, 132)


def test_a_pre_hook_that_sets_descriptor_blocks_is_served(fake, tma_pack, jit_runs):
    tuned = triton.autotune(configs=_tma_configs(_set_tma_blocks), key=["M", "N", "K"])(
        matmul_tma_persistent)
    inst = kpack.install(tma_pack)
    grid = lambda meta: (min(132, triton.cdiv(meta["M"], meta["BLOCK_M"]) *  # noqa: E731
                             triton.cdiv(meta["N"], meta["BLOCK_N"])),)
    encodes = fake.tensor_map_encode_count()
    for m, warps, box_m in [(48, 4, 64), (1000, 8, 128)]:
        mark = fake.launch_count()
        tuned[grid](*_tma_args(m, 512, 256))
        launch = fake.last_launch(mark)
        assert launch.block == (32 * warps, 1, 1)
        # The variant's block, which is what the hook would have set on the descriptors.
        assert fake.tensor_map_encodes_since(encodes)[-3].box[1] == box_m
        encodes = fake.tensor_map_encode_count()
    assert jit_runs == []
    assert inst.stats()["matmul_tma.matmul_tma_persistent"] == {"kpack": 2, "triton": 0,
                                                               "reasons": []}


def test_pre_hooks_that_do_more_go_to_triton_with_the_reason(fake, tma_pack, autotuned_pack,
                                                            monkeypatch):
    from triton.runtime.autotuner import Autotuner  # noqa: PLC0415
    tuner_runs = []  # what reached Triton's autotuner (it would benchmark on a GPU)
    monkeypatch.setattr(Autotuner, "run", lambda self, *a, **k: tuner_runs.append(self))
    def zero_c(nargs):
        nargs["c_ptr"].zero_()

    def other_block(nargs):  # a tile the pack's variants do not have
        nargs["a_desc"].block_shape = [32, nargs["BLOCK_K"]]
        nargs["b_desc"].block_shape = [nargs["BLOCK_K"], nargs["BLOCK_N"]]
        nargs["c_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_N"]]

    zeroing = triton.autotune(configs=[triton.Config(dict(c.kwargs), num_warps=c.num_warps,
                                                     num_stages=c.num_stages, pre_hook=zero_c)
                                       for c in matmul_autotuned_kernel.configs],
                              key=["M", "N", "K"])(matmul_autotuned_kernel.fn)
    kpack.install(autotuned_pack)
    with pytest.warns(kpack.DropInWarning, match=r"an autotuner config has a pre_hook that does "
                                                  r"more than set tensor descriptors' block "
                                                  r"shapes \(zero_c: "):
        zeroing[(1,)](tensor(0, **FP16), tensor(1, **FP16), tensor(2, **FP16), 10, 256, 64,
                      64, 1, 256, 1, 256, 1)
    mismatched = triton.autotune(configs=_tma_configs(other_block), key=["M", "N", "K"])(
        matmul_tma_persistent)
    kpack.install(tma_pack)
    with pytest.warns(kpack.DropInWarning, match=r"the pre_hook sets a_desc's block shape to "
                                                  r"\[32, 64\] where the pack's variants of "
                                                  r"that config have \[64, 64\]"):
        mismatched[(1,)](*_tma_args(48, 512, 256))
    assert tuner_runs == [zeroing, mismatched]


def _compiled(fn, signature, constexprs, **options):
    """What `fn.warmup(...)` returns for these arguments: Triton's CompiledKernel (compiled
    here for sm_90 directly: warmup needs a device to ask for its target)."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415
    return triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options=options)


VECTOR_ADD_SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                        "BLOCK": "constexpr"}


def test_a_warmed_up_compiled_kernel_launches_through_the_pack(fake, pack, layouts, jit_runs):
    compiled = _compiled(vector_add_kernel, VECTOR_ADD_SIGNATURE, {"BLOCK": 1024})
    inst = kpack.install(pack)
    x, y, out = tensor(0), tensor(1), tensor(2)
    mark = fake.launch_count()
    # Triton's CompiledKernel[grid] takes every argument, constexprs included, in order.
    assert compiled[(5, 1, 1)](x, y, out, 5000, 1024) is None
    launch = fake.last_launch(mark)
    off = layouts("examplepack", "vector_add", "generic")
    assert launch.grid == (5, 1, 1) and launch.i32(off["n"]) == 5000
    assert [launch.u64(off[p]) for p in ("x_ptr", "y_ptr", "out_ptr")] == \
        [BASE + 0x10_0000 * i for i in (1, 2, 3)]
    s = fake.stream_create()
    mark = fake.launch_count()
    compiled[(1, 1, 1)](x, y, out, 64, 1024, stream=s)
    assert fake.last_launch(mark).stream == s
    assert inst.stats()["vector_add.vector_add_kernel"] == {"kpack": 2, "triton": 0,
                                                           "reasons": []}
    assert jit_runs == []


def test_a_compiled_kernel_the_pack_lacks_runs_on_triton_with_the_reason(fake, pack, jit_runs,
                                                                         monkeypatch):
    from triton.compiler.compiler import CompiledKernel  # noqa: PLC0415
    compiled = _compiled(vector_add_kernel, VECTOR_ADD_SIGNATURE, {"BLOCK": 2048})
    runs = []
    monkeypatch.setattr(CompiledKernel, "_init_handles", lambda self: None)
    compiled._run = lambda *args: runs.append(args)  # Triton's launcher, observed
    inst = kpack.install(pack)
    mark = fake.launch_count()
    with pytest.warns(kpack.DropInWarning, match=r"vector_add\.vector_add_kernel runs on "
                      r"Triton's JIT.*no variant with BLOCK=2048") as record:
        compiled[(3, 1, 1)](tensor(0), tensor(1), tensor(2), 5000, 2048, stream=0)
    assert record[0].filename == __file__, "the warning points at the caller's line"
    assert fake.launch_count() == mark and len(runs) == 1 and runs[0][:3] == (3, 1, 1)
    row = inst.stats()["vector_add.vector_add_kernel"]
    assert (row["kpack"], row["triton"]) == (0, 1)
    with pytest.raises(kpack.DropInError, match="no variant with BLOCK=2048"):
        kpack.install(pack, strict=True)
        compiled[(3, 1, 1)](tensor(0), tensor(1), tensor(2), 5000, 2048, stream=0)
