"""A plain PyTorch Llama, written from the Hugging Face Llama definition (transformers'
``models/llama/modeling_llama.py``): the reference the engine is judged against.

Hugging Face's computation, layer by layer, in the model's dtype (bf16 or fp32):

- embedding lookup; per decoder layer ``h = h + attn(norm1(h))``, ``h = h + mlp(norm2(h))``
  with the residual stream in the model's dtype; final norm; LM head (the embedding when
  tied); logits returned as fp32.
- RMSNorm: in fp32, ``x * rsqrt(mean(x^2) + eps)``, cast to the dtype, times the weight.
- rotary: ``freqs = pos * inv_freq`` in fp32, ``cos``/``sin`` of ``cat(freqs, freqs)``
  cast to the dtype, ``q * cos + rotate_half(q) * sin`` (rotate_half: ``cat(-x2, x1)``).
- attention: grouped-query, causal, scale 1/sqrt(D) (SDPA; softmax in fp32).
- MLP: ``down(silu(gate(x)) * up(x))``.

One difference from ``LlamaForCausalLM``: positions are per row. The KV cache is static
(``[max_batch, NKV, capacity, D]`` per layer, as Hugging Face's StaticCache) and each row
writes its keys at its own positions and attends over every slot with a mask (slots past
the row's position are masked), so a decode step has fixed shapes whatever the rows'
contexts: ``torch.compile(mode="reduce-overhead")`` captures it once. The rotary
frequencies are the engine's (config.rope_inv_freq: float64, rounded once) unless
``hf_inv_freq=True`` (Hugging Face's fp32 computation).
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import checkpoint
from config import LlamaConfig, load_config, rope_inv_freq


def hf_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Hugging Face's fp32 computation of the llama3-scaled inverse frequencies
    (modeling_rope_utils: default parameters, then the llama3 rule, on fp32 tensors)."""
    D = cfg.D
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    rs = cfg.rope_scaling
    if rs is None:
        return inv
    old = rs.original_max_position_embeddings
    low_wavelen = old / rs.low_freq_factor
    high_wavelen = old / rs.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rs.factor, inv)
    smooth = (old / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _linear(w: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    lin.weight = nn.Parameter(w, requires_grad=False)
    return lin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, w: Dict[str, torch.Tensor], prefix: str):
        super().__init__()
        self.cfg = cfg
        self.q_proj = _linear(w[prefix + "q_proj.weight"])
        self.k_proj = _linear(w[prefix + "k_proj.weight"])
        self.v_proj = _linear(w[prefix + "v_proj.weight"])
        self.o_proj = _linear(w[prefix + "o_proj.weight"])

    def forward(self, x, cos, sin, k_cache, v_cache, rows, positions, mask, prefix_rows):
        """x [B, T, H]; cos/sin [B, T, D]; rows [B] (cache slots); positions [B, T];
        mask [B, 1, T, CAP] (True: attend); prefix_rows: rows are 0..B-1, so the rows'
        caches are read as a view (no copy of B caches per layer)."""
        B, T, _ = x.shape
        D = self.cfg.D
        q = self.q_proj(x).view(B, T, -1, D).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, D).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # Each row's keys and values at its own positions: cache[row, :, pos] = [NKV, D].
        k_cache[rows[:, None], :, positions] = k.transpose(1, 2)
        v_cache[rows[:, None], :, positions] = v.transpose(1, 2)
        keys, values = (k_cache[:B], v_cache[:B]) if prefix_rows else (k_cache[rows],
                                                                       v_cache[rows])
        # Grouped-query attention without repeating K and V: the group's q heads (head h
        # uses kv head h // group, as repeat_kv arranges) become query rows of their kv
        # head, and the mask's rows repeat per group member.
        NKV, group = keys.shape[1], q.shape[1] // keys.shape[1]
        qg = q.reshape(B, NKV, group * T, D)
        m = mask.repeat(1, 1, group, 1) if T > 1 else mask
        o = F.scaled_dot_product_attention(qg, keys, values, attn_mask=m,
                                           scale=self.cfg.sm_scale)
        return self.o_proj(o.reshape(B, -1, T, D).transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, w: Dict[str, torch.Tensor], prefix: str):
        super().__init__()
        self.gate_proj = _linear(w[prefix + "gate_proj.weight"])
        self.up_proj = _linear(w[prefix + "up_proj.weight"])
        self.down_proj = _linear(w[prefix + "down_proj.weight"])

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, w: Dict[str, torch.Tensor], i: int):
        super().__init__()
        p = f"model.layers.{i}."
        self.input_layernorm = RMSNorm(w[p + "input_layernorm.weight"], cfg.eps)
        self.self_attn = Attention(cfg, w, p + "self_attn.")
        self.post_attention_layernorm = RMSNorm(w[p + "post_attention_layernorm.weight"],
                                                cfg.eps)
        self.mlp = MLP(w, p + "mlp.")

    def forward(self, h, cos, sin, k_cache, v_cache, rows, positions, mask, prefix_rows):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, k_cache, v_cache, rows,
                               positions, mask, prefix_rows)
        return h + self.mlp(self.post_attention_layernorm(h))


class ReferenceLlama(nn.Module):
    """The reference with a static KV cache for ``max_batch`` sequences of ``capacity``
    positions. ``forward(tokens [B, T], positions [B, T], rows [B])`` -> fp32 logits
    [B, T, V] (``rows`` None: rows 0..B-1, whose caches are read as views);
    ``decode_step`` is the fixed-shape greedy step to compile. ``k_cache``/``v_cache``
    are lists of the layers' caches."""

    def __init__(self, cfg: LlamaConfig, weights: Dict[str, torch.Tensor], dtype: torch.dtype,
                 device: str | torch.device, max_batch: int, capacity: int,
                 hf_rope: bool = False):
        super().__init__()
        self.cfg = cfg
        self.capacity = capacity
        w = {n: t.to(device=device, dtype=dtype) for n, t in weights.items()}
        self.embed_tokens = nn.Parameter(w["model.embed_tokens.weight"], requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, w, i) for i in range(cfg.L))
        self.norm = RMSNorm(w["model.norm.weight"], cfg.eps)
        self.lm_head = (self.embed_tokens if cfg.tie_word_embeddings else
                        nn.Parameter(w["lm_head.weight"], requires_grad=False))
        inv = hf_inv_freq(cfg) if hf_rope else torch.from_numpy(rope_inv_freq(cfg))
        self.register_buffer("inv_freq", inv.to(device=device, dtype=torch.float32))
        # One cache tensor per layer and kind (as Hugging Face's StaticCache): Inductor
        # updates a whole input tensor in place, but copies the whole base tensor back
        # when a step writes through views of one [L, ...] buffer (a profile on the H200
        # showed that copy at 1.3 ms per compiled step at capacity 16,384).
        shape = (max_batch, cfg.NKV, capacity, cfg.D)
        self.k_cache, self.v_cache = [], []
        for i in range(cfg.L):
            for name, caches in (("k_cache", self.k_cache), ("v_cache", self.v_cache)):
                self.register_buffer(f"{name}{i}", torch.zeros(shape, dtype=dtype, device=device))
                caches.append(getattr(self, f"{name}{i}"))
        self.register_buffer("slots", torch.arange(capacity, device=device))
        self.register_buffer("batch_rows", torch.arange(max_batch, device=device))

    @classmethod
    def load(cls, dir: str, dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
             max_batch: int = 1, capacity: int = 4096, hf_rope: bool = False):
        cfg = load_config(dir)
        return cls(cfg, checkpoint.torch_weights(dir, cfg, "cpu"), dtype, device, max_batch,
                   capacity, hf_rope)

    def mark_static(self) -> None:
        """Tell torch.compile that the caches keep their addresses (as Hugging Face's
        StaticCache does), so that reduce-overhead's CUDA graphs may write them."""
        for cache in self.k_cache + self.v_cache:
            torch._dynamo.mark_static_address(cache)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        dtype = self.embed_tokens.dtype
        h = F.embedding(tokens, self.embed_tokens)
        freqs = positions[..., None].float() * self.inv_freq  # fp32 [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        mask = (self.slots[None, None, :] <= positions[:, :, None]).unsqueeze(1)
        prefix_rows = rows is None
        if prefix_rows:
            rows = self.batch_rows[:tokens.shape[0]]
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, self.k_cache[i], self.v_cache[i], rows, positions, mask,
                      prefix_rows)
        return F.linear(self.norm(h), self.lm_head).float()

    def decode_step(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rows 0..B-1 (B = len(tokens)) take one step: tokens int64 [B] at positions pos [B].
        Returns fp32 logits [B, V]; writes the greedy tokens into ``tokens`` and advances
        ``pos`` (so a loop needs no host work between steps)."""
        logits = self.forward(tokens[:, None], pos[:, None])[:, 0]
        tokens.copy_(logits.argmax(dim=-1))
        pos.add_(1)
        return logits

    def reset(self) -> None:
        for cache in self.k_cache + self.v_cache:
            cache.zero_()


@torch.no_grad()
def prefill(model: ReferenceLlama, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """Each prompt into its row's cache (row b = slot b); fp32 logits [B, V] of each row's
    last prompt token."""
    dev = model.inv_freq.device
    out = []
    for b, prompt in enumerate(prompts):
        t = torch.tensor([list(prompt)], device=dev)
        p = torch.arange(len(prompt), device=dev)[None]
        out.append(model(t, p, torch.tensor([b], device=dev))[0, -1])
    return torch.stack(out)


@torch.no_grad()
def teacher_forced(model: ReferenceLlama, prompts: Sequence[Sequence[int]],
                   inputs: torch.Tensor, step=None) -> torch.Tensor:
    """Prefill, then one decode step per row of ``inputs`` (int [steps, B]: the tokens fed).
    Returns fp32 logits [steps + 1, B, V]: the prefill's, then each step's. ``step`` is
    the decode step function (e.g. a compiled ``model.decode_step``)."""
    step = step or model.decode_step
    dev = model.inv_freq.device
    logits = [prefill(model, prompts)]
    pos = torch.tensor([len(p) for p in prompts], device=dev)
    tokens = torch.empty(len(prompts), dtype=torch.int64, device=dev)
    for t in range(inputs.shape[0]):
        tokens.copy_(inputs[t])
        logits.append(step(tokens, pos).clone())
    return torch.stack(logits)


@torch.no_grad()
def greedy(model: ReferenceLlama, prompts: Sequence[Sequence[int]], steps: int,
           step=None) -> tuple:
    """(tokens int64 [B, steps + 1], fp32 logits [steps, B, V]) of a greedy decode."""
    step = step or model.decode_step
    dev = model.inv_freq.device
    first = prefill(model, prompts).argmax(dim=-1)
    pos = torch.tensor([len(p) for p in prompts], device=dev)
    tokens = first.clone()
    out, logits = [first.clone()], []
    for _ in range(steps):
        logits.append(step(tokens, pos).clone())
        out.append(tokens.clone())
    return torch.stack(out, dim=1), torch.stack(logits)
