"""The Llama engine's Python side that needs no torch and no GPU (examples/llama/python):
config.json parsing, the rotary inverse frequencies' bits, the prompt-token formula and the
decode split rule, the checkpoint writer (read back through the safetensors package) and
reader, and the numpy model of the contract math. CI runs it with numpy and safetensors.
"""

from __future__ import annotations

import decimal
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

LLAMA_PY = Path(__file__).resolve().parents[2] / "examples" / "llama" / "python"
sys.path.insert(0, str(LLAMA_PY))

import bf16  # noqa: E402
import checkpoint  # noqa: E402
import config  # noqa: E402
import numpy_model  # noqa: E402
from config import ConfigError  # noqa: E402

import safetensors  # noqa: E402


def tiny_dict(**changes):
    d = config.preset_dict("tiny")
    d.update(changes)
    return d


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    checkpoint.write_checkpoint(out, config.preset_dict("tiny"), seed=7, backend="numpy")
    return out


# ------------------------------------------------------------------ config

def test_presets_parse_to_the_documented_shapes():
    tiny = config.parse_config(config.preset_dict("tiny"))
    assert (tiny.H, tiny.L, tiny.NH, tiny.NKV, tiny.D, tiny.I, tiny.V) == \
        (256, 2, 4, 2, 64, 512, 1000)
    big = config.parse_config(config.preset_dict("llama-3.2-1b"))
    assert (big.H, big.L, big.NH, big.NKV, big.D, big.I, big.V) == \
        (2048, 16, 32, 8, 64, 8192, 128256)
    for c in (tiny, big):
        assert c.eps == 1e-5 and c.rope_theta == 500000.0 and c.tie_word_embeddings
        assert c.rope_scaling == config.RopeScaling(32.0, 1.0, 4.0, 8192)
    assert big.max_position_embeddings == 131072
    # 1.236B parameters, 2.47 GB of bf16 read per decode step (the memory floor).
    assert big.parameter_count() == 1_235_814_400
    assert big.weight_bytes_per_step() == 2 * 1_235_814_400


def test_head_dim_defaults_to_hidden_over_heads():
    d = tiny_dict()
    del d["head_dim"]
    assert config.parse_config(d).D == 64
    d["hidden_size"] = 250
    with pytest.raises(ConfigError, match="no field 'head_dim', and 'hidden_size' 250"):
        config.parse_config(d)


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": None}, "missing field 'hidden_size'"),
    ({"num_hidden_layers": "2"}, "field 'num_hidden_layers' must be an integer, got '2'"),
    ({"vocab_size": True}, "field 'vocab_size' must be an integer, got True"),
    ({"intermediate_size": 0}, "field 'intermediate_size' must be positive, got 0"),
    ({"rms_norm_eps": float("nan")}, "field 'rms_norm_eps' must be a finite number"),
    ({"num_key_value_heads": 3}, "'num_attention_heads' 4 is not a multiple of "
                                 "'num_key_value_heads' 3"),
    ({"num_attention_heads": 34, "num_key_value_heads": 2, "head_dim": 64},
     "'num_attention_heads' / 'num_key_value_heads' = 17 exceeds 16"),
    ({"head_dim": 63}, "field 'head_dim' must be even"),
    ({"torch_dtype": "float32"}, "field 'torch_dtype' is 'float32'"),
    ({"hidden_act": "gelu"}, "field 'hidden_act' is 'gelu'"),
    ({"attention_bias": True}, "field 'attention_bias' is true"),
    ({"tie_word_embeddings": 1}, "field 'tie_word_embeddings' must be true or false"),
    ({"model_type": "mistral"}, "field 'model_type' is 'mistral'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "field 'rope_scaling.rope_type' is 'yarn'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0}},
     "rope_scaling: missing field 'original_max_position_embeddings'"),
    ({"rope_scaling": [1, 2]}, "field 'rope_scaling' must be an object or null"),
])
def test_config_errors_name_the_field(change, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config.parse_config(tiny_dict(**change))


def test_optional_fields_and_rope_forms():
    assert config.parse_config(tiny_dict(rope_scaling=None)).rope_scaling is None
    legacy = dict(config.preset_dict("tiny")["rope_scaling"])
    legacy["type"] = legacy.pop("rope_type")
    assert config.parse_config(tiny_dict(rope_scaling=legacy)).rope_scaling.factor == 32.0
    d = tiny_dict(hidden_size=256.0)  # an integral float is an integer
    assert config.parse_config(d).H == 256
    d = tiny_dict(tie_word_embeddings=False)
    assert "lm_head.weight" in config.parse_config(d).tensor_shapes()


def test_load_config_reads_a_directory_and_reports_bad_files(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_dict()))
    assert config.load_config(tmp_path).V == 1000
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json: not JSON"):
        config.load_config(tmp_path)
    with pytest.raises(ConfigError, match="cannot read"):
        config.load_config(tmp_path / "absent")
    (tmp_path / "config.json").write_text("[]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        config.load_config(tmp_path)


# ------------------------------------------------------------------ rotary frequencies

def _exact_inv_freq(cfg) -> np.ndarray:
    """The llama3 rule in 50-digit decimal arithmetic, rounded to fp32 once (through the
    double nearest the exact value, then to fp32: a double rounding that differs from a
    single one only in cases this test would flag)."""
    ctx = decimal.Context(prec=50)
    Dec = decimal.Decimal
    pi = Dec("3.14159265358979323846264338327950288419716939937510")
    rs = cfg.rope_scaling
    out = []
    for j in range(cfg.D // 2):
        inv = ctx.power(Dec(cfg.rope_theta), ctx.divide(Dec(-2 * j), Dec(cfg.D)))
        wavelen = ctx.divide(2 * pi, inv)
        n = Dec(rs.original_max_position_embeddings)
        if wavelen < n / Dec(rs.high_freq_factor):
            pass
        elif wavelen > n / Dec(rs.low_freq_factor):
            inv = inv / Dec(rs.factor)
        else:
            s = (n / wavelen - Dec(rs.low_freq_factor)) / \
                (Dec(rs.high_freq_factor) - Dec(rs.low_freq_factor))
            inv = (1 - s) * inv / Dec(rs.factor) + s * inv
        out.append(float(inv))
    return np.array(out, dtype=np.float64).astype(np.float32)


def test_inv_freq_is_the_float64_rule_rounded_once():
    for preset in config.PRESETS:
        cfg = config.parse_config(config.preset_dict(preset))
        got = config.rope_inv_freq(cfg)
        assert got.dtype == np.float32 and got.shape == (32,)
        np.testing.assert_array_equal(got.view(np.uint32), _exact_inv_freq(cfg).view(np.uint32))
        # The bits both engines upload for D 64, theta 500000, llama3 (32, 1, 4, 8192).
        assert hashlib.sha256(got.tobytes()).hexdigest() == \
            "9ae1028e198e9f4bf1a05af13ce6f98d3c9694243471b104d0cc494936070f4d"
        assert got[0] == 1.0
        # The three regimes: unscaled (j small), interpolated, scaled by 1/32 (j large).
        plain = np.array([500000.0 ** (-2 * j / 64) for j in range(32)])
        wavelen = 2 * math.pi / plain
        assert np.array_equal(got[wavelen < 2048], plain[wavelen < 2048].astype(np.float32))
        assert np.array_equal(got[wavelen > 8192], (plain[wavelen > 8192] / 32).astype(np.float32))
        assert ((wavelen >= 2048) & (wavelen <= 8192)).any()


def test_inv_freq_without_scaling():
    cfg = config.parse_config(tiny_dict(rope_scaling=None, rope_theta=10000.0))
    want = np.array([math.pow(10000.0, -(2.0 * j) / 64) for j in range(32)]).astype(np.float32)
    np.testing.assert_array_equal(config.rope_inv_freq(cfg), want)


# ------------------------------------------------------------------ shared rules

def test_prompt_token_formula():
    assert config.prompt_token(0, 0, 0, 1000) == 1
    assert config.prompt_token(1, 2, 3, 1000) == (1 + 7919 + 2 * 104729 + 3 * 15485863) % 1000
    assert config.prompt_token(5, 31, 9, 128256) == \
        (1 + 7919 * 5 + 104729 * 31 + 15485863 * 9) % 128256
    assert config.prompt_tokens(2, [3, 1], 0, 1000) == [[1, 730, 459], [920]]


def test_prompt_lens_cycle_over_the_batch():
    assert config.parse_prompt_lens("32", 3) == [32, 32, 32]
    assert config.parse_prompt_lens("32,17,40", 5) == [32, 17, 40, 32, 17]
    assert config.parse_prompt_lens([4, 5], 1) == [4]
    for bad in ("", "3,x", "0", "-1"):
        with pytest.raises(ValueError, match="--prompt-lens"):
            config.parse_prompt_lens(bad, 2)


def test_decode_splits_follow_the_batch_bucket():
    # S = max(1, min(32, P / (B_edge NKV))), B_edge in 1, 4, 16, 64 (B above 64), P 384 at
    # B_edge 4 and 512 otherwise.
    assert [config.bucket_edge(b) for b in (1, 2, 4, 5, 16, 17, 64, 65, 300)] == \
        [1, 4, 4, 16, 16, 64, 64, 65, 300]
    # Llama-3.2-1B (NKV 8): 32, 12, 4, 1 over the buckets 1, 2-4, 5-16, 17-64.
    assert [config.decode_splits(b, 8) for b in (1, 3, 8, 64)] == [32, 12, 4, 1]
    assert config.decode_splits(1, 2) == 32 and config.decode_splits(3, 2) == 32
    assert config.decode_splits(8, 2) == 16 and config.decode_splits(64, 2) == 4
    assert config.decode_splits(65, 8) == 1 and config.decode_splits(200, 1) == 2
    assert config.decode_splits(600, 1) == 1


# ------------------------------------------------------------------ checkpoint writer and reader

def test_writer_round_trips_through_safetensors(tiny_dir):
    cfg = config.load_config(tiny_dir)
    assert json.loads((tiny_dir / "config.json").read_text()) == config.preset_dict("tiny")
    raw = (tiny_dir / "model.safetensors").read_bytes()
    tensors = dict(safetensors.deserialize(raw))
    shapes = cfg.tensor_shapes()
    assert set(tensors) == set(shapes) and "lm_head.weight" not in tensors
    mine = checkpoint.load_bf16(tiny_dir / "model.safetensors", cfg)
    for name, shape in shapes.items():
        t = tensors[name]
        assert t["dtype"] == "BF16" and tuple(t["shape"]) == shape, name
        assert bytes(t["data"]) == mine[name].tobytes(), name
    header, meta, _, _ = checkpoint.read_header(tiny_dir / "model.safetensors")
    assert meta["format"] == "pt" and meta["seed"] == "7"
    # N(0, 0.02) weights, 1 + N(0, 0.1) norms.
    q = bf16.f32_from_bits(mine["model.layers.0.self_attn.q_proj.weight"])
    assert abs(q.std() - 0.02) < 0.001 and abs(q.mean()) < 0.001
    n = bf16.f32_from_bits(mine["model.layers.1.post_attention_layernorm.weight"])
    assert abs(n.mean() - 1.0) < 0.03 and abs(n.std() - 0.1) < 0.02


def test_writer_is_seeded(tmp_path):
    d = tiny_dict(num_hidden_layers=1, vocab_size=64, hidden_size=128, intermediate_size=64)
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        checkpoint.write_checkpoint(tmp_path / name, d, seed, backend="numpy")
    a, b, c = (checkpoint.load(tmp_path / n)[1] for n in "abc")
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not any(np.array_equal(a[n], c[n]) for n in a)


def test_untied_checkpoint_has_an_lm_head(tmp_path):
    d = tiny_dict(tie_word_embeddings=False, num_hidden_layers=1)
    checkpoint.write_checkpoint(tmp_path, d, 1, backend="numpy")
    cfg, w = checkpoint.load(tmp_path)
    assert w["lm_head.weight"].shape == (1000, 256)
    assert not np.array_equal(w["lm_head.weight"], w["model.embed_tokens.weight"])


def test_command_line(tmp_path):
    script = LLAMA_PY / "make_checkpoint.py"
    r = subprocess.run([sys.executable, str(script), "--preset", "tiny", "--seed", "7",
                        "--out", str(tmp_path / "t"), "--backend", "numpy"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cfgfile = tmp_path / "c.json"
    cfgfile.write_text(json.dumps(tiny_dict(num_hidden_layers=1)))
    r = subprocess.run([sys.executable, str(script), "--config", str(cfgfile), "--seed", "7",
                        "--out", str(tmp_path / "c")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert config.load_config(tmp_path / "c").L == 1
    cfgfile.write_text(json.dumps(tiny_dict(num_key_value_heads=3)))
    r = subprocess.run([sys.executable, str(script), "--config", str(cfgfile), "--seed", "7",
                        "--out", str(tmp_path / "bad")], capture_output=True, text=True)
    assert r.returncode == 1 and "'num_key_value_heads' 3" in r.stderr
    r = subprocess.run([sys.executable, str(script), "--seed", "7", "--out", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "exactly one of --preset and --config" in r.stderr


def test_reader_names_the_tensor_that_is_wrong(tmp_path, tiny_dir):
    cfg = config.load_config(tiny_dir)
    path = tiny_dir / "model.safetensors"
    header, meta, start, size = checkpoint.read_header(path)
    body = path.read_bytes()[start:]

    def write(h, data=body):
        blob = json.dumps(dict(h, __metadata__=meta)).encode()
        p = tmp_path / "m.safetensors"
        p.write_bytes(len(blob).to_bytes(8, "little") + blob + data)
        return p

    name = "model.layers.1.mlp.up_proj.weight"
    h = dict(header)
    del h[name]
    with pytest.raises(checkpoint.CheckpointError, match=f"missing tensor '{name}'"):
        checkpoint.load_bf16(write(h), cfg)
    h = dict(header, **{name: dict(header[name], shape=[512, 255])})
    with pytest.raises(checkpoint.CheckpointError, match=f"'{name}' has shape \\[512, 255\\]"):
        checkpoint.load_bf16(write(h), cfg)
    h = dict(header, **{name: dict(header[name], dtype="F16")})
    with pytest.raises(checkpoint.CheckpointError, match=f"'{name}' has dtype F16"):
        checkpoint.load_bf16(write(h), cfg)
    last = max(header, key=lambda n: header[n]["data_offsets"][1])
    with pytest.raises(checkpoint.CheckpointError, match=f"tensor '{last}' has data_offsets"):
        checkpoint.load_bf16(write(header, body[:-2]), cfg)
    (tmp_path / "short").write_bytes(b"\x05\x00")
    with pytest.raises(checkpoint.CheckpointError, match="truncated"):
        checkpoint.read_header(tmp_path / "short")


# ------------------------------------------------------------------ numpy model

def test_bf16_rounding_is_to_nearest_even():
    above_tie = np.nextafter(np.float32(1.00390625), np.float32(2))
    x = np.array([1.0, 1.00390625, 1.01171875, above_tie, -2.5], dtype=np.float32)
    # 1 + 2^-8 is a tie (to even: 1.0); 1 + 3 2^-8 a tie (to even: 1 + 2^-6); just above
    # the first tie rounds up.
    want = np.array([1.0, 1.0, 1.015625, 1.0078125, -2.5], dtype=np.float32)
    np.testing.assert_array_equal(bf16.round_f32(x), want)
    assert bf16.bits_from_f32(np.array([np.inf], np.float32))[0] == 0x7F80
    assert np.isnan(bf16.round_f32(np.array([np.nan], np.float32)))[0]


def test_numpy_model_decode_matches_one_prefill_of_the_same_tokens(tiny_dir):
    """KV-cache bookkeeping: a teacher-forced decode (mixed prompt lengths, per-row
    positions and sequence slots) gives each step the logits a single prefill of the whole
    token history gives its last row (the same math, batched differently)."""
    lens, steps, seed = [3, 7, 1], 4, 5
    model = numpy_model.NumpyLlama.load(tiny_dir, capacity=16, max_seqs=3)
    r = numpy_model.generate(model, 3, lens, steps, seed, teacher_force=True)
    assert r["step_logits"].shape == (steps, 3, 1000) and r["tokens"].shape == (3, steps + 1)
    one = numpy_model.NumpyLlama.load(tiny_dir, capacity=16, max_seqs=1)
    for b in range(3):
        history = config.prompt_tokens(3, lens, seed, 1000)[b] + list(r["inputs"][:, b])
        full = one.forward(history, range(len(history)), [0] * len(history))
        np.testing.assert_allclose(full[lens[b] - 1], r["prefill_logits"][b], atol=2e-5)
        for t in range(steps):
            np.testing.assert_allclose(full[lens[b] + t], r["step_logits"][t, b], atol=2e-5)
    np.testing.assert_array_equal(r["tokens"][:, 1:], r["step_logits"].argmax(-1).T)


def test_numpy_model_command_line(tmp_path, tiny_dir):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(LLAMA_PY / "numpy_model.py"), "--checkpoint",
                        str(tiny_dir), "--batch", "2", "--prompt-lens", "4,2", "--steps", "3",
                        "--seed", "1", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    logits = np.load(out / "step_logits.npy")
    tokens = np.load(out / "tokens.npy")
    result = json.loads((out / "result.json").read_text())
    assert logits.shape == (3, 2, 1000) and logits.dtype == np.float32
    assert result["generated"] == tokens.tolist() and result["prompt_lens"] == [4, 2]
    assert result["step_digests"] == [hashlib.sha256(x.astype("<f4").tobytes()).hexdigest()
                                      for x in logits]
    prefill = np.load(out / "prefill_logits.npy")
    assert result["prefill_digests"][1] == hashlib.sha256(prefill[1].tobytes()).hexdigest()
    assert tokens[:, 0].tolist() == prefill.argmax(-1).tolist()


def _variant(name, bucket, **constexprs):
    from types import SimpleNamespace  # noqa: PLC0415
    return SimpleNamespace(name=name, bucket=bucket, constexprs=constexprs)


@pytest.mark.parametrize("variant, message", [
    (_variant("b4_aligned", {"M": (65, 256)}, SPLIT=2, BLOCK_M=64, BLOCK_N=64),
     "variant 'b4_aligned' splits K in 2 for more than 64 rows"),
    (_variant("b5_aligned", {"M": (257, None)}, SPLIT=2, BLOCK_M=64, BLOCK_N=64),
     "splits K in 2 for more than 64 rows"),
    (_variant("b1_aligned", {"M": (2, 4)}, SPLIT=16, BLOCK_M=16, BLOCK_N=64),
     "splits K in 16 with BLOCK_M 16, BLOCK_N 64"),
    (_variant("b1_generic", {"M": (2, 4)}, SPLIT=4, BLOCK_M=16, BLOCK_N=16),
     "splits K in 4 with BLOCK_M 16, BLOCK_N 16"),
    (_variant("b0_aligned", {"M": (None, 1)}, SPLIT=0, BLOCK_M=1, BLOCK_N=4),
     "variant 'b0_aligned' needs an integer SPLIT >= 1"),
    (_variant("b0_aligned", {"M": (None, 1)}, BLOCK_M=1, BLOCK_N=4),
     "needs an integer SPLIT >= 1"),
])
def test_engine_refuses_split_k_beyond_its_scratch(variant, message):
    """The Python engine's check of the o and down projections' split-K variants against
    the scratch it allocates (the C++ engine's CheckSplits: engine_test.cc)."""
    import engine  # noqa: PLC0415
    with pytest.raises(ValueError, match=message) as e:
        engine._check_split("pack", "llama_down_proj", variant)
    assert f"kernel 'llama_down_proj' variant '{variant.name}'" in str(e.value)


def test_engine_takes_split_k_within_its_scratch():
    import engine  # noqa: PLC0415
    for v in (_variant("b0_aligned", {"M": (None, 1)}, SPLIT=1, BLOCK_M=1, BLOCK_N=4),
              _variant("b3_aligned", {"M": (17, 64)}, SPLIT=8, BLOCK_M=64, BLOCK_N=32),
              _variant("b4_aligned", {"M": (65, 256)}, SPLIT=1, BLOCK_M=64, BLOCK_N=64)):
        engine._check_split("pack", "llama_down_proj", v)
