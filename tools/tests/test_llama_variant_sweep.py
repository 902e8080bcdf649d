"""bench/llama_variant_sweep.py without a GPU: the variants file and its errors, the source
edits, a variant pack built and spliced into a copy of kernels/llamapack, and the `time`
step's bookkeeping against a stand-in for kpack-llama (it reports a step time that
depends on the spliced pack, so the medians, the rounds and the splicing are checked)."""

import hashlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("llama_variant_sweep",
                                              REPO / "bench" / "llama_variant_sweep.py")
sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep)


def write(tmp_path, text, name="variants.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_variants_file_is_parsed_with_comments_and_edits(tmp_path):
    vs = sweep.read_variants(write(tmp_path, "# tag kernel bucket config\n\n"
                                   "dn llama_down_proj 0 p1_1_k8192_w16_s1  # pinned\n"
                                   "at llama_attn_decode 0 n64_w4_s3 _DIRECT_TILES=2\n"))
    assert [(v["tag"], v["kernel"], v["bucket"], v["config"], v["edits"]) for v in vs] == [
        ("dn", "llama_down_proj", 0, "p1_1_k8192_w16_s1", {}),
        ("at", "llama_attn_decode", 0, "n64_w4_s3", {"_DIRECT_TILES": 2})]


@pytest.mark.parametrize("text, message", [
    ("a llama_down_proj 0\n", "expected TAG KERNEL BUCKET CONFIG"),
    ("a k 0 c\na k 1 c\n", "tag 'a' must be unique"),
    ("a/b k 0 c\n", "tag 'a/b'"),
    ("a k one c\n", "bucket 'one' is not a bucket index"),
    ("a k 0 c lower=1\n", "source edit 'lower=1' is not NAME=INTEGER"),
    ("a k 0 c _X=big\n", "source edit '_X=big'"),
    ("# nothing\n", "no variants"),
])
def test_variants_file_errors_name_the_line(tmp_path, text, message):
    with pytest.raises(sweep.SweepError, match=message):
        sweep.read_variants(write(tmp_path, text))


def test_source_edits_set_one_constant_and_refuse_unknown_ones():
    text = "A = tl.constexpr(4)\n_B = tl.constexpr(32768)\nC = 5\n"
    assert sweep.edited_source(text, {"_B": 8}) == \
        "A = tl.constexpr(4)\n_B = tl.constexpr(8)\nC = 5\n"
    with pytest.raises(sweep.SweepError, match="no constant `C = tl.constexpr"):
        sweep.edited_source(text, {"C": 1})


@pytest.fixture(scope="module")
def specs():
    import llama_spec  # on the path once the sweep module is loaded
    return {k.name: k for k in llama_spec.ALL_KERNELS}


def test_variant_tuning_chooses_the_config_and_names_what_is_wrong(specs):
    base = json.loads((sweep.PACK / "tuning.json").read_text())
    v = {"tag": "o", "kernel": "llama_o_proj", "bucket": 0, "config": "p1_2_k2048_w2_s1",
         "edits": {}}
    t = sweep.variant_tuning(base, specs, v)
    entry = next(k for k in t["kernels"] if k["name"] == "llama_o_proj")
    assert entry["buckets"][0]["chosen"] == "p1_2_k2048_w2_s1"
    assert "p1_2_k2048_w2_s1" in {c["name"] for c in entry["configs"]}
    assert base != t  # a copy: the committed tuning is untouched
    with pytest.raises(sweep.SweepError, match="no kernel 'llama_nope'"):
        sweep.variant_tuning(base, specs, dict(v, kernel="llama_nope"))
    with pytest.raises(sweep.SweepError, match="variant o: .*p9_9"):
        sweep.variant_tuning(base, specs, dict(v, config="p9_9"))
    with pytest.raises(sweep.SweepError, match="buckets 0-5, not 9"):
        sweep.variant_tuning(base, specs, dict(v, bucket=9))


@pytest.fixture(scope="module")
def variant_dir(tmp_path_factory):
    """One variant pack, built here (Triton compiles sm_90 cubins without a GPU)."""
    tmp = tmp_path_factory.mktemp("variants")
    path = tmp / "v.txt"
    path.write_text("o2 llama_o_proj 0 p1_2_k2048_w4_s1\n")
    assert sweep.main(["build", "--variants", str(path), "--out", str(tmp / "out"),
                       "--jobs", "1"]) == 0
    return tmp / "out"


def test_a_built_variant_splices_into_a_copy_of_the_pack(variant_dir, tmp_path):
    built = json.loads((variant_dir / "o2" / "manifest.json").read_text())
    assert [k["name"] for k in built["kernels"]] == ["llama_o_proj"]
    spliced = sweep.splice(sweep.PACK, variant_dir, ["o2"], tmp_path / "pack")
    before = json.loads((sweep.PACK / "manifest.json").read_text())
    after = json.loads((spliced / "manifest.json").read_text())
    assert [k["name"] for k in after["kernels"]] == [k["name"] for k in before["kernels"]]
    for old, new in zip(before["kernels"], after["kernels"]):
        if new["name"] != "llama_o_proj":
            assert new == old
            continue
        b0 = [v for v in new["variants"] if v["bucket"] == [0]]
        assert {v["constexprs"]["BLOCK_N"] for v in b0} == {2}
        assert [v for v in new["variants"] if v["bucket"] != [0]] == \
            [v for v in old["variants"] if v["bucket"] != [0]]
        for v in new["variants"]:
            data = (spliced / v["cubin"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == v["sha256"]
    with pytest.raises(sweep.SweepError, match="no variant pack"):
        sweep.splice(sweep.PACK, variant_dir, ["missing"], tmp_path / "pack2")
    # A whole pack as the variant: the spliced pack is that pack again, over any base.
    whole = tmp_path / "whole"
    shutil.copytree(sweep.PACK, whole / "tree")
    again = sweep.splice(spliced, whole, ["tree"], tmp_path / "pack3")
    assert json.loads((again / "manifest.json").read_text()) == before
    for kernel in before["kernels"]:
        for v in kernel["variants"]:
            assert (again / v["cubin"]).read_bytes() == (sweep.PACK / v["cubin"]).read_bytes()


def test_splice_writes_one_pack_and_refuses_what_it_cannot(variant_dir, tmp_path, capsys):
    out = tmp_path / "spliced"
    assert sweep.main(["splice", "--variants-dir", str(variant_dir), "--tags", "o2",
                       "--out", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text()) == json.loads(
        (sweep.splice(sweep.PACK, variant_dir, ["o2"], tmp_path / "direct") / "manifest.json")
        .read_text())
    capsys.readouterr()
    assert sweep.main(["splice", "--variants-dir", str(variant_dir), "--tags", "o2",
                       "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    missing = tmp_path / "missing"
    assert sweep.main(["splice", "--variants-dir", str(variant_dir), "--tags", "o2+nope",
                       "--out", str(missing)]) == 2
    assert "no variant pack" in capsys.readouterr().err and not missing.exists()
    assert sweep.main(["splice", "--variants-dir", str(variant_dir), "--tags", "+",
                       "--out", str(missing)]) == 2
    assert "names no variant" in capsys.readouterr().err


STAND_IN = """#!{python}
import json, sys
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
m = json.load(open(a["--pack"] + "/manifest.json"))
o = next(k for k in m["kernels"] if k["name"] == "llama_o_proj")
block_n = next(v for v in o["variants"] if v["bucket"] == [0])["constexprs"]["BLOCK_N"]
shape = [a[k] for k in ("--prompt-lens", "--steps", "--capacity", "--context") if k in a]
with open(a["--json"], "w") as f:
    json.dump({{"us_per_step": 700.0 + 10 * block_n + int(a["--batch"])}}, f)
with open(a["--json"] + ".shape", "w") as f:
    f.write(" ".join(shape))
"""


def test_time_reports_each_variant_against_the_unswapped_pack(variant_dir, tmp_path, capsys):
    binary = tmp_path / "kpack-llama"
    binary.write_text(STAND_IN.format(python=sys.executable))
    binary.chmod(0o755)
    committed = json.loads((sweep.PACK / "manifest.json").read_text())
    o = next(k for k in committed["kernels"] if k["name"] == "llama_o_proj")
    base_n = next(v for v in o["variants"] if v["bucket"] == [0])["constexprs"]["BLOCK_N"]
    assert sweep.main(["time", "--kpack-llama", str(binary), "--checkpoint", str(tmp_path),
                       "--variants-dir", str(variant_dir), "--out", str(tmp_path / "t"),
                       "--batch", "4", "--rounds", "3"]) == 0
    result = json.loads((tmp_path / "t" / "sweep.json").read_text())
    assert result["batch"] == 4 and result["rounds"] == 3
    assert result["us_per_step"] == {"base": [704.0 + 10 * base_n] * 3, "o2": [724.0] * 3}
    assert result["context"] is None
    out = capsys.readouterr().out
    assert f"{20 - 10 * base_n:+7.1f}" in out and "batch 4, the protocol;" in out
    assert (tmp_path / "t" / "o2.json.shape").read_text() == "32 127 16384"
    # A grid cell: 64 steps after a synthetic context, the capacity aligned as the grid's.
    assert sweep.main(["time", "--kpack-llama", str(binary), "--checkpoint", str(tmp_path),
                       "--variants-dir", str(variant_dir), "--out", str(tmp_path / "c"),
                       "--batch", "64", "--context", "1000", "--rounds", "1"]) == 0
    assert json.loads((tmp_path / "c" / "sweep.json").read_text())["context"] == 1000
    assert (tmp_path / "c" / "o2.json.shape").read_text() == "1 64 1072 1000"
    assert "batch 64, context 1000;" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        sweep.main(["time", "--kpack-llama", str(binary), "--checkpoint", str(tmp_path),
                    "--variants-dir", str(variant_dir), "--out", str(tmp_path / "z"),
                    "--context", "0"])
    assert exit_.value.code == 2 and "--context must be a positive" in capsys.readouterr().err
