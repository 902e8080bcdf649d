#!/usr/bin/env python3
"""The Llama decode engine of docs/llama.md driven from Python on torch tensors: the same
device state, the same launches with the same arguments, as the C++ engine (kpack-llama).

Backends (``backend=``):

- ``graph``: the decode step's launches bound once (``kernel.bind``) and sent as one
  ``kpack.graph`` per batch bucket, replayed with only the changed arguments set (M when
  the batch changes inside its bucket, S across buckets); the context grows with no
  rebuild (positions live in device memory and the LM head advances them);
- ``eager``: the same bound launches called one by one;
- ``call``: every launch a plain ``pack[name](*args)`` call;
- ``triton``: the same ``@triton.jit`` functions (kernels/llama/llama_kernels.py) through
  Triton's JIT, each with the constexprs, num_warps and num_stages of the variant kpack
  selects for its arguments (``kernel.select_variant``, ``kernel.variants``), or, without
  kpack, of the first variant of the pack manifest's bucket. With ``TRITON_INTERPRET=1``
  and ``device="cpu"`` this runs the whole step plan on the CPU.

Prefill (every backend but triton launches it through plain kpack calls) is one step per
row: M = the prompt's length, ``llama_attn_prefill``, then the LM head on the last row only
(M = 1; h at that row; logits, argmax partials, counter, tokens and pos at the sequence's
decode row b; advance 0), after which pos[b] = the prompt length and seq[b] = b.

As the C++ engine, the engine keeps each row's next KV position on the host
(``state.positions``) and refuses, before launching anything, a prefill of more rows than
it has or of tokens outside the vocabulary, and decode steps of rows without a sequence
or past the KV capacity (where QKV would store nothing and attention read stale
positions).

Generation keeps the tokens on the device: the next step's embed reads what the LM head
wrote. The host reads them back through pinned memory one step late: step t+1 is issued
before the host waits for step t's copy (issue 22, point 3). Digests (sha256 of the fp32
logits rows 0..B-1 after each step, ENGINE_IFACE.md) read the logits every step and are
for checks, not timing; they need an engine made with ``read_logits=True``, the only kind
whose LM head writes the logits (the C++ engine's EngineOptions::read_logits).

    engine.py --pack DIR --checkpoint DIR [--backend graph|eager|call|triton] [--batch B]
        [--prompt-lens L[,L...]] [--steps N] [--capacity C] [--seed S] [--warmup-seqs W]
        [--timed-seqs T] [--json FILE] [--digests] [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))

import checkpoint  # noqa: E402
from config import (PROJ_SPLIT_MAX, PROJ_SPLIT_MAX_ROWS, PROJ_SPLIT_MIN_TILE,  # noqa: E402
                    S_MAX, LlamaConfig, config_summary, decode_splits,
                    load_config, parse_prompt_lens, programmatic_edges, prompt_token,
                    prompt_tokens, rope_inv_freq)

# The most decode rows (the C++ engine's kMaxBatch): decode attention's grid (S, NKV, M)
# holds the batch along z, which the driver caps at 65535.
MAX_BATCH = 65535

# The pack kernels' call parameters (docs/llama.md), checked against the pack at open.
PARAMS: Dict[str, tuple] = {
    "llama_embed": ("tokens", "table", "h", "M", "H"),
    "llama_rmsnorm": ("h", "norm_w", "xn", "M", "H", "eps"),
    "llama_qkv_rope": ("h", "xn", "norm_w", "w", "inv_freq", "pos", "seq", "q", "k_cache",
                       "v_cache", "M", "H", "NH", "NKV", "CAP", "eps"),
    "llama_attn_decode": ("q", "k_cache", "v_cache", "pos", "seq", "o_part", "ml_part",
                          "counters", "out", "M", "NH", "NKV", "CAP", "S", "sm_scale"),
    "llama_attn_prefill": ("q", "k_cache", "v_cache", "pos", "seq", "out", "M", "NH", "NKV",
                           "CAP", "sm_scale"),
    "llama_o_proj": ("x", "w", "h", "part", "counters", "M", "N", "K"),
    "llama_down_proj": ("x", "w", "h", "part", "counters", "M", "N", "K"),
    "llama_gate_up": ("h", "xn", "norm_w", "w", "out", "M", "H", "I", "eps"),
    "llama_lm_head": ("h", "xn", "norm_w", "w", "logits", "part_max", "part_idx", "counters",
                      "tokens", "pos", "M", "V", "H", "eps", "advance", "keep_logits"),
}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Grids of the contract (docs/llama.md), from the call's arguments and the variant's
# constexprs: what Triton's JIT launches get, and kpack launches of kernels whose pack has
# no grid expressions.
GRIDS: Dict[str, Callable[[Dict[str, Any], Dict[str, Any]], tuple]] = {
    "llama_embed": lambda a, c: (a["M"], _cdiv(a["H"], c["BLOCK"])),
    "llama_rmsnorm": lambda a, c: (a["M"],),
    "llama_qkv_rope": lambda a, c: (
        _cdiv((a["NH"] + 2 * a["NKV"]) * c["HEAD_DIM"] // 2, c["BLOCK_J"]),
        _cdiv(a["M"], c["BLOCK_M"])),
    "llama_attn_decode": lambda a, c: (a["S"], a["NKV"], a["M"]),
    "llama_attn_prefill": lambda a, c: (_cdiv(a["M"], c["BLOCK_M"]), a["NH"]),
    "llama_o_proj": lambda a, c: (_cdiv(a["N"], c["BLOCK_N"]), _cdiv(a["M"], c["BLOCK_M"]),
                                  c["SPLIT"]),
    "llama_down_proj": lambda a, c: (_cdiv(a["N"], c["BLOCK_N"]), _cdiv(a["M"], c["BLOCK_M"]),
                                     c["SPLIT"]),
    "llama_gate_up": lambda a, c: (_cdiv(a["I"], c["BLOCK_N"]), _cdiv(a["M"], c["BLOCK_M"])),
    "llama_lm_head": lambda a, c: (_cdiv(a["V"], c["BLOCK_N"]), _cdiv(a["M"], c["BLOCK_M"])),
}


@dataclass
class Call:
    """One launch of the step: a pack kernel and its call arguments, in order."""
    kernel: str
    args: List[Any]

    def named(self) -> Dict[str, Any]:
        return dict(zip(PARAMS[self.kernel], self.args))


def logits_digest(rows) -> str:
    """sha256 of fp32 logits rows (a torch tensor [B, V]), little-endian, row-major."""
    a = rows.detach().float().cpu().contiguous().numpy()
    return hashlib.sha256(a.astype("<f4", copy=False).tobytes()).hexdigest()


# ------------------------------------------------------------------ device state

class DeviceState:
    """The engine's buffers (docs/llama.md, "Device state") on ``device``: weights fused
    as the kernels read them, the KV cache, per-row arrays, logits and scratch."""

    def __init__(self, cfg: LlamaConfig, weights: Dict[str, Any], max_batch: int,
                 max_prompt: int, capacity: int, device: str, read_logits: bool = False):
        import torch  # noqa: PLC0415
        self.cfg, self.device = cfg, device
        # The LM head's keep_logits: without it the logits rows are never written (the
        # same tokens; the stores of B·V fp32 values saved every step).
        self.read_logits = read_logits
        self.max_batch, self.max_prompt, self.capacity = max_batch, max_prompt, capacity
        # Each row's next KV position on the host (the C++ engine's SequenceTable), -1: no
        # sequence. The device's pos advances in the LM head; this copy lets the engine
        # refuse what would not fit before anything is launched.
        self.positions: List[int] = [-1] * max_batch
        bf, f32, i32 = torch.bfloat16, torch.float32, torch.int32
        dev = lambda t: t.to(device=device, dtype=bf).contiguous()  # noqa: E731
        self.embed = dev(weights["model.embed_tokens.weight"])
        self.lm_head = (self.embed if cfg.tie_word_embeddings else
                        dev(weights["lm_head.weight"]))
        self.norm_f = dev(weights["model.norm.weight"])
        self.ln1, self.wqkv, self.wo, self.ln2, self.wgu, self.wd = ([] for _ in range(6))
        for i in range(cfg.L):
            p = f"model.layers.{i}."
            self.ln1.append(dev(weights[p + "input_layernorm.weight"]))
            self.wqkv.append(torch.cat([dev(weights[p + f"self_attn.{x}_proj.weight"])
                                        for x in "qkv"]))
            self.wo.append(dev(weights[p + "self_attn.o_proj.weight"]))
            self.ln2.append(dev(weights[p + "post_attention_layernorm.weight"]))
            self.wgu.append(torch.cat([dev(weights[p + "mlp.gate_proj.weight"]),
                                       dev(weights[p + "mlp.up_proj.weight"])]))
            self.wd.append(dev(weights[p + "mlp.down_proj.weight"]))
        self.inv_freq = torch.from_numpy(rope_inv_freq(cfg)).to(device)
        rows = max(max_batch, max_prompt)
        z = lambda *shape, dtype=f32: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        self.h = z(rows, cfg.H)
        self.xn = z(rows, cfg.H, dtype=bf)  # llama_rmsnorm's rows (M > 1)
        self.q = z(rows, cfg.NH, cfg.D, dtype=bf)
        self.attn = z(rows, cfg.NH * cfg.D, dtype=bf)
        self.act = z(rows, cfg.I, dtype=bf)
        # One allocation each for K and V; layer l's cache is the view k_cache[l].
        self.k_cache = z(cfg.L, max_batch, cfg.NKV, capacity, cfg.D, dtype=bf)
        self.v_cache = z(cfg.L, max_batch, cfg.NKV, capacity, cfg.D, dtype=bf)
        self.tokens, self.pos, self.seq = (z(max_batch, dtype=i32) for _ in range(3))
        self.ptokens, self.ppos, self.pseq = (z(max_prompt, dtype=i32) for _ in range(3))
        self.logits = z(max_batch, cfg.V)
        self.o_part = z(max_batch * cfg.NH * S_MAX * cfg.D)
        self.ml_part = z(max_batch * cfg.NH * S_MAX * 2)
        self.part_max = z(max_batch * cfg.V)
        self.part_idx = z(max_batch * cfg.V, dtype=i32)
        self.attn_counters = z(max_batch * cfg.NKV, dtype=i32)
        self.lm_counters = z(max_batch, dtype=i32)
        # The o and down projections' split-K partials and counters (PROJ_SPLIT_MAX splits
        # of PROJ_SPLIT_MAX_ROWS rows, tiles of at least PROJ_SPLIT_MIN_TILE: open_pack
        # checks).
        tile_rows, tile_cols = PROJ_SPLIT_MIN_TILE
        self.proj_part = z(PROJ_SPLIT_MAX * PROJ_SPLIT_MAX_ROWS * cfg.H)
        self.proj_counters = z(PROJ_SPLIT_MAX_ROWS // tile_rows * _cdiv(cfg.H, tile_cols),
                               dtype=i32)

    def norm_calls(self, M: int, norm_w) -> List[Call]:
        """llama_rmsnorm of rows 0..M-1 of h into xn, which the projections read above one
        row (docs/llama.md); none at one row (they normalize it themselves)."""
        if M == 1:
            return []
        return [Call("llama_rmsnorm", [self.h, norm_w, self.xn, M, self.cfg.H, self.cfg.eps])]

    def layer_calls(self, l: int, M: int, pos, seq, attention: Call) -> List[Call]:
        cfg = self.cfg
        return (self.norm_calls(M, self.ln1[l]) + [
            Call("llama_qkv_rope", [self.h, self.xn, self.ln1[l], self.wqkv[l], self.inv_freq,
                                    pos, seq, self.q, self.k_cache[l], self.v_cache[l], M,
                                    cfg.H, cfg.NH, cfg.NKV, self.capacity, cfg.eps]),
            attention,
            Call("llama_o_proj", [self.attn, self.wo[l], self.h, self.proj_part,
                                  self.proj_counters, M, cfg.H, cfg.NH * cfg.D]),
        ] + self.norm_calls(M, self.ln2[l]) + [
            Call("llama_gate_up", [self.h, self.xn, self.ln2[l], self.wgu[l], self.act, M, cfg.H,
                                   cfg.I, cfg.eps]),
            Call("llama_down_proj", [self.act, self.wd[l], self.h, self.proj_part,
                                     self.proj_counters, M, cfg.H, cfg.I]),
        ])

    def decode_calls(self, B: int) -> List[Call]:
        """The decode step of rows 0..B-1: 5 L + 2 launches at one row; above, 7 L + 3
        (llama_rmsnorm before each QKV, gate/up and the LM head)."""
        cfg = self.cfg
        S = decode_splits(B, cfg.NKV)
        calls = [Call("llama_embed", [self.tokens, self.embed, self.h, B, cfg.H])]
        for l in range(cfg.L):
            attention = Call("llama_attn_decode", [
                self.q, self.k_cache[l], self.v_cache[l], self.pos, self.seq, self.o_part,
                self.ml_part, self.attn_counters, self.attn, B, cfg.NH, cfg.NKV, self.capacity,
                S, cfg.sm_scale])
            calls += self.layer_calls(l, B, self.pos, self.seq, attention)
        calls += self.norm_calls(B, self.norm_f)
        calls.append(Call("llama_lm_head", [
            self.h, self.xn, self.norm_f, self.lm_head, self.logits, self.part_max,
            self.part_idx, self.lm_counters, self.tokens, self.pos, B, cfg.V, cfg.H, cfg.eps,
            1, int(self.read_logits)]))
        return calls

    def prefill_calls(self, b: int, P: int) -> List[Call]:
        """Prefill of sequence b's P prompt tokens (ptokens, ppos, pseq set by the host).
        The LM head runs on the last prompt row (h at row P-1) into decode row b: its
        logits (with read_logits), argmax partials and counter rows, tokens[b] and pos[b]
        (as the C++ engine does)."""
        cfg = self.cfg
        calls = [Call("llama_embed", [self.ptokens, self.embed, self.h, P, cfg.H])]
        for l in range(cfg.L):
            attention = Call("llama_attn_prefill", [
                self.q, self.k_cache[l], self.v_cache[l], self.ppos, self.pseq, self.attn, P,
                cfg.NH, cfg.NKV, self.capacity, cfg.sm_scale])
            calls += self.layer_calls(l, P, self.ppos, self.pseq, attention)
        V = cfg.V
        calls.append(Call("llama_lm_head", [
            self.h[P - 1:], self.xn, self.norm_f, self.lm_head, self.logits[b:],
            self.part_max[b * V:],
            self.part_idx[b * V:], self.lm_counters[b:], self.tokens[b:], self.pos[b:], 1, V,
            cfg.H, cfg.eps, 0, int(self.read_logits)]))
        return calls


# ------------------------------------------------------------------ backends

class KpackBackend:
    """Launches through kpack: plain calls (``call``), bound launches (``eager``) or
    ``kpack.graph`` replays (``graph``) for the decode step; plain calls for prefill."""

    def __init__(self, pack, mode: str, host_pointers: bool = False):
        import kpack  # noqa: PLC0415
        self.kpack, self.pack, self.mode = kpack, pack, mode
        # Host tensors passed as their addresses, launched on the legacy stream: for runs
        # against the fake CUDA driver, whose device memory is host memory (kpack refuses
        # CPU tensors, and torch, when imported, would be asked for its CUDA stream).
        self.host_pointers = host_pointers
        self.kw = {"stream": 0} if host_pointers else {}
        self.kernels = {name: pack[name] for name in PARAMS}
        self.bound: Optional[list] = None
        self.calls: Optional[List[Call]] = None
        self.graph = None
        # Bound launches and the arguments they hold, by the step's kernel sequence (one row
        # and more rows differ: llama_rmsnorm); `bound` is the current batch's.
        self._bound_sets: Dict[tuple, tuple] = {}
        # The step graphs, by kernel sequence and whether their PDL launches get
        # programmatic edges (config.programmatic_edges: per batch bucket); `graph` is the
        # current batch's.
        self.graphs: Dict[tuple, Any] = {}
        self.batch: Optional[int] = None

    def _args(self, call: Call) -> list:
        if not self.host_pointers:
            return call.args
        return [a.data_ptr() if hasattr(a, "data_ptr") else a for a in call.args]

    def _grid(self, call: Call):
        """None (the manifest's grid expressions) or the contract grid for the variant the
        arguments select, for kernels whose pack has no grid expressions."""
        k = self.kernels[call.kernel]
        if k.grid:
            return None
        variant = next(v for v in k.variants if v.name == k.select_variant(*self._args(call)))
        return GRIDS[call.kernel](call.named(), dict(variant.constexprs))

    def run(self, calls: Sequence[Call]) -> None:
        for c in calls:
            grid = self._grid(c)
            k = self.kernels[c.kernel]
            (k if grid is None else k[grid])(*self._args(c), **self.kw)

    def prepare_decode(self, calls: List[Call], batch: int) -> None:
        self.calls = calls
        if self.mode == "call":
            return
        key = self._prepare_bound(calls)
        if self.mode == "graph":
            pdl = programmatic_edges(batch)
            if (key, pdl) not in self.graphs:
                self.graphs[key, pdl] = self.kpack.graph(self.bound, programmatic_edges=pdl)
            self.graph = self.graphs[key, pdl]

    def _prepare_bound(self, calls: List[Call]) -> tuple:
        """Binds the step's launches the first time its kernel sequence is seen; later
        sets only the arguments that changed (M, and S across buckets). Returns the
        sequence."""
        key = tuple(c.kernel for c in calls)
        if key not in self._bound_sets:
            bound = []
            for c in calls:
                grid = self._grid(c)
                k = self.kernels[c.kernel]
                bound.append((k if grid is None else k[grid]).bind(*self._args(c), **self.kw))
        else:
            bound, held = self._bound_sets[key]
            for b, c, old in zip(bound, calls, held):
                for i, (new, was, arg) in enumerate(zip(c.args, old, self._args(c))):
                    if not _same(new, was):
                        b.set(i, arg)
                if not self.kernels[c.kernel].grid:
                    b.set_grid(self._grid(c))
        self._bound_sets[key] = (bound, [list(c.args) for c in calls])
        self.bound = bound
        return key

    def decode(self, stream=None) -> None:
        """One decode step. ``stream`` (a CUstream as an int) is the graph replay's; None:
        the current stream (torch's, for torch tensors; the legacy one for host pointers).
        Bound and plain launches follow the current stream."""
        if self.mode == "graph":
            self.graph.replay(self.kw.get("stream") if stream is None else stream)
        elif self.mode == "eager":
            for b in self.bound:
                b()
        else:
            self.run(self.calls)

    def stats(self) -> Dict[str, Any]:
        """The current step graph's stats; graphs_built over all of them."""
        if self.graph is None:
            return {}
        out = dict(self.graph.stats())
        out["graphs_built"] = sum(g.stats()["graphs_built"] for g in self.graphs.values())
        return out


class VariantChooser:
    """(constexprs, num_warps, num_stages, num_ctas, launch_pdl) of the variant a pack
    kernel would launch for a call: kpack's own choice (``select_variant``) when kpack is
    open, else the first variant of the manifest's bucket for the call's bucket parameters."""

    def __init__(self, pack_dir: Path, pack=None):
        self.pack = pack
        manifest = json.loads((Path(pack_dir) / "manifest.json").read_text())
        self.manifest = {k["name"]: k for k in manifest["kernels"]}

    def source(self, kernel: str) -> str:
        """The @triton.jit function's name (the manifest's source qualname, last part)."""
        src = self.manifest[kernel].get("source")
        if not src:
            raise ValueError(f"pack kernel '{kernel}' has no source; the triton backend needs "
                             "it to find the @triton.jit function")
        return src["qualname"].rsplit(".", 1)[-1]

    def __call__(self, call: Call) -> tuple:
        if self.pack is not None:
            import torch  # noqa: PLC0415
            k = self.pack[call.kernel]
            # CPU tensors (TRITON_INTERPRET runs) go as their addresses: kpack refuses
            # host tensors, and only values and alignment matter for the choice.
            args = [a.data_ptr() if isinstance(a, torch.Tensor) and a.device.type == "cpu"
                    else a for a in call.args]
            name = k.select_variant(*args)
            v = next(v for v in self.manifest[call.kernel]["variants"] if v["name"] == name)
        else:
            v = self._first_of_bucket(call)
        return (v["constexprs"], v["num_warps"], v.get("num_stages", 3), v["num_ctas"],
                v["launch_pdl"])

    def _first_of_bucket(self, call: Call) -> Dict[str, Any]:
        spec = self.manifest[call.kernel]
        named = call.named()
        index = []
        for dim in spec.get("buckets", []):
            value = named[dim["param"]]
            index.append(next((i for i, e in enumerate(dim["edges"]) if value <= e),
                              len(dim["edges"])))
        for v in spec["variants"]:
            if "bucket" not in v or v["bucket"] == index:
                return v
        raise ValueError(f"pack kernel '{call.kernel}': no variant serves bucket {index}")


class TritonBackend:
    """The same kernels through Triton's JIT (``fn[grid](*args, **constexprs, num_warps=,
    num_stages=, launch_pdl=)``), configured as kpack's chosen variant."""

    def __init__(self, chooser: VariantChooser, module):
        self.chooser = chooser
        self.fns = {name: getattr(module, chooser.source(name)) for name in PARAMS}
        self.plan: List[tuple] = []
        self.batch: Optional[int] = None

    def _prepare(self, call: Call) -> tuple:
        constexprs, num_warps, num_stages, num_ctas, launch_pdl = self.chooser(call)
        grid = GRIDS[call.kernel](call.named(), constexprs)
        kw = dict(constexprs, num_warps=num_warps, num_stages=num_stages)
        if num_ctas != 1:
            kw["num_ctas"] = num_ctas
        if launch_pdl:
            kw["launch_pdl"] = True
        return self.fns[call.kernel][grid], call.args, kw

    def run(self, calls: Sequence[Call]) -> None:
        for c in calls:
            fn, args, kw = self._prepare(c)
            fn(*args, **kw)

    def prepare_decode(self, calls: List[Call], batch: int) -> None:
        self.plan = [self._prepare(c) for c in calls]

    def decode(self, stream=None) -> None:
        """One decode step on torch's current stream (``stream`` is ignored)."""
        for fn, args, kw in self.plan:
            fn(*args, **kw)

    def stats(self) -> Dict[str, Any]:
        return {}


# ------------------------------------------------------------------ the engine

@dataclass
class SequenceResult:
    generated: List[List[int]]            # per row: the prefill's token, then one per step
    step_digests: List[str] = field(default_factory=list)
    prefill_digests: List[str] = field(default_factory=list)
    step_logits: Optional[Any] = None     # torch fp32 [steps, B, V] on the CPU, if kept
    prefill_logits: Optional[Any] = None  # torch fp32 [B, V], if kept
    us_per_step: Optional[float] = None   # device time (CUDA events) / steps
    host_us_per_step: Optional[float] = None        # issue + token read-back, per step
    host_issue_us_per_step: Optional[float] = None  # the step's launches alone


class LlamaEngine:
    """Load a checkpoint and a pack; prefill a batch of prompts and decode it.

    One device state serves several backends (``use(name)`` switches; each keeps its own
    bound launches and graphs), so the benchmark's arms share weights and KV cache.

    On a CUDA device, ``run_sequence`` runs on the engine's own stream (``self.stream``, as
    the C++ engine does), ordered after the caller's current stream at its start and
    before it at its end; the other methods run on the caller's current stream.

    ``read_logits`` (the C++ EngineOptions::read_logits): the LM head writes the logits
    rows (``state.logits``), which ``prefill(keep_logits=True)`` and ``run_sequence``'s
    ``digests`` and ``keep_logits`` read. Without it (the default) it writes only the
    tokens, and those three raise ValueError."""

    def __init__(self, checkpoint_dir: str, pack_dir: Optional[str] = None,
                 backend: str = "graph", max_batch: int = 1, max_prompt: int = 64,
                 capacity: int = 4096, device: str = "cuda", driver: Optional[str] = None,
                 kernels_module: Optional[str] = None, weights: Optional[Dict[str, Any]] = None,
                 read_logits: bool = False):
        import torch  # noqa: PLC0415
        self.torch = torch
        self.cfg = load_config(checkpoint_dir)
        self.pack_dir = Path(pack_dir or REPO / "kernels" / "llamapack")
        self.device, self.kernels_module = device, kernels_module
        self.pack = None
        if backend != "triton" or _importable("kpack"):
            self.pack = open_pack(self.pack_dir, self.cfg, driver)
        if max_batch > MAX_BATCH:
            raise ValueError(f"a batch of up to {max_batch} rows: decode attention's grid "
                             f"holds the batch along z, which the driver limits to {MAX_BATCH}")
        if max_prompt > capacity:
            raise ValueError(f"prompts of up to {max_prompt} tokens do not fit a KV capacity "
                             f"of {capacity} positions")
        if weights is None:
            weights = checkpoint.torch_weights(checkpoint_dir, self.cfg)
        self.state = DeviceState(self.cfg, weights, max_batch, max_prompt, capacity, device,
                                 read_logits)
        self.stream = (torch.cuda.Stream(device=device)
                       if device != "cpu" and torch.device(device).type == "cuda" else None)
        self.backends: Dict[str, Any] = {}
        self.use(backend)

    def use(self, backend: str) -> None:
        """Switch to backend graph, eager, call or triton (made at its first use)."""
        if backend not in self.backends:
            if backend in ("graph", "eager", "call"):
                if self.pack is None:
                    raise ValueError(f"backend '{backend}' needs kpack")
                self.backends[backend] = KpackBackend(self.pack, backend,
                                                      host_pointers=self.device == "cpu")
            elif backend == "triton":
                if str(REPO / "kernels" / "llama") not in sys.path:
                    sys.path.insert(0, str(REPO / "kernels" / "llama"))
                module = importlib.import_module(self.kernels_module or "llama_kernels")
                self.backends[backend] = TritonBackend(VariantChooser(self.pack_dir, self.pack),
                                                       module)
            else:
                raise ValueError(f"backend must be graph, eager, call or triton, got '{backend}'")
        self.backend_name = backend
        self.backend = self.backends[backend]

    # -- steps

    def set_batch(self, B: int) -> None:
        """Make the decode step serve rows 0..B-1 (bound launches patched, the graph of B's
        bucket built at its first replay)."""
        if not 1 <= B <= self.state.max_batch:
            raise ValueError(f"batch {B} outside 1..{self.state.max_batch}")
        if B != self.backend.batch:
            self.backend.prepare_decode(self.state.decode_calls(B), B)
            self.backend.batch = B

    def prefill(self, prompts: Sequence[Sequence[int]], keep_logits: bool = False):
        """Prefill row b with prompts[b] (one step per row); then pos[b] = len, seq[b] = b.
        Returns the fp32 logits [B, V] of each row's last prompt token if keep_logits."""
        torch, s = self.torch, self.state
        self.check_prompts(prompts)
        self.check_logits(keep_logits)
        kept = []
        for b, prompt in enumerate(prompts):
            P = len(prompt)
            s.ptokens[:P].copy_(torch.tensor(prompt, dtype=torch.int32))
            s.ppos[:P].copy_(torch.arange(P, dtype=torch.int32))
            s.pseq[:P].fill_(b)
            self.backend.run(s.prefill_calls(b, P))
            if keep_logits:
                kept.append(s.logits[b].to("cpu", torch.float32, copy=True))
        B = len(prompts)
        s.pos[:B].copy_(torch.tensor([len(p) for p in prompts], dtype=torch.int32))
        s.seq[:B].copy_(torch.arange(B, dtype=torch.int32))
        self.state.positions[:B] = [len(p) for p in prompts]
        return torch.stack(kept) if keep_logits else None

    def check_prompts(self, prompts: Sequence[Sequence[int]], steps: int = 0) -> None:
        """Raises unless ``prompts`` fit the engine: at most max_batch rows of 1..max_prompt
        tokens inside the vocabulary, with room for ``steps`` decode steps after them (the
        C++ engine's Prefill and kpack-llama's checks)."""
        s = self.state
        if len(prompts) > s.max_batch:
            raise ValueError(f"a prefill of {len(prompts)} rows; the engine has rows "
                             f"0..{s.max_batch - 1}")
        for b, prompt in enumerate(prompts):
            if not 1 <= len(prompt) <= s.max_prompt:
                raise ValueError(f"row {b}: prompt length {len(prompt)} outside "
                                 f"1..{s.max_prompt}")
            bad = [(i, t) for i, t in enumerate(prompt) if not 0 <= t < self.cfg.V]
            if bad:
                raise ValueError(f"prefill of row {b}: prompt token {bad[0][0]} is "
                                 f"{bad[0][1]}, outside the vocabulary of {self.cfg.V}")
        longest = max((len(p) for p in prompts), default=0)
        if steps and longest + steps > s.capacity:
            raise ValueError(f"a prompt of {longest} tokens and {steps} decode steps need "
                             f"{longest + steps} KV positions per sequence; the capacity is "
                             f"{s.capacity} (raise --capacity)")

    def check_logits(self, wanted: bool) -> None:
        """Raises if the logits are ``wanted`` from an engine whose LM head writes none."""
        if wanted and not self.state.read_logits:
            raise ValueError("logits (digests, keep_logits) from an engine made without "
                             "read_logits=True: its LM head writes none")

    def check_decode(self, B: int, steps: int = 1) -> None:
        """Raises unless rows 0..B-1 hold sequences with room for `steps` more positions
        (the C++ engine's SequenceTable::CheckDecode)."""
        if not 1 <= B <= self.state.max_batch:
            raise ValueError(f"a decode step of {B} rows; the engine has "
                             f"{self.state.max_batch} slots")
        for b, p in enumerate(self.state.positions[:B]):
            if p < 0:
                raise ValueError(f"decode row {b}: sequence slot {b} holds no sequence "
                                 "(prefill it first)")
            if p + steps > self.state.capacity:
                raise ValueError(f"decode row {b}: sequence slot {b} is at position {p}, and "
                                 f"the KV cache holds {self.state.capacity} positions per "
                                 f"sequence: {steps} more tokens would not fit (raise "
                                 "--capacity)")

    def decode_step(self) -> None:
        B = self.backend.batch
        self.check_decode(B)
        self.backend.decode()
        self.state.positions[:B] = [p + 1 for p in self.state.positions[:B]]

    def fill_synthetic(self, B: int, context: int, seed: int = 0, fill_cache: bool = True) -> None:
        """Rows 0..B-1 as if they had prefilled ``context`` tokens: random bf16 keys and
        values at positions 0..context-1 (unless fill_cache is false: the cache as it is),
        pos[b] = context, seq[b] = b, random tokens. (The benchmark grid's way to reach a
        context without prefilling it.)"""
        torch, s = self.torch, self.state
        if not 1 <= B <= s.max_batch:
            raise ValueError(f"synthetic context for {B} rows: the engine has rows "
                             f"1..{s.max_batch}")
        if context + 1 > s.capacity:
            raise ValueError(f"context {context} needs capacity > {context}")
        g = torch.Generator(device=s.device).manual_seed(seed)
        if fill_cache:
            for cache in (s.k_cache, s.v_cache):
                cache[:, :B, :, :context].normal_(generator=g)
        s.tokens[:B].copy_(torch.randint(0, self.cfg.V, (B,), generator=g, device=s.device))
        s.pos[:B].fill_(context)
        s.seq[:B].copy_(torch.arange(B, dtype=torch.int32))
        self.state.positions[:B] = [context] * B

    # -- sequences

    def run_sequence(self, prompts: Optional[Sequence[Sequence[int]]], steps: int, *,
                     digests: bool = False, keep_logits: bool = False,
                     teacher: Optional[Sequence[Sequence[int]]] = None,
                     batch: Optional[int] = None) -> SequenceResult:
        """Prefill ``prompts`` (None: rows already set up, e.g. fill_synthetic, ``batch``
        rows), then ``steps`` decode steps. ``teacher`` [steps][B]: the host writes these
        tokens before each step instead of feeding the greedy ones. Times the decode
        steps with CUDA events (device runs) and the host's issue time per step. On a CUDA
        device everything runs on ``self.stream``."""
        if self.stream is None:
            return self._run_sequence(prompts, steps, digests, keep_logits, teacher, batch)
        torch = self.torch
        caller = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(caller)  # e.g. fill_synthetic's writes
        try:
            with torch.cuda.stream(self.stream):
                return self._run_sequence(prompts, steps, digests, keep_logits, teacher, batch)
        finally:
            caller.wait_stream(self.stream)

    def _run_sequence(self, prompts, steps, digests, keep_logits, teacher, batch):
        torch, s = self.torch, self.state
        cuda = self.stream is not None
        B = len(prompts) if prompts is not None else batch
        self.check_logits(digests or keep_logits)
        if prompts is not None:  # refused before anything runs
            self.check_prompts(prompts, steps)
        elif steps > 0:
            self.check_decode(B, steps)
        self.set_batch(B)
        prefill_logits = None
        if prompts is not None:
            prefill_logits = self.prefill(prompts, keep_logits=digests or keep_logits)
        # Everything a step touches is made here, so that the timed loop makes no tensor
        # views, looks up no stream and converts nothing.
        tokens = s.tokens[:B]
        forced = None
        if teacher is not None:
            forced = torch.tensor(teacher, dtype=torch.int32, device=s.device).unbind(0)
        hist = torch.empty((steps + 1, B), dtype=torch.int32, pin_memory=cuda)
        hist[0].copy_(tokens)
        rows = hist.unbind(0)
        per_step = digests or keep_logits
        stream = self.stream
        handle = stream.cuda_stream if cuda else None
        decode = self.backend.decode
        events = [torch.cuda.Event() for _ in range(steps)] if cuda and not per_step else None
        start = end = None
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
        logits_out, step_digests, host, issue = [], [], 0.0, 0.0
        clock = time.perf_counter
        for t in range(steps):
            t0 = clock()
            if forced is not None:
                tokens.copy_(forced[t], non_blocking=True)
            decode(handle)
            t1 = clock()
            if per_step:
                logits = s.logits[:B].to("cpu", torch.float32, copy=True)
                rows[t + 1].copy_(tokens)
                if digests:
                    step_digests.append(logits_digest(logits))
                if keep_logits:
                    logits_out.append(logits)
                host += clock() - t0
                issue += t1 - t0
                continue
            rows[t + 1].copy_(tokens, non_blocking=cuda)
            if events is not None:
                events[t].record(stream)
            host += clock() - t0
            issue += t1 - t0
            # The previous step's tokens, read one step late: step t is already queued.
            if events is not None and t > 0:
                events[t - 1].synchronize()
        self.state.positions[:B] = [p + steps for p in self.state.positions[:B]]
        if cuda:
            end.record(stream)
            end.synchronize()
        r = SequenceResult(generated=hist.t().tolist(), step_digests=step_digests,
                           host_us_per_step=1e6 * host / max(steps, 1),
                           host_issue_us_per_step=1e6 * issue / max(steps, 1))
        if cuda and steps:
            r.us_per_step = 1e3 * start.elapsed_time(end) / steps
        if prefill_logits is not None:
            r.prefill_digests = [logits_digest(x[None]) for x in prefill_logits] if digests else []
            r.prefill_logits = prefill_logits if keep_logits else None
        if keep_logits:
            r.step_logits = torch.stack(logits_out) if logits_out else None
        return r


def open_pack(pack_dir: Path, cfg: LlamaConfig, driver: Optional[str] = None):
    """kpack.open(pack_dir), checked against the contract's parameters and the model's D."""
    import kpack  # noqa: PLC0415
    pack = kpack.open(pack_dir, driver=driver)
    for name, params in PARAMS.items():
        if name not in pack:
            raise ValueError(f"pack {pack_dir} has no kernel '{name}' (docs/llama.md)")
        got = tuple(p.name for p in pack[name].params if not p.constexpr)
        if got != params:
            raise ValueError(f"pack kernel '{name}' takes {got}; the engine passes {params} "
                             "(docs/llama.md)")
    for name in ("llama_o_proj", "llama_down_proj"):
        for v in pack[name].variants:
            _check_split(pack_dir, name, v)
    head_dims = {v.constexprs.get("HEAD_DIM") for v in pack["llama_qkv_rope"].variants}
    if cfg.D not in head_dims:
        raise ValueError(f"the checkpoint's head_dim {cfg.D} is not served by the pack "
                         f"{pack_dir} (HEAD_DIM {sorted(head_dims)})")
    return pack


def _check_split(pack_dir, name: str, v) -> None:
    """A variant of the o or down projection against the split-K scratch DeviceState
    sizes (as the C++ engine's CheckSplits): SPLIT an integer >= 1; above 1, at most
    PROJ_SPLIT_MAX, tiles of at least PROJ_SPLIT_MIN_TILE, in a bucket of at most
    PROJ_SPLIT_MAX_ROWS rows."""
    where = f"pack {pack_dir}: kernel '{name}' variant '{v.name}'"
    split = v.constexprs.get("SPLIT")
    if not isinstance(split, int) or split < 1:
        raise ValueError(f"{where} needs an integer SPLIT >= 1")
    if split == 1:
        return
    bm, bn = v.constexprs.get("BLOCK_M", 0), v.constexprs.get("BLOCK_N", 0)
    tile_rows, tile_cols = PROJ_SPLIT_MIN_TILE
    if split > PROJ_SPLIT_MAX or bm < tile_rows or bn < tile_cols:
        raise ValueError(f"{where} splits K in {split} with BLOCK_M {bm}, BLOCK_N {bn}; the "
                         f"engine's scratch holds {PROJ_SPLIT_MAX} splits of tiles of at least "
                         f"{tile_rows} x {tile_cols}")
    high = v.bucket.get("M", (None, None))[1] if len(v.bucket) == 1 else None
    if high is None or high > PROJ_SPLIT_MAX_ROWS:
        raise ValueError(f"{where} splits K in {split} for more than {PROJ_SPLIT_MAX_ROWS} "
                         "rows; the engine's scratch holds that many")


def _same(a, b) -> bool:
    """Whether two call arguments are the same value (tensors: the same address)."""
    if hasattr(a, "data_ptr") or hasattr(b, "data_ptr"):
        return (hasattr(a, "data_ptr") and hasattr(b, "data_ptr") and
                a.data_ptr() == b.data_ptr())
    return type(a) is type(b) and a == b


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False


def teacher_tokens(prompt_lens: Sequence[int], steps: int, seed: int, vocab: int) -> List[List[int]]:
    """Teacher forcing's inputs [steps][B]: the prompt formula continued past each prompt
    (the numpy model's --teacher-force feeds the same)."""
    return [[prompt_token(b, P + t, seed, vocab) for b, P in enumerate(prompt_lens)]
            for t in range(steps)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="The Llama decode engine through kpack, from Python.")
    ap.add_argument("--pack", default=str(REPO / "kernels" / "llamapack"))
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--backend", choices=("graph", "eager", "call", "triton"), default="graph")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-lens", default="32")
    ap.add_argument("--steps", type=int, default=127)
    ap.add_argument("--capacity", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup-seqs", type=int, default=0)
    ap.add_argument("--timed-seqs", type=int, default=1)
    ap.add_argument("--teacher-force", action="store_true")
    ap.add_argument("--digests", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--driver", help="CUDA driver library for kpack (default libcuda)")
    args = ap.parse_args(argv)
    lens = parse_prompt_lens(args.prompt_lens, args.batch)
    if args.capacity < max(lens) + args.steps:
        ap.error(f"--capacity {args.capacity} < longest prompt + steps")
    eng = LlamaEngine(args.checkpoint, args.pack, args.backend, max_batch=args.batch,
                      max_prompt=max(lens), capacity=args.capacity, device=args.device,
                      driver=args.driver, read_logits=args.digests)
    prompts = prompt_tokens(args.batch, lens, args.seed, eng.cfg.V)
    teacher = (teacher_tokens(lens, args.steps, args.seed, eng.cfg.V) if args.teacher_force
               else None)
    for _ in range(args.warmup_seqs):
        eng.run_sequence(prompts, args.steps, teacher=teacher)
    timed = [eng.run_sequence(prompts, args.steps, teacher=teacher)
             for _ in range(args.timed_seqs)]
    checked = eng.run_sequence(prompts, args.steps, digests=True, teacher=teacher) \
        if args.digests else timed[-1]
    us = [r.us_per_step for r in timed if r.us_per_step is not None]
    out = {
        "config": config_summary(eng.cfg), "batch": args.batch, "prompt_lens": lens,
        "steps": args.steps, "backend": args.backend, "graphs": args.backend == "graph",
        "generated": checked.generated,
        "us_per_step": sum(us) / len(us) if us else None,
        "tokens_per_s": args.batch * 1e6 * len(us) / sum(us) if us else None,
        "host_us_per_step": sum(r.host_us_per_step for r in timed) / len(timed),
        "graphs_built": eng.backend.stats().get("graphs_built", 0),
        "device": (eng.torch.cuda.get_device_name() if args.device.startswith("cuda")
                   else args.device),
    }
    if args.digests:
        out["step_digests"] = checked.step_digests
        out["prefill_digests"] = checked.prefill_digests
    for b, row in enumerate(checked.generated):
        print(f"row {b}: {' '.join(map(str, row))}")
    if out["us_per_step"] is not None:
        print(f"{out['us_per_step']:.2f} us/step, {out['tokens_per_s']:.1f} tokens/s, "
              f"host {out['host_us_per_step']:.2f} us/step ({args.backend})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
