#!/usr/bin/env python3
"""The decode engine's contract math (docs/llama.md, "Common math" and "Kernels") in numpy:
the CPU-tier oracle that the C++ engine's emulated run is compared against, without torch.

fp32 everywhere, rounded to bf16 exactly where the contract stores bf16 (the normalized
activations, q, the KV cache, the attention output, the SwiGLU output); the residual
stream h and the logits stay fp32. Summation order is numpy's (the kernels' is theirs), so
a kernel result and this one agree to fp32 rounding, not bit for bit. A row's result does
not depend on the other rows of its call: the projections multiply one row at a time
(`project`), since BLAS's matrix product sums in an order that changes with the number of
rows and the CPU, and a bf16 rounding then turns the last bit into 1e-3 of a logit.

    numpy_model.py --checkpoint DIR --batch B --prompt-lens 32,17 --steps N --seed S \
        [--capacity C] [--teacher-force] --out DIR

writes DIR/step_logits.npy (fp32 [N, B, V]), DIR/prefill_logits.npy (fp32 [B, V]: each
row's last prompt token), DIR/tokens.npy (int32 [B, N + 1]: the prefill's token, then one
per step) and DIR/result.json (the same tokens, the digests of ENGINE_IFACE.md, the shape).
With --teacher-force every step's input is prompt_token(b, P_b + t, seed) (the prompt
formula continued) instead of the previous greedy token.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bf16  # noqa: E402
import checkpoint  # noqa: E402
from config import (LlamaConfig, config_summary, parse_prompt_lens, prompt_token,  # noqa: E402
                    prompt_tokens, rope_inv_freq)

F32 = np.float32


def rmsnorm(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    """rows of fp32 x [M, H], bf16 weight g (as fp32): bf16(float(bf16(x r)) g)."""
    ms = np.mean(x * x, axis=-1, dtype=F32, keepdims=True)
    r = F32(1.0) / np.sqrt(ms + F32(eps))
    return bf16.round_f32(bf16.round_f32(x * r) * g)


def project(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [M, K] times w [N, K] transposed, fp32 [M, N], one row at a time (a matrix-vector
    product each), so that each row's bits are the same whatever else is in x."""
    return np.stack([w @ row for row in x]).astype(F32, copy=False)


def silu(g: np.ndarray) -> np.ndarray:
    return g / (F32(1.0) + np.exp(-g))


def digest(logits: np.ndarray) -> str:
    """sha256 of fp32 little-endian row-major bytes (ENGINE_IFACE.md)."""
    return hashlib.sha256(np.ascontiguousarray(logits, dtype="<f4").tobytes()).hexdigest()


@dataclass
class Layer:
    ln1: np.ndarray
    wqkv: np.ndarray
    wo: np.ndarray
    ln2: np.ndarray
    wgu: np.ndarray
    wd: np.ndarray


class NumpyLlama:
    """The model with a KV cache of ``max_seqs`` sequences of ``capacity`` positions.

    ``forward(tokens, pos, seq)`` runs rows (one token each) through every layer, writing
    each row's K and V at (seq[m], pos[m]) before attending (so a prefill's rows see each
    other causally), and returns fp32 logits [M, V].
    """

    def __init__(self, cfg: LlamaConfig, weights: Dict[str, np.ndarray], capacity: int,
                 max_seqs: int):
        self.cfg = cfg
        f = lambda n: bf16.f32_from_bits(weights[n])  # noqa: E731
        self.embed = f("model.embed_tokens.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings else f("lm_head.weight")
        self.norm_f = f("model.norm.weight")
        self.layers = []
        for i in range(cfg.L):
            p = f"model.layers.{i}."
            self.layers.append(Layer(
                f(p + "input_layernorm.weight"),
                np.concatenate([f(p + f"self_attn.{x}_proj.weight") for x in "qkv"]),
                f(p + "self_attn.o_proj.weight"),
                f(p + "post_attention_layernorm.weight"),
                np.concatenate([f(p + "mlp.gate_proj.weight"), f(p + "mlp.up_proj.weight")]),
                f(p + "mlp.down_proj.weight")))
        self.inv_freq = rope_inv_freq(cfg)
        self.capacity = capacity
        shape = (cfg.L, max_seqs, cfg.NKV, capacity, cfg.D)
        self.k_cache = np.zeros(shape, F32)  # bf16 values, held as fp32
        self.v_cache = np.zeros(shape, F32)

    @classmethod
    def load(cls, dir: str, capacity: int, max_seqs: int) -> "NumpyLlama":
        cfg, weights = checkpoint.load(dir)
        return cls(cfg, weights, capacity, max_seqs)

    def _rope(self, y: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """y fp32 [M, heads, D]: rows j and j + D/2 of each head rotated by pos inv_freq[j]."""
        half = self.cfg.D // 2
        ang = pos.astype(F32)[:, None] * self.inv_freq[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = y[..., :half], y[..., half:]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    def forward(self, tokens: Sequence[int], pos: Sequence[int], seq: Sequence[int]) -> np.ndarray:
        cfg = self.cfg
        tokens, pos, seq = (np.asarray(x, dtype=np.int64) for x in (tokens, pos, seq))
        if np.any(pos >= self.capacity) or np.any(pos < 0):
            raise ValueError(f"a position is outside the KV cache's capacity {self.capacity}")
        M, NH, NKV, D = len(tokens), cfg.NH, cfg.NKV, cfg.D
        group = NH // NKV
        h = self.embed[tokens].astype(F32)
        for li, layer in enumerate(self.layers):
            xn = rmsnorm(h, layer.ln1, cfg.eps)
            y = project(xn, layer.wqkv).reshape(M, NH + 2 * NKV, D)
            q = bf16.round_f32(self._rope(y[:, :NH], pos))
            k = bf16.round_f32(self._rope(y[:, NH:NH + NKV], pos))
            v = bf16.round_f32(y[:, NH + NKV:])
            self.k_cache[li, seq, :, pos] = k
            self.v_cache[li, seq, :, pos] = v
            attn = np.empty((M, NH, D), F32)
            for m in range(M):
                keys = self.k_cache[li, seq[m], :, :pos[m] + 1]    # [NKV, T, D]
                vals = self.v_cache[li, seq[m], :, :pos[m] + 1]
                qm = q[m].reshape(NKV, group, D)
                s = np.einsum("gqd,gtd->gqt", qm, keys, dtype=F32) * F32(cfg.sm_scale)
                p = np.exp(s - s.max(axis=-1, keepdims=True))
                o = np.einsum("gqt,gtd->gqd", p, vals, dtype=F32) / p.sum(axis=-1, keepdims=True)
                attn[m] = o.reshape(NH, D)
            h = h + project(bf16.round_f32(attn).reshape(M, NH * D), layer.wo)
            xn = rmsnorm(h, layer.ln2, cfg.eps)
            gu = project(xn, layer.wgu)
            act = bf16.round_f32(silu(gu[:, :cfg.I]) * gu[:, cfg.I:])
            h = h + project(act, layer.wd)
        return project(rmsnorm(h, self.norm_f, cfg.eps), self.lm_head)


def generate(model: NumpyLlama, batch: int, prompt_lens: Sequence[int], steps: int, seed: int,
             teacher_force: bool = False) -> Dict[str, np.ndarray]:
    """Prefill each row (sequence slot b), then ``steps`` decode steps of the whole batch.

    Returns prefill_logits [B, V], step_logits [steps, B, V], tokens int32 [B, steps + 1]
    (each row's token from its prefill, then one per step: the greedy output, whatever the
    input was) and, teacher-forced, inputs int32 [steps, B] (the tokens fed)."""
    cfg = model.cfg
    prompts = prompt_tokens(batch, prompt_lens, seed, cfg.V)
    prefill_logits = np.empty((batch, cfg.V), F32)
    for b, prompt in enumerate(prompts):
        P = len(prompt)
        prefill_logits[b] = model.forward(prompt, range(P), [b] * P)[-1]
    tokens = np.empty((batch, steps + 1), np.int32)
    tokens[:, 0] = np.argmax(prefill_logits, axis=-1)
    step_logits = np.empty((steps, batch, cfg.V), F32)
    inputs = np.empty((steps, batch), np.int32)
    pos = np.array(prompt_lens[:batch], np.int64)
    for t in range(steps):
        if teacher_force:
            inputs[t] = [prompt_token(b, pos[b], seed, cfg.V) for b in range(batch)]
        else:
            inputs[t] = tokens[:, t]
        step_logits[t] = model.forward(inputs[t], pos, range(batch))
        tokens[:, t + 1] = np.argmax(step_logits[t], axis=-1)
        pos += 1
    out = {"prefill_logits": prefill_logits, "step_logits": step_logits, "tokens": tokens}
    if teacher_force:
        out["inputs"] = inputs
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="The contract math in numpy: prefill + decode.")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-lens", default="32")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--capacity", type=int, default=0,
                    help="KV positions per sequence (default: longest prompt + steps)")
    ap.add_argument("--teacher-force", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    lens = parse_prompt_lens(args.prompt_lens, args.batch)
    capacity = args.capacity or max(lens) + args.steps
    if capacity < max(lens) + args.steps:
        ap.error(f"--capacity {capacity} < longest prompt + steps ({max(lens) + args.steps})")
    model = NumpyLlama.load(args.checkpoint, capacity, args.batch)
    r = generate(model, args.batch, lens, args.steps, args.seed, args.teacher_force)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, array in r.items():
        np.save(out / f"{name}.npy", array)
    (out / "result.json").write_text(json.dumps({
        "config": config_summary(model.cfg), "batch": args.batch, "prompt_lens": lens,
        "steps": args.steps, "seed": args.seed, "teacher_force": args.teacher_force,
        "generated": r["tokens"].tolist(),
        "step_digests": [digest(x) for x in r["step_logits"]],
        "prefill_digests": [digest(x) for x in r["prefill_logits"]],
    }, indent=1) + "\n")
    print(f"wrote {out}: tokens {r['tokens'].tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
