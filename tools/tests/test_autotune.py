"""Tuning that checks before it times (``kpack_tools.autotune`` through ``build``), and
build specs whose grid the caller passes, on the CPU.

The GPU is replaced by a backend that runs a numpy model of each config (the way the
real kernel behaves for it) and reports set times; everything else -- spec checks, the
check against the reference or the default config, exclusion, tuning.json, compiling
the chosen configs into a pack -- is the real code.  The GPU version of the first test
is tests/gpu/tune_check.py.
"""

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kpack_tools import build as builder
from kpack_tools.autotune import compare, jit_launcher
from kpack_tools.spec import load_specs
from pack_validator import validate_manifest

REPO = Path(__file__).resolve().parents[2]

# A single-pass RMS norm in the style of public kernels: BLOCK_SIZE must cover the row,
# a smaller one silently skips the columns past it. Buckets on the row length.
# The kernel is the GPU check's (tests/gpu/tune_check_spec.py); the inputs are numpy.
SPEC = textwrap.dedent('''
    import sys
    import numpy as np
    sys.path.insert(0, "GPU_DIR")
    from tune_check_spec import rms_norm_kernel
    sys.path.pop(0)
    from kpack_tools.spec import Bucket, Config, KernelSpec

    def make_inputs(shape, device):
        rng = np.random.default_rng(shape["N"])
        m, n = shape["n_rows"], shape["N"]
        return {"X": rng.standard_normal((m, n)).astype(np.float32),
                "Y": np.zeros((m, n), np.float32),
                "W": rng.standard_normal(n).astype(np.float32),
                "stride": n, "N": n, "eps": 1e-6, "n_rows": m}

    def reference(args):
        x = args["X"].astype(np.float64)
        rstd = 1 / np.sqrt((x * x).mean(axis=1, keepdims=True) + args["eps"])
        return {"Y": (x * rstd * args["W"]).astype(np.float32)}

    CONFIGS = [Config("b128", {"BLOCK_SIZE": 128}, num_warps=1),
               Config("b256", {"BLOCK_SIZE": 256}, num_warps=2),
               Config("b512", {"BLOCK_SIZE": 512}, num_warps=4)]

    KPACK_KERNELS = [KernelSpec(
        name="rms_norm", fn=rms_norm_kernel,
        params=[("X", "*fp32"), ("Y", "*fp32"), ("W", "*fp32"), ("stride", "i32"),
                ("N", "i32"), ("eps", "fp32"), ("BLOCK_SIZE", "constexpr")],
        configs=CONFIGS, default=DEFAULT,
        grid=["n_rows"], launch_values=["n_rows"],
        buckets=[Bucket("N", [128, 256])],
        representatives=[{"n_rows": 8, "N": 100}, {"n_rows": 8, "N": 200},
                         {"n_rows": 8, "N": REP2}],
        make_inputs=make_inputs, outputs=["Y"], REFERENCE
        readonly=["X", "W"], EXTRA)]
''')


def write_spec(tmp_path, name="rms_spec", default='["b128", "b256", "b512"]', rep2=400,
               reference="reference=reference,", extra=""):
    path = tmp_path / f"{name}.py"
    path.write_text(SPEC.replace("GPU_DIR", str(REPO / "tests" / "gpu"))
                    .replace("DEFAULT", default).replace("REP2", str(rep2))
                    .replace("REFERENCE", reference).replace("EXTRA", extra))
    return path


class ModelBackend:
    """Runs a numpy model of the kernel per config; times are set per config."""

    device = "model GPU"

    def __init__(self, times, model=None):
        self.times = times
        self.model = model or rms_norm_model
        self.runs = []

    def inputs(self, spec, shape):
        return dict(spec.make_inputs(dict(shape), "cpu"))

    def copy(self, args):
        return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in args.items()}

    def run(self, spec, config, args):
        self.runs.append(config.name)
        self.model(config, args)

    def time(self, spec, config, args, reps, warmup):
        return self.times[config.name]


def rms_norm_model(config, args):
    """What rms_norm_kernel computes with this config: columns past BLOCK_SIZE are
    skipped (left as they were) and left out of the sum."""
    block, n = config.constexprs["BLOCK_SIZE"], args["N"]
    seen = min(block, n)
    x = args["X"][:, :seen].astype(np.float32)
    rstd = np.float32(1) / np.sqrt((x * x).sum(axis=1, keepdims=True) / np.float32(n)
                                   + np.float32(args["eps"]))
    args["Y"][:, :seen] = x * rstd * args["W"][:seen]


FAST_SMALL = {"b128": 1.0, "b256": 2.0, "b512": 3.0}  # the smallest block is fastest


def test_wrong_fastest_candidate_is_excluded_and_recorded(tmp_path):
    spec = write_spec(tmp_path)
    backend = ModelBackend(FAST_SMALL)
    manifest, tuning = builder.build([spec], tmp_path / "pack", backend=backend, log=None)
    buckets = tuning["kernels"][0]["buckets"]
    assert tuning["tuned"] and tuning["device"] == "model GPU"
    assert [b["chosen"] for b in buckets] == ["b128", "b256", "b512"]
    assert buckets[0]["mismatches"] == {}
    assert set(buckets[1]["mismatches"]) == {"b128"}
    assert set(buckets[2]["mismatches"]) == {"b128", "b256"}
    assert "output 'Y': " in buckets[2]["mismatches"]["b256"] \
        and "outside rtol 0.0001, atol 1e-05" in buckets[2]["mismatches"]["b256"]
    assert buckets[2]["times_us"] == {"b128": None, "b256": None, "b512": 3.0}
    assert buckets[2]["checked_against"].startswith("reference, Y: rtol 0.0001 atol 1e-05")
    on_disk = json.loads((tmp_path / "pack" / "tuning.json").read_text())
    assert on_disk == tuning and on_disk["format"] == "kpack-tuning/2"
    # The pack serves each bucket with the config that passed.
    kernel = manifest["kernels"][0]
    assert [(v["bucket"], v["constexprs"]["BLOCK_SIZE"]) for v in kernel["variants"]] == \
        [([0], 128), ([1], 256), ([2], 512)]
    assert validate_manifest(manifest, tmp_path / "pack") == []


def test_without_the_check_the_fastest_wrong_config_would_win(tmp_path):
    """The model really is wrong for short blocks: what the old tuner picked."""
    spec = load_specs(write_spec(tmp_path))[0]
    args = spec.make_inputs({"n_rows": 8, "N": 400}, "cpu")
    ref = spec.reference(args)["Y"]
    rms_norm_model(spec.config("b128"), args)
    assert compare("Y", args["Y"], ref, (1e-5, 1e-6)) is not None
    args = spec.make_inputs({"n_rows": 8, "N": 400}, "cpu")
    rms_norm_model(spec.config("b512"), args)
    assert compare("Y", args["Y"], ref, (1e-5, 1e-6)) is None


def test_a_bucket_where_no_candidate_passes_is_refused(tmp_path):
    spec = write_spec(tmp_path, rep2=1000)  # longer than every BLOCK_SIZE
    with pytest.raises(builder.BuildError) as err:
        builder.build([spec], tmp_path / "pack", backend=ModelBackend(FAST_SMALL), log=None)
    text = str(err.value)
    assert "kernel 'rms_norm': bucket [2] (N >= 257)" in text
    assert "no candidate config passed the check against the reference" in text
    assert "'b512': output 'Y':" in text
    assert not (tmp_path / "pack").exists()


def test_config_allowed_restricts_candidates_per_bucket(tmp_path):
    spec = write_spec(tmp_path, extra="config_allowed=lambda shape, c: "
                                      "c.constexprs['BLOCK_SIZE'] >= shape['N'],")
    backend = ModelBackend(FAST_SMALL)
    _, tuning = builder.build([spec], tmp_path / "pack", backend=backend, log=None)
    buckets = tuning["kernels"][0]["buckets"]
    assert [b["chosen"] for b in buckets] == ["b128", "b256", "b512"]
    assert set(buckets[2]["excluded"]) == {"b128", "b256"}
    assert buckets[2]["mismatches"] == {}
    assert "config_allowed is False" in buckets[2]["excluded"]["b128"]
    # Excluded configs never ran: b128 only in bucket 0, b512 in all three.
    assert backend.runs.count("b128") == 1 and backend.runs.count("b512") == 3


def test_default_config_excluded_by_the_predicate_is_a_spec_error(tmp_path):
    from kpack_tools.spec import SpecError
    spec = write_spec(tmp_path, default='"b128"',
                      extra="config_allowed=lambda shape, c: "
                            "c.constexprs['BLOCK_SIZE'] >= shape['N'],")
    with pytest.raises(SpecError, match=r"default config 'b128' of bucket \[1\] "
                                        r"\(129 <= N <= 256\) is excluded by config_allowed"):
        load_specs(spec)


def test_without_reference_deterministic_compares_bitwise_with_the_default(tmp_path):
    spec = write_spec(tmp_path, reference="", extra="deterministic=True,")
    _, tuning = builder.build([spec], tmp_path / "pack", backend=ModelBackend(FAST_SMALL),
                              log=None)
    buckets = tuning["kernels"][0]["buckets"]
    assert buckets[2]["checked_against"] == "default config 'b512', bitwise"
    assert set(buckets[2]["mismatches"]) == {"b128", "b256"}
    assert "differ bitwise from the default config's" in buckets[2]["mismatches"]["b128"]
    assert [b["chosen"] for b in buckets] == ["b128", "b256", "b512"]


def test_without_reference_a_stated_tolerance_absorbs_rounding(tmp_path):
    """A correct config that rounds differently passes the default-config comparison
    within the tolerance; bitwise it would not."""
    def model(config, args):
        rms_norm_model(config, args)
        if config.name == "b512":  # a different summation order: one ulp off
            args["Y"] = np.nextafter(args["Y"], np.float32(np.inf), dtype=np.float32)

    spec = write_spec(tmp_path, default='"b512"', reference="")
    times = {"b128": 3.0, "b256": 2.0, "b512": 1.0}
    _, tuning = builder.build([spec], tmp_path / "p1", backend=ModelBackend(times, model),
                              log=None)
    bucket0 = tuning["kernels"][0]["buckets"][0]
    assert bucket0["checked_against"] == "default config 'b512', Y: rtol 0.0001 atol 1e-05"
    assert bucket0["mismatches"] == {} and bucket0["chosen"] == "b512"
    spec = write_spec(tmp_path, name="rms_det", default='"b512"', reference="",
                      extra="deterministic=True,")
    _, tuning = builder.build([spec], tmp_path / "p2", backend=ModelBackend(times, model),
                              log=None)
    assert set(tuning["kernels"][0]["buckets"][0]["mismatches"]) == {"b128", "b256"}


def test_outputs_are_required_to_tune(tmp_path):
    spec = write_spec(tmp_path).read_text().replace('outputs=["Y"], ', "")
    path = tmp_path / "no_outputs.py"
    path.write_text(spec)
    with pytest.raises(builder.BuildError, match="names no `outputs`"):
        builder.build([path], tmp_path / "pack", backend=ModelBackend(FAST_SMALL), log=None)


def test_reuse_tuning_keeps_the_chosen_configs(tmp_path):
    spec = write_spec(tmp_path)
    _, tuned = builder.build([spec], tmp_path / "tuned", backend=ModelBackend(FAST_SMALL),
                             log=None)
    lines = []
    manifest, again = builder.build([spec], tmp_path / "again", tune=False, log=lines.append,
                                    reuse_tuning=tmp_path / "tuned" / "tuning.json")
    kernel = again["kernels"][0]
    assert again["tuned"] is False  # this run tuned nothing ...
    # ... and says where the configs came from, not that it used the spec's defaults.
    reused = f"configs of rms_norm from {tmp_path / 'tuned' / 'tuning.json'}"
    assert again["reason"] == f"not tuned: --no-tune was given; {reused}"
    assert lines[0] == f"not tuning (--no-tune was given): {reused}"
    assert lines[-1].endswith(f"not tuned: --no-tune was given; {reused}")
    assert not [line for line in lines if "default config" in line], lines
    assert kernel["tuned"] is True and kernel["device"] == "model GPU"  # ... it reused
    assert kernel["buckets"] == tuned["kernels"][0]["buckets"]
    assert [v["constexprs"]["BLOCK_SIZE"] for v in manifest["kernels"][0]["variants"]] == \
        [128, 256, 512]
    # A config that changed since is refused, not silently reused.
    changed = tmp_path / "changed"
    changed.mkdir()
    path = write_spec(changed, name="rms_spec")
    path.write_text(path.read_text().replace('{"BLOCK_SIZE": 256}, num_warps=2',
                                             '{"BLOCK_SIZE": 256}, num_warps=4'))
    with pytest.raises(builder.BuildError, match="config 'b256' is .* there and .* in the spec"):
        builder.build([path], tmp_path / "p3", tune=False, log=None,
                      reuse_tuning=tmp_path / "tuned" / "tuning.json")
    # So is a tuning chosen for another GPU.
    with pytest.raises(builder.BuildError, match=r"its configs were chosen for sm_90; this "
                                                 r"build targets sm_80"):
        builder.build([spec], tmp_path / "p4", target=80, tune=False, log=None,
                      reuse_tuning=tmp_path / "tuned" / "tuning.json")


def test_retune_buckets_tunes_only_those_and_reuses_the_others(tmp_path):
    spec = write_spec(tmp_path, default='"b512"')
    tuned_path = tmp_path / "tuned" / "tuning.json"
    _, tuned = builder.build([spec], tmp_path / "tuned", backend=ModelBackend(FAST_SMALL),
                             log=None)
    old = tuned["kernels"][0]["buckets"]
    assert [b["chosen"] for b in old] == ["b128", "b256", "b512"]
    # Now b512 is fastest everywhere: a full tuning would take it in every bucket.
    backend = ModelBackend({"b128": 3.0, "b256": 2.0, "b512": 1.0})
    lines = []
    _, again = builder.build([spec], tmp_path / "again", backend=backend, log=lines.append,
                             reuse_tuning=tuned_path, retune_buckets=[(1,)])
    kernel = again["kernels"][0]
    assert [b["chosen"] for b in kernel["buckets"]] == ["b128", "b512", "b512"]
    assert kernel["buckets"][0] == old[0] and kernel["buckets"][2] == old[2]
    assert kernel["buckets"][1]["times_us"] == {"b128": None, "b256": 2.0, "b512": 1.0}
    assert backend.runs == ["b128", "b256", "b512"]  # bucket 1's candidates, nothing else
    assert kernel["tuned"] is True and kernel["device"] == "model GPU"
    assert kernel["reused_from"] == str(tuned_path) and kernel["retuned_buckets"] == [[1]]
    assert f"kernel 'rms_norm': buckets [[1]] tuned, the others' configs from {tuned_path}" \
        in lines
    # Without a GPU the bucket takes the spec's default, the others stay as tuned.
    _, untuned = builder.build([spec], tmp_path / "cpu", tune=False, log=None,
                               reuse_tuning=tuned_path, retune_buckets=[(1,)])
    kernel = untuned["kernels"][0]
    assert [b["chosen"] for b in kernel["buckets"]] == ["b128", "b512", "b512"]
    assert kernel["buckets"][1]["times_us"] is None and kernel["buckets"][0] == old[0]
    assert kernel["tuned"] is False and kernel["device"] is None
    assert untuned["reason"] == (f"not tuned: --no-tune was given; configs of rms_norm from "
                                 f"{tuned_path} but buckets [[1]]: the spec's default configs")


def test_reuse_tuning_refuses_a_choice_the_spec_no_longer_offers(tmp_path):
    """A bucket pinned to another config after the tuning: the old choice is refused,
    naming the bucket, until that bucket is tuned again (here on the CPU: the pin, the
    bucket's default)."""
    spec = write_spec(tmp_path)
    tuned_path = tmp_path / "tuned" / "tuning.json"
    builder.build([spec], tmp_path / "tuned", backend=ModelBackend(FAST_SMALL), log=None)
    pinned = write_spec(tmp_path, name="pinned", default='["b128", "b512", "b512"]',
                        extra="config_allowed=lambda shape, c: shape['N'] <= 128 or "
                              "shape['N'] > 256 or c.name == 'b512',")
    with pytest.raises(builder.BuildError,
                       match=r"kernel 'rms_norm': bucket \[1\] \(129 <= N <= 256\) chose "
                             r"'b256' there, which the spec no longer offers for that "
                             r"bucket; tune it again \(--retune-buckets 1\)"):
        builder.build([pinned], tmp_path / "p1", tune=False, log=None,
                      reuse_tuning=tuned_path)
    assert not (tmp_path / "p1").exists()
    _, again = builder.build([pinned], tmp_path / "p2", tune=False, log=None,
                             reuse_tuning=tuned_path, retune_buckets=[(1,)])
    assert [b["chosen"] for b in again["kernels"][0]["buckets"]] == ["b128", "b512", "b512"]
    # An experiment asks for the old choice outside the list (llama_variant_sweep.py).
    manifest, kept = builder.build([pinned], tmp_path / "p3", tune=False, log=None,
                                   reuse_tuning=tuned_path, reuse_unlisted=True)
    assert [b["chosen"] for b in kept["kernels"][0]["buckets"]] == ["b128", "b256", "b512"]
    assert [v["constexprs"]["BLOCK_SIZE"] for v in manifest["kernels"][0]["variants"]] == \
        [128, 256, 512]


def test_retune_buckets_refuses_what_it_cannot_do(tmp_path):
    spec = write_spec(tmp_path)
    with pytest.raises(builder.BuildError, match="needs --reuse-tuning"):
        builder.build([spec], tmp_path / "p1", tune=False, log=None, retune_buckets=[(1,)])
    builder.build([spec], tmp_path / "tuned", backend=ModelBackend(FAST_SMALL), log=None)
    with pytest.raises(builder.BuildError, match=r"--retune-buckets: kernel 'rms_norm' has no "
                                                 r"bucket \[5\]; its buckets are \[\[0\], "
                                                 r"\[1\], \[2\]\]"):
        builder.build([spec], tmp_path / "p2", tune=False, log=None, retune_buckets=[(5,)],
                      reuse_tuning=tmp_path / "tuned" / "tuning.json")
    assert not (tmp_path / "p2").exists()
    # The command line: bucket indices as variant names write them, of every kernel or,
    # after a kernel's name, of that one; and only with a file.
    assert builder._bucket_list("1,0_2") == [(1,), (0, 2)]
    assert builder._bucket_list("llama_o_proj:3,1,k2:0_2") == [
        ("llama_o_proj", (3,)), (1,), ("k2", (0, 2))]
    for bad in ("", "a", "1,", "-1", ":1", "o proj:1", "k:", "k:a", "k:-1", "k:1:2"):
        with pytest.raises(Exception, match="not a comma-separated list of bucket indices"):
            builder._bucket_list(bad)
    with pytest.raises(SystemExit) as exit_:
        builder.main([str(spec), "--out", str(tmp_path / "p3"), "--retune-buckets", "1"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        builder.main([str(spec), "--out", str(tmp_path / "p4"), "--reuse-unlisted"])
    assert exit_.value.code == 2
    assert not (tmp_path / "p3").exists() and not (tmp_path / "p4").exists()


def two_kernel_spec(tmp_path, name="two", default='["b128", "b256", "b512"]', extra=""):
    """write_spec's rms_norm plus the same kernel again as 'rms_norm2'."""
    path = write_spec(tmp_path, name=name, default=default, extra=extra)
    text = path.read_text()
    body = text[text.index("KPACK_KERNELS = [") + len("KPACK_KERNELS = ["):text.rindex("]")]
    path.write_text(text[:text.rindex("]")] + ", "
                    + body.replace('name="rms_norm"', 'name="rms_norm2"') + "]\n")
    return path


def test_retune_buckets_of_one_kernel(tmp_path):
    """KERNEL:B retunes that kernel's bucket only: a pin added to one kernel is rebuilt
    in one command, every other choice reused."""
    spec = two_kernel_spec(tmp_path)
    tuned_path = tmp_path / "tuned" / "tuning.json"
    _, tuned = builder.build([spec], tmp_path / "tuned", backend=ModelBackend(FAST_SMALL),
                             log=None)
    assert [[b["chosen"] for b in k["buckets"]] for k in tuned["kernels"]] == \
        [["b128", "b256", "b512"]] * 2
    # rms_norm2's bucket 1 pinned to b512 (its default there): the whole reuse is refused
    # until that bucket is retuned, and retuning it leaves rms_norm untouched.
    pinned = two_kernel_spec(tmp_path, name="pinned", default='["b128", "b512", "b512"]',
                             extra="config_allowed=lambda shape, c: shape['N'] <= 128 or "
                                   "shape['N'] > 256 or c.name == 'b512',")
    text = pinned.read_text()
    first = text.index("config_allowed=")
    pinned.write_text(text[:first] + text[first:].replace(
        "config_allowed=lambda shape, c: shape['N'] <= 128 or shape['N'] > 256 or "
        "c.name == 'b512',", "", 1))  # rms_norm keeps every candidate
    with pytest.raises(builder.BuildError, match=r"kernel 'rms_norm2': bucket \[1\]"):
        builder.build([pinned], tmp_path / "p0", tune=False, log=None,
                      reuse_tuning=tuned_path)
    lines = []
    _, again = builder.build([pinned], tmp_path / "p1", tune=False, log=lines.append,
                             reuse_tuning=tuned_path, retune_buckets=[("rms_norm2", (1,))])
    first, second = again["kernels"]
    assert first == dict(tuned["kernels"][0], reused_from=str(tuned_path))
    assert [b["chosen"] for b in second["buckets"]] == ["b128", "b512", "b512"]
    assert second["buckets"][0] == tuned["kernels"][1]["buckets"][0]
    assert second["retuned_buckets"] == [[1]] and "retuned_buckets" not in first
    assert again["reason"] == (f"not tuned: --no-tune was given; configs of rms_norm, "
                               f"rms_norm2 from {tuned_path} but buckets [[1]] of rms_norm2: "
                               f"the spec's default configs")
    # The same through the command line, and the errors that name what is wrong.
    assert builder.main([str(pinned), "--out", str(tmp_path / "p2"), "--no-tune",
                         "--reuse-tuning", str(tuned_path),
                         "--retune-buckets", "rms_norm2:1"]) == 0
    assert json.loads((tmp_path / "p2" / "tuning.json").read_text())["kernels"] == \
        again["kernels"]
    with pytest.raises(builder.BuildError, match=r"--retune-buckets nope:1: no kernel 'nope' "
                                                 r"in the specs \(rms_norm, rms_norm2\)"):
        builder.build([pinned], tmp_path / "p3", tune=False, log=None,
                      reuse_tuning=tuned_path, retune_buckets=[("nope", (1,))])
    with pytest.raises(builder.BuildError, match=r"kernel 'rms_norm2' has no bucket \[7\]"):
        builder.build([pinned], tmp_path / "p4", tune=False, log=None,
                      reuse_tuning=tuned_path, retune_buckets=[("rms_norm2", (7,))])
    only_first = tmp_path / "only_first.json"
    only_first.write_text(json.dumps(dict(tuned, kernels=tuned["kernels"][:1])))
    with pytest.raises(builder.BuildError, match=r"--retune-buckets rms_norm2:1: "
                                                 r"--reuse-tuning .* does not list kernel "
                                                 r"'rms_norm2'"):
        builder.build([pinned], tmp_path / "p5", tune=False, log=None,
                      reuse_tuning=only_first, retune_buckets=[("rms_norm2", (1,))])
    assert not any((tmp_path / f"p{i}").exists() for i in (0, 3, 4, 5))


def test_jit_tasks_cover_the_tuned_buckets_and_the_proof_configs(tmp_path):
    spec = load_specs(write_spec(tmp_path))[0]
    reused = {"rms_norm": [{"chosen": "b128"}, {"chosen": "b256"}, {"chosen": "b512"}]}
    every = ["b128", "b256", "b512"]
    assert builder.jit_tasks([spec], {}, {}) == [("rms_norm", i, every) for i in range(3)]
    assert builder.jit_tasks([spec], reused, {}) == []  # no grid proof to run
    assert builder.jit_tasks([spec], reused, {"rms_norm": {(1,)}}) == [("rms_norm", 1, every)]
    assert builder.jit_tasks([spec], reused, {"other": {(1,)}}) == []
    tolerant = load_specs(write_spec(tmp_path, name="tolerant", extra="grid_tolerant=True,"))[0]
    assert builder.jit_tasks([tolerant], reused, {"rms_norm": {(1,)}}) == [
        ("rms_norm", 0, ["b128"]), ("rms_norm", 1, every), ("rms_norm", 2, ["b512"])]


# ---------------------------------------------------------------------------
# Grids the caller can express
# ---------------------------------------------------------------------------

def test_grid_over_a_launch_value_is_for_the_builder_only(tmp_path):
    spec = load_specs(write_spec(tmp_path))[0]
    assert spec.manifest_grid is None  # the runtime cannot know n_rows
    launched = {}

    class Fn:
        def __getitem__(self, grid):
            def launch(**kwargs):
                launched.update(grid=grid, kwargs=kwargs)
            return launch

    args = spec.make_inputs({"n_rows": 5, "N": 100}, "cpu")
    jit_launcher(spec, spec.config("b128"), args, fn=Fn())()
    assert launched["grid"] == (5,)
    assert "n_rows" not in launched["kwargs"] and launched["kwargs"]["BLOCK_SIZE"] == 128
    manifest, _ = builder.build([write_spec(tmp_path, name="p")], tmp_path / "pack",
                                tune=False, log=None)
    assert "grid" not in manifest["kernels"][0]


def test_grid_may_be_omitted_and_launch_values_are_checked(tmp_path):
    from kpack_tools.spec import SpecError
    text = write_spec(tmp_path).read_text()
    no_grid = tmp_path / "no_grid.py"
    no_grid.write_text(text.replace('grid=["n_rows"], launch_values=["n_rows"],', ""))
    manifest, _ = builder.build([no_grid], tmp_path / "pack", tune=False, log=None)
    assert "grid" not in manifest["kernels"][0]
    with pytest.raises(builder.BuildError, match="has no grid, so the builder cannot launch"):
        builder.build([no_grid], tmp_path / "p2", backend=ModelBackend(FAST_SMALL), log=None)
    unknown = tmp_path / "unknown.py"
    unknown.write_text(text.replace('launch_values=["n_rows"],', ""))
    with pytest.raises(SpecError, match="grid\\[0\\]: 'n_rows': unknown name 'n_rows'"):
        load_specs(unknown)
    clash = tmp_path / "clash.py"
    clash.write_text(text.replace('launch_values=["n_rows"]', 'launch_values=["n_rows", "N"]'))
    with pytest.raises(SpecError, match="launch_values: 'N' is a parameter of the kernel"):
        load_specs(clash)
    param_grid = tmp_path / "param_grid.py"
    param_grid.write_text(text.replace('grid=["n_rows"]', 'grid=["N"]'))
    assert load_specs(param_grid)[0].manifest_grid == ["N"]


def test_readonly_and_source_are_written(tmp_path):
    from kpack_tools.spec import SpecError
    path = write_spec(tmp_path)
    manifest, _ = builder.build([path], tmp_path / "pack", tune=False, log=None)
    kernel = manifest["kernels"][0]
    assert manifest["format"] == "kpack/2"
    assert [p["name"] for p in kernel["params"] if p.get("readonly")] == ["X", "W"]
    spec = load_specs(path)[0]
    import hashlib
    assert kernel["source"] == {"qualname": "tune_check_spec.rms_norm_kernel",
                                "sha256": hashlib.sha256(spec.fn.src.encode()).hexdigest()}
    assert spec.fn.src.startswith("def rms_norm_kernel(")
    bad = tmp_path / "bad.py"
    bad.write_text(path.read_text().replace('readonly=["X", "W"]', 'readonly=["X", "Y", "N"]'))
    with pytest.raises(SpecError, match="readonly: 'N' is not a pointer parameter"):
        load_specs(bad)
    bad.write_text(path.read_text().replace('readonly=["X", "W"]', 'readonly=["Y"]'))
    with pytest.raises(SpecError, match=r"\['Y'\] are both outputs and readonly"):
        load_specs(bad)


class _Tensor:
    """A stand-in tensor: numpy values with clone() and a dtype with itemsize, named as
    Triton's TensorDescriptor lets through without a device pointer."""

    def __init__(self, values):
        self.values = np.array(values, dtype=np.float32)
        self.shape = self.values.shape
        self.dtype = self.values.dtype

    def clone(self):
        return _Tensor(self.values.copy())

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)


_Tensor.__name__ = "FakeTensor"


def test_descriptor_outputs_are_copied_and_compared_by_their_tensor():
    # build-spec.md: make_inputs may give a TensorDescriptor; each run then needs its own
    # tensor under it, and outputs compare by that tensor.
    from triton.tools.tensor_descriptor import TensorDescriptor

    from kpack_tools.autotune import CudaBackend
    desc = TensorDescriptor(_Tensor(np.zeros((4, 8))), [4, 8], [8, 1], [4, 8])
    copied = CudaBackend("cuda").copy({"out": desc, "n": 3})
    assert copied["n"] == 3
    assert copied["out"].base is not desc.base and copied["out"].block_shape == [4, 8]
    copied["out"].base.values[1, 2] = 1.0
    assert desc.base.values[1, 2] == 0.0, "the pristine tensor is untouched"
    assert compare("out", copied["out"], desc, (0.0, 1.0)) is None
    assert "1 of 32 elements" in compare("out", copied["out"], desc, (0.0, 0.5))
    assert compare("out", CudaBackend("cuda").copy({"out": desc})["out"], desc, None) is None
