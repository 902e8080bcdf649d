"""bench/llama_attn_probe.py without a GPU: each source variant's replacements match the
kernel source exactly once, and the edited llama_attn_decode still compiles for sm_90 (a
kernel change that breaks a variant fails here, not on the GPU machine)."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("triton")  # the probe imports llama_spec, which needs it

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("llama_attn_probe",
                                              REPO / "bench" / "llama_attn_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def test_base_is_the_kernel_file_unchanged():
    assert probe.variant_source("base") == (probe.KERNELS / "llama_kernels.py").read_text()


@pytest.mark.parametrize("name", sorted(set(probe.VARIANTS) - {"base"}))
def test_each_variant_edits_the_source_and_compiles(name, tmp_path):
    text = probe.variant_source(name)
    assert text != probe.variant_source("base")
    for old, new in probe.VARIANTS[name]:
        assert new in text and old not in text
    import llama_spec  # on the path the probe set
    from kpack_tools import build
    kspec = next(k for k in llama_spec.ALL_KERNELS if k.name == "llama_attn_decode")
    variant = dataclasses.replace(kspec, fn=probe.load_variant(name, tmp_path).llama_attn_decode)
    # As the pack compiles its aligned variant, with the edited function.
    kernel = build.compile_variant(variant, kspec.config("n64_w4_s3"), kspec.specializations[0])
    assert kernel.asm["cubin"][:4] == b"\x7fELF"


def test_a_replacement_that_does_not_match_is_an_error(monkeypatch):
    monkeypatch.setitem(probe.VARIANTS, "broken", [("no such text", "x")])
    with pytest.raises(SystemExit, match="variant broken: 'no such text' found 0 times"):
        probe.variant_source("broken")
