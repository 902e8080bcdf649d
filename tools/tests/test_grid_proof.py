"""The builder's proof of a spec's ``grid_tolerant`` (``kpack_tools.grid_proof`` through
``build``), on the CPU.

The GPU is replaced by a backend that runs numpy models of two example kernels the way
their programs behave for a grid: vector add masks every program by ``n`` (extra programs
do nothing), softmax runs one program per row with no row check (extra programs read and
write rows past the tensors, through the guard memory that follows them). Times are a
model too (proportional to the programs launched). Everything else -- the shapes across
each bucket, padded grids, guards, bitwise comparison, verdicts, tuning.json and the
manifest's ``grid_tolerance`` -- is the real code. The GPU runs the same proof in
tests/gpu/examples_check.py's tuned builds when a spec asserts it.
"""

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kpack_tools import build as builder
from kpack_tools import grid_proof
from kpack_tools.spec import SpecError, load_specs
from pack_validator import validate_manifest

REPO = Path(__file__).resolve().parents[2]

SPEC = textwrap.dedent('''
    import sys
    import numpy as np
    sys.path.insert(0, "EXAMPLES")
    from vector_add import vector_add_kernel
    from softmax import softmax_kernel
    sys.path.pop(0)
    from kpack_tools.spec import Bucket, Config, KernelSpec

    def add_inputs(shape, device):
        n = shape["n"]
        rng = np.random.default_rng(n)
        return {"x_ptr": rng.standard_normal(n).astype(np.float32),
                "y_ptr": rng.standard_normal(n).astype(np.float32),
                "out_ptr": np.zeros(n, np.float32), "n": n}

    def softmax_inputs(shape, device):
        rows, cols = shape["n_rows"], shape["n_cols"]
        rng = np.random.default_rng(rows * 1000 + cols)
        return {"out_ptr": np.zeros((rows, cols), np.float32),
                "in_ptr": rng.standard_normal((rows, cols)).astype(np.float32),
                "in_row_stride": cols, "out_row_stride": cols, "n_rows": rows, "n_cols": cols}

    KPACK_KERNELS = [
        KernelSpec(
            name="vector_add", fn=vector_add_kernel,
            params=[("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("out_ptr", "*fp32"),
                    ("n", "i32"), ("BLOCK", "constexpr")],
            configs=[Config("b256", {"BLOCK": 256}, num_warps=2)], default="b256",
            grid=["cdiv(n, BLOCK)"], buckets=[Bucket("n", [1000, 4000])],
            representatives=[{"n": 700}, {"n": 3000}, {"n": 9000}],
            make_inputs=add_inputs, outputs=["out_ptr"], deterministic=True,
            grid_tolerant=True, ADD_EXTRA),
        KernelSpec(
            name="softmax", fn=softmax_kernel,
            params=[("out_ptr", "*fp32"), ("in_ptr", "*fp32"), ("in_row_stride", "i32"),
                    ("out_row_stride", "i32"), ("n_rows", "i32"), ("n_cols", "i32"),
                    ("BLOCK", "constexpr")],
            configs=[Config("b128", {"BLOCK": 128}, num_warps=1)], default="b128",
            grid=["n_rows"], buckets=[Bucket("n_rows", [8, 32])],
            representatives=[{"n_rows": 5, "n_cols": 40}, {"n_rows": 20, "n_cols": 40},
                             {"n_rows": 50, "n_cols": 40}],
            make_inputs=softmax_inputs, outputs=["out_ptr"], deterministic=True,
            grid_tolerant=SOFTMAX_TOLERANT),
    ]
''')


def write_spec(tmp_path, add_extra="grid_max={'n': 16000}", softmax_tolerant=True):
    path = tmp_path / "graph_spec.py"
    path.write_text(SPEC.replace("EXAMPLES", str(REPO / "kernels" / "examples"))
                    .replace("ADD_EXTRA", add_extra)
                    .replace("SOFTMAX_TOLERANT", str(softmax_tolerant)))
    return path


def vector_add_model(config, args, grid):
    """Each program p handles [p*BLOCK, (p+1)*BLOCK), masked by n."""
    block, n = config.constexprs["BLOCK"], args["n"]
    for p in range(grid[0]):
        lo, hi = p * block, min((p + 1) * block, n)
        if lo < hi:
            args["out_ptr"][lo:hi] = args["x_ptr"][lo:hi] + args["y_ptr"][lo:hi]


def _flat(array):
    """The memory an unchecked pointer reaches: the guarded buffer behind a view."""
    return array.base if array.base is not None else array.reshape(-1)


def softmax_model(config, args, grid):
    """One program per row, rows not checked against n_rows: as the compiled kernel, a
    program past the last row reads and writes the memory after the tensors."""
    cols = args["n_cols"]
    src, dst = _flat(args["in_ptr"]), _flat(args["out_ptr"])
    for row in range(grid[0]):
        start = row * args["in_row_stride"]
        x = src[start:start + cols].astype(np.float64)
        if x.size < cols:
            raise RuntimeError("illegal memory access")  # past the allocation
        e = np.exp(x - x.max())
        out = row * args["out_row_stride"]
        dst[out:out + cols] = (e / e.sum()).astype(np.float32)


MODELS = {"vector_add": vector_add_model, "softmax": softmax_model}


class GridModelBackend:
    """Runs the numpy models at a given grid; a launch's time is its programs (us)."""

    device = "model GPU"

    def __init__(self, cost_per_program=1.0, fixed_cost=10.0):
        self.cost_per_program = cost_per_program
        self.fixed_cost = fixed_cost
        self.grids = []
        self.guard_sizes = []

    def inputs(self, spec, shape):
        return dict(spec.make_inputs(dict(shape), "cpu"))

    def copy(self, args):
        return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in args.items()}

    def run(self, spec, config, args, grid=None):
        grid = grid or spec.grid_for(args, config)
        self.grids.append((spec.name, tuple(grid)))
        MODELS[spec.name](config, args, grid)

    def time(self, spec, config, args, reps, warmup, grid=None):
        grid = grid or spec.grid_for(args, config)
        return self.fixed_cost + self.cost_per_program * float(np.prod(grid))

    def guard(self, args, factor, reach=None):
        guarded, guards = dict(args), []
        rng = np.random.default_rng(9)
        for name, value in args.items():
            if not isinstance(value, np.ndarray):
                continue
            far = (reach or {}).get(name)
            extra = max(value.size * factor, far.size if isinstance(far, np.ndarray) else 0)
            self.guard_sizes.append((name, extra))
            big = np.empty(value.size + extra, value.dtype)
            tail = big[value.size:].view(np.uint8)
            tail[:] = rng.integers(0, 256, tail.size, dtype=np.uint8)
            big[:value.size] = value.reshape(-1)
            guarded[name] = big[:value.size].reshape(value.shape)
            guards.append((name, tail, tail.copy()))
        return guarded, guards

    def guard_damage(self, guards):
        return [name for name, tail, pattern in guards if not np.array_equal(tail, pattern)]


def kernel_entry(document, name):
    return next(k for k in document["kernels"] if k["name"] == name)


def test_masked_kernel_is_proven_and_row_kernel_refused(tmp_path):
    backend = GridModelBackend(cost_per_program=0.01)
    manifest, tuning = builder.build([write_spec(tmp_path)], tmp_path / "pack", backend=backend,
                                     log=None)
    add = kernel_entry(tuning, "vector_add")["grid_tolerance"]
    assert add["verdict"] == grid_proof.PROVEN and add["reason"] is None
    # Bucket 0 (n <= 1000): n = 1, 500 and the representative 700 padded to 1000 (4
    # programs), then the representative's doubled grid; the open-ended bucket is padded
    # to grid_max 16000.
    bucket0 = add["buckets"][0]
    assert bucket0["padded_to"] == {"n": 1000}
    assert [(s["shape"]["n"], s["grid"], s["larger_grid"]) for s in bucket0["shapes"]] == \
        [(1, [1], [4]), (500, [2], [4]), (700, [3], [4]), (700, [3], [6])]
    assert all(s["cost"] is not None for s in bucket0["shapes"][:3])
    assert "cost" not in bucket0["shapes"][3]  # the doubled grid is checked, not timed
    assert add["buckets"][2]["padded_to"] == {"n": 16000}
    assert add["max_cost"] is not None and add["max_cost"] <= 1.25
    assert kernel_entry(manifest, "vector_add")["grid_tolerance"] == \
        {"proof": "gpu", "max": {"n": 16000}}
    # n = 1 padded to 1000: each guard as long as the tensor at n = 1000, not 4 elements.
    assert ("out_ptr", 1000) in backend.guard_sizes

    softmax = kernel_entry(tuning, "softmax")["grid_tolerance"]
    assert softmax["verdict"] == grid_proof.REFUSED
    assert "wrote past 'out_ptr'" in softmax["reason"] and "bucket [0]" in softmax["reason"]
    assert "grid_tolerance" not in kernel_entry(manifest, "softmax")
    validate_manifest(manifest, tmp_path / "pack")
    assert json.loads((tmp_path / "pack" / "tuning.json").read_text()) == tuning


def test_padding_that_costs_too_much_keeps_exact_grids(tmp_path):
    backend = GridModelBackend(cost_per_program=100.0, fixed_cost=1.0)
    manifest, tuning = builder.build([write_spec(tmp_path, softmax_tolerant=False)],
                                     tmp_path / "pack", backend=backend, log=None)
    add = kernel_entry(tuning, "vector_add")["grid_tolerance"]
    assert add["verdict"] == grid_proof.TOO_COSTLY
    assert "above the spec's grid_cost_limit 1.25" in add["reason"]
    assert "grid_tolerance" not in kernel_entry(manifest, "vector_add")
    assert "grid_tolerance" not in kernel_entry(tuning, "softmax")  # not asserted


def test_a_kernel_computing_other_bits_at_a_larger_grid_is_refused(tmp_path, monkeypatch):
    def sloppy(config, args, grid):  # the last program also scales what it stores
        vector_add_model(config, args, grid)
        args["out_ptr"][: min(len(args["out_ptr"]), grid[0])] *= 2
    monkeypatch.setitem(MODELS, "vector_add", sloppy)
    manifest, tuning = builder.build([write_spec(tmp_path, softmax_tolerant=False)],
                                     tmp_path / "pack", backend=GridModelBackend(), log=None)
    add = kernel_entry(tuning, "vector_add")["grid_tolerance"]
    assert add["verdict"] == grid_proof.REFUSED
    assert "shape {'n': 500}: the grid [4] computed other bits than the exact [2]" in add["reason"]
    assert "output 'out_ptr'" in add["reason"]
    assert "grid_tolerance" not in kernel_entry(manifest, "vector_add")


def test_without_a_gpu_the_assertion_is_written_unproven(tmp_path):
    lines = []
    manifest, tuning = builder.build([write_spec(tmp_path)], tmp_path / "pack", tune=False,
                                     log=lines.append)
    for name in ("vector_add", "softmax"):
        entry = kernel_entry(tuning, name)["grid_tolerance"]
        assert entry["verdict"] == grid_proof.UNPROVEN
        assert "--no-tune was given" in entry["reason"]
        assert any(f"kernel '{name}': grid tolerance asserted by the spec, UNPROVEN" in line
                   for line in lines)
    assert kernel_entry(manifest, "vector_add")["grid_tolerance"] == \
        {"proof": "asserted", "max": {"n": 16000}}
    assert kernel_entry(manifest, "softmax")["grid_tolerance"] == {"proof": "asserted"}
    assert manifest["format"] == "kpack/2"
    validate_manifest(manifest, tmp_path / "pack")


def test_reused_tuning_keeps_a_gpu_verdict(tmp_path):
    _, tuned = builder.build([write_spec(tmp_path)], tmp_path / "tuned",
                             backend=GridModelBackend(cost_per_program=0.01), log=None)
    manifest, tuning = builder.build([write_spec(tmp_path)], tmp_path / "again", tune=False,
                                     reuse_tuning=tmp_path / "tuned" / "tuning.json", log=None)
    assert kernel_entry(tuning, "vector_add")["grid_tolerance"] == \
        kernel_entry(tuned, "vector_add")["grid_tolerance"]
    assert kernel_entry(manifest, "vector_add")["grid_tolerance"]["proof"] == "gpu"
    assert "grid_tolerance" not in kernel_entry(manifest, "softmax")  # refused then


def test_a_reused_verdict_is_kept_for_its_code_alone(tmp_path):
    _, tuned = builder.build([write_spec(tmp_path)], tmp_path / "tuned",
                             backend=GridModelBackend(cost_per_program=0.01), log=None)
    assert re.fullmatch("[0-9a-f]{64}",
                        kernel_entry(tuned, "vector_add")["grid_tolerance"]["code_sha256"])
    path = tmp_path / "tuned" / "tuning.json"
    # Proven for other code (the kernel or a helper changed since): unproven now.
    other = json.loads(path.read_text())
    kernel_entry(other, "vector_add")["grid_tolerance"]["code_sha256"] = "0" * 64
    path.write_text(json.dumps(other))
    lines = []
    manifest, tuning = builder.build([write_spec(tmp_path)], tmp_path / "again", tune=False,
                                     reuse_tuning=path, log=lines.append)
    entry = kernel_entry(tuning, "vector_add")["grid_tolerance"]
    assert entry["verdict"] == grid_proof.UNPROVEN
    assert "the kernel's code changed since the reused tuning.json's verdict (proven)" \
        in entry["reason"]
    assert kernel_entry(manifest, "vector_add")["grid_tolerance"]["proof"] == "asserted"
    assert any("kernel 'vector_add': grid tolerance proven in the reused tuning.json, but for "
               "other code" in line for line in lines)
    # No code hash (a tuning.json older than the field): kept, with a note.
    del kernel_entry(other, "vector_add")["grid_tolerance"]["code_sha256"]
    path.write_text(json.dumps(other))
    lines = []
    manifest, tuning = builder.build([write_spec(tmp_path)], tmp_path / "legacy", tune=False,
                                     reuse_tuning=path, log=lines.append)
    assert kernel_entry(tuning, "vector_add")["grid_tolerance"]["verdict"] == grid_proof.PROVEN
    assert kernel_entry(manifest, "vector_add")["grid_tolerance"]["proof"] == "gpu"
    assert any("kernel 'vector_add': the reused grid-tolerance verdict records no code hash"
               in line for line in lines)


@pytest.mark.parametrize("extra, message", [
    ("grid_max={'n': 4000}", "grid_max['n'] = 4000 must be an integer above the last edge 4000"),
    ("grid_max={'x_ptr': 9}", "grid_max: 'x_ptr' is not a bucket parameter"),
    ("grid_cost_limit=0.5", "grid_cost_limit must be a number >= 1"),
])
def test_bad_grid_tolerance_fields_are_spec_errors(tmp_path, extra, message):
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_specs(write_spec(tmp_path, add_extra=extra))


def test_grid_max_needs_grid_tolerant(tmp_path):
    path = write_spec(tmp_path).read_text().replace(
        "grid_tolerant=True, grid_max", "grid_tolerant=False, grid_max")
    (tmp_path / "other.py").write_text(path)
    with pytest.raises(SpecError, match="grid_max is set but grid_tolerant is not"):
        load_specs(tmp_path / "other.py")


def test_committed_graphpack_is_its_spec_built_without_tuning(tmp_path):
    """kernels/graphpack (bench/graph_bench's and the graph tests' pack) is exactly what
    kernels/examples/graph_step.py builds with --no-tune: tolerance asserted, unproven."""
    committed = REPO / "kernels" / "graphpack"
    out = tmp_path / "graphpack"
    manifest, _ = builder.build([REPO / "kernels" / "examples" / "graph_step.py"], out,
                                tune=False, log=None)
    files = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    for name in files:
        assert (committed / name).read_bytes() == (out / name).read_bytes(), name
    assert {k["name"]: k.get("grid_tolerance") for k in manifest["kernels"]} == {
        "vector_add": {"proof": "asserted"}, "matmul_fp16": {"proof": "asserted"},
        "softmax": None, "layer_norm": None}
    validate_manifest(manifest, committed)


def test_the_proof_pads_exactly_what_step_graphs_pad():
    """bucket_bounds is kpack's C++ rule (PaddingInterval in src/graph/graph_grid.h),
    reached through the extension: each bucket from its lowest value but from 1, where
    empty work ends (a graph keeps exact, empty grids for sizes below 1), to its upper
    edge or grid_max; None where graphs keep exact grids."""
    from types import SimpleNamespace

    from kpack._kpack import graph_padding

    assert graph_padding([1000, 4000], None, 0) == (1, 1000)
    assert graph_padding([1000, 4000], None, 1) == (1001, 4000)
    assert graph_padding([1000, 4000], None, 2) is None
    assert graph_padding([1000, 4000], 9000, 2) == (4001, 9000)
    assert graph_padding([0, 8], None, 0) is None
    assert graph_padding([0, 8], None, 1) == (1, 8)

    spec = SimpleNamespace(buckets=[SimpleNamespace(param="M", edges=[0, 8]),
                                    SimpleNamespace(param="N", edges=[64])],
                           grid_max={"N": 256})
    assert grid_proof.bucket_bounds(spec, (0, 0)) == [None, (1, 64)]
    assert grid_proof.bucket_bounds(spec, (1, 1)) == [(1, 8), (65, 256)]
    assert grid_proof.padded_values(spec, (0, 1)) == {"N": 256}
    # No shape the proof runs has a padded size below 1.
    for index in ((0, 0), (1, 0), (2, 1)):
        for shape in grid_proof.shapes_across(spec, index, {"M": 5, "N": 40}):
            assert shape["N"] >= 1


@pytest.mark.parametrize("extra, changed", [
    ("grid_max={'n': 1 << 20}", "the values the buckets pad to changed (bucket edges or "
                                "grid_max)"),
    ("grid_max={'n': 16000}, grid_cost_limit=1.1", "the spec's grid_cost_limit changed "
                                                    "(1.25 to 1.1)"),
])
def test_a_reused_verdict_is_kept_only_for_what_it_checked(tmp_path, extra, changed):
    # Proven with the last bucket padded to 16000 and a cost limit of 1.25: a spec padding
    # further, or asking a lower cost, has a verdict nothing reached.
    _, tuned = builder.build([write_spec(tmp_path)], tmp_path / "tuned",
                             backend=GridModelBackend(cost_per_program=0.01), log=None)
    assert kernel_entry(tuned, "vector_add")["grid_tolerance"]["verdict"] == grid_proof.PROVEN
    assert kernel_entry(tuned, "vector_add")["grid_tolerance"]["grid"] == ["cdiv(n, BLOCK)"]
    lines = []
    (tmp_path / "changed").mkdir()
    manifest, tuning = builder.build([write_spec(tmp_path / "changed", add_extra=extra)],
                                     tmp_path / "again", tune=False,
                                     reuse_tuning=tmp_path / "tuned" / "tuning.json",
                                     log=lines.append)
    entry = kernel_entry(tuning, "vector_add")["grid_tolerance"]
    assert entry["verdict"] == grid_proof.UNPROVEN
    assert f"{changed} since the reused tuning.json's verdict (proven)" in entry["reason"]
    assert kernel_entry(manifest, "vector_add")["grid_tolerance"]["proof"] == "asserted"
    # The same spec keeps it (the test above), and so does a refusal reached with fewer
    # buckets than the spec has.
    assert kernel_entry(tuning, "softmax")["grid_tolerance"]["verdict"] == grid_proof.REFUSED
