"""The Llama decode engine's pack (``kernels/llamapack``) against its build spec
(``kernels/llama/llama_spec.py``) and its contract (``docs/llama.md``).

No torch and no GPU: the spec must pass ``check_spec``; the committed manifest must be
valid and say what the spec says (kernels, parameters, buckets, grids, variants, each
bucket's config one of that bucket's candidates, the kernels' source hashes, PDL); the
kernel table of docs/llama.md must list the parameters the kernels take; and one variant
compiled here must be byte-identical to the committed cubin (the hashes cover only the
kernels' own text, not the helpers they call). Run with ``PYTHONPATH=tools python3 -m
pytest tools/tests/test_llama_pack.py``.
"""

import hashlib
import json
import re
from pathlib import Path

import pytest

from kpack_tools import build as builder
from kpack_tools.pack import source_identity
from kpack_tools.spec import SpecError, load_specs, source_qualname
from pack_validator import choose_variant, validate_manifest

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "kernels" / "llama" / "llama_spec.py"
PACK = REPO / "kernels" / "llamapack"
DOC = REPO / "docs" / "llama.md"
KERNELS = ["llama_embed", "llama_rmsnorm", "llama_qkv_rope", "llama_attn_decode",
           "llama_attn_prefill", "llama_o_proj", "llama_gate_up", "llama_down_proj",
           "llama_lm_head"]
EDGES = [1, 4, 16, 64, 256]


@pytest.fixture(scope="module")
def specs():
    return {spec.name: spec for spec in load_specs(SPEC)}  # load_specs runs check_spec


@pytest.fixture(scope="module")
def manifest():
    return json.loads((PACK / "manifest.json").read_text())


@pytest.fixture(scope="module")
def tuning():
    return json.loads((PACK / "tuning.json").read_text())


def test_spec_defines_the_contract_kernels_bucketed_on_m(specs):
    assert list(specs) == KERNELS
    for spec in specs.values():
        assert [(b.param, list(b.edges)) for b in spec.buckets] == [("M", EDGES)]
        assert spec.grid_tolerant and spec.outputs and spec.reference is not None
        assert spec.constants["USE_PDL"] is True and spec.options == {"launch_pdl": True}
        assert [s.name for s in spec.specializations] == ["aligned"]
        for number, shape in enumerate(spec.representatives):
            candidates = [c for c in spec.configs if spec.allowed(shape, c)]
            swapped = [c.name for c in candidates if c.constexprs.get("SWAP")]
            # Each candidate costs a compile in a tuning: six at most, and three more with
            # tl.dot swapped (w · xᵀ) in buckets 2-4, 5-16 and 17-64 only.
            assert 1 <= len(candidates) - len(swapped) <= 6, (spec.name, number, candidates)
            assert len(swapped) <= (3 if 1 <= number <= 3 else 0), (spec.name, number, swapped)
            assert all(c.name.endswith("_t") == bool(c.constexprs.get("SWAP"))
                       for c in candidates), (spec.name, number)


def test_spec_builds_a_named_subset_for_tuning_in_steps(monkeypatch):
    monkeypatch.setenv("LLAMA_SPEC_KERNELS", "llama_lm_head,llama_embed")
    assert [s.name for s in load_specs(SPEC)] == ["llama_embed", "llama_lm_head"]
    monkeypatch.setenv("LLAMA_SPEC_KERNELS", "llama_embed,llama_nope")
    with pytest.raises(SpecError, match=r"unknown kernels \['llama_nope'\]"):
        load_specs(SPEC)


def test_pack_is_valid_and_matches_the_spec(specs, manifest, tuning):
    assert validate_manifest(manifest, PACK) == []
    assert [k["name"] for k in manifest["kernels"]] == KERNELS
    chosen = {k["name"]: [b["chosen"] for b in k["buckets"]] for k in tuning["kernels"]}
    for kernel in manifest["kernels"]:
        spec = specs[kernel["name"]]
        assert [(p["name"], p["type"]) for p in kernel["params"]] == list(spec.params)
        assert [p["name"] for p in kernel["params"] if p.get("readonly")] == \
            [n for n, _ in spec.params if n in spec.readonly]
        assert kernel["buckets"] == [{"param": "M", "edges": EDGES}]
        assert kernel["grid"] == list(spec.grid)
        assert kernel["grid_tolerance"]["proof"] in ("gpu", "asserted")
        assert kernel["source"] == source_identity(spec.fn, source_qualname(spec.fn)), \
            f"{spec.name}: the committed pack was built from other kernel source; rebuild it"
        assert [v["name"] for v in kernel["variants"]] == \
            [f"b{b}_{s}" for b in range(len(EDGES) + 1) for s in ("generic", "aligned")]
        aligned = spec.specializations[0].div16
        for variant in kernel["variants"]:
            bucket = variant["bucket"][0]
            config = spec.config(chosen[spec.name][bucket])
            assert spec.allowed(spec.representatives[bucket], config), (spec.name, bucket)
            assert variant["constexprs"] == dict(spec.constexprs(config))
            assert (variant["num_warps"], variant["num_stages"]) == \
                (config.num_warps, config.num_stages)
            assert variant["launch_pdl"] is True
            if variant["name"].endswith("_aligned"):
                assert variant["assumptions"] == {p: ["div16"] for p in aligned}
            else:
                assert "assumptions" not in variant


def test_pinned_buckets_offer_only_their_pin_and_the_pack_runs_it(specs, tuning, monkeypatch):
    """A pin (a config chosen by the step graph's time, llama_spec._PINS) is its bucket's
    only candidate, so a tuning that adds candidates elsewhere cannot replace it (session
    13's did, to o's cost at batch 4), and the committed pack runs it."""
    monkeypatch.syspath_prepend(str(SPEC.parent))
    import llama_spec  # noqa: PLC0415

    chosen = {k["name"]: [b["chosen"] for b in k["buckets"]] for k in tuning["kernels"]}
    assert llama_spec._PINS, "no pins: drop this test with the mechanism"
    for name, pins in llama_spec._PINS.items():
        spec = specs[name]
        for bucket, config in pins.items():
            shape = spec.representatives[bucket]
            assert [c.name for c in spec.configs if spec.allowed(shape, c)] == [config], \
                (name, bucket)
            assert chosen[name][bucket] == config, (name, bucket)


def test_runtime_dispatch_picks_the_bucket_and_the_aligned_variant(manifest):
    """The reference chooser on decode-like arguments (16-aligned pointers)."""
    kernel = next(k for k in manifest["kernels"] if k["name"] == "llama_o_proj")
    args = {"x": 0x10000, "w": 0x20000, "h": 0x30000, "part": 0x40000, "N": 2048, "K": 2048}
    for m, bucket in ((1, 0), (2, 1), (4, 1), (5, 2), (64, 3), (65, 4), (256, 4), (257, 5)):
        assert choose_variant(kernel, {**args, "M": m})["name"] == f"b{bucket}_aligned"
    assert choose_variant(kernel, {**args, "M": 1, "K": 2047})["name"] == "b0_generic"


def _doc_table():
    """{pack kernel: (parameter names, constexpr names)} from docs/llama.md's table."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 4 or not cells[1].startswith("`llama_"):
            continue
        names = re.findall(r"`(llama_\w+)`", cells[1].split("(")[0])
        params, _, constexprs = cells[2].strip("`").partition("` / `")
        parsed = ([p.split()[0] for p in params.split(",")],
                  [c.strip() for c in constexprs.strip("`").split(",")])
        for name in names:
            rows[name] = parsed
    return rows


def test_contract_table_lists_the_kernels_parameters(specs):
    table = _doc_table()
    assert sorted(table) == sorted(KERNELS)
    for name, spec in specs.items():
        params, constexprs = table[name]
        assert params == [n for n, t in spec.params if t != "constexpr"], name
        assert constexprs == spec.constexpr_params, name


@pytest.mark.parametrize("name,bucket", [("llama_qkv_rope", 0), ("llama_attn_decode", 3)])
def test_a_committed_cubin_is_what_the_kernel_source_compiles_to(specs, manifest, tuning, name,
                                                                  bucket):
    """llama_qkv_rope's M = 1 aligned variant uses the shared helpers (norm, projection
    loop, L2 prefetch, PDL), which the source hashes do not cover; decode attention's at
    17-64 rows compiles both of its tile widths (SHORT_CTX) and _attn_decode_split."""
    pytest.importorskip("triton")
    spec = specs[name]
    kernel = next(k for k in manifest["kernels"] if k["name"] == spec.name)
    variant = next(v for v in kernel["variants"] if v["name"] == f"b{bucket}_aligned")
    config = spec.config(next(k for k in tuning["kernels"] if k["name"] == spec.name)
                         ["buckets"][bucket]["chosen"])
    compiled = builder.compile_variant(spec, config, spec.specializations[0],
                                       tuning["target"])
    committed = (PACK / variant["cubin"]).read_bytes()
    assert hashlib.sha256(compiled.asm["cubin"]).hexdigest() == \
        hashlib.sha256(committed).hexdigest() == variant["sha256"]


def test_decode_attention_config_names_say_their_tiles(specs):
    """nN_wW_sS[_leC_nM_sT]: BLOCK_N, warps, stages, then SHORT_CTX, SHORT_N and
    SHORT_STAGES of a two-tile config (a plain one has SHORT_CTX 0); the short tile is
    the narrower."""
    spec = specs["llama_attn_decode"]
    two_tiles = 0
    for c in spec.configs:
        m = re.fullmatch(r"n(\d+)_w(\d+)_s(\d+)(?:_le(\d+)_n(\d+)_s(\d+))?", c.name)
        assert m, c.name
        n, w, st, ctx, sn, ss = (int(g) if g else None for g in m.groups())
        e = c.constexprs
        assert (e["BLOCK_N"], c.num_warps, c.num_stages) == (n, w, st), c.name
        if ctx is None:
            assert e["SHORT_CTX"] == 0, c.name
        else:
            two_tiles += 1
            assert (e["SHORT_CTX"], e["SHORT_N"], e["SHORT_STAGES"]) == (ctx, sn, ss), c.name
            assert 0 < sn <= n, c.name
    assert two_tiles, "no two-tile config: drop this test's second half with the mechanism"
