"""The math of docs/llama.md's kernels in plain torch, on the kernels' own arguments.

Each function takes the arguments of one pack kernel by parameter name (tensors as the
engine holds them, sizes as ints) and returns ``{output parameter: expected tensor}``
without changing its inputs: the whole tensor a kernel writes in place (``h`` of the
projections, the KV caches, ``pos``, ``counters``). Sums are float64 over the operands the
contract gives (the bf16-rounded normalized activations), so a kernel's fp32 result may
differ only by its fp32 summation order. ``kpack-build`` checks tuning candidates with
these (``llama_spec.py``); ``check_kernels.py`` checks the kernels.
"""

import importlib.util
import math
import sys
from pathlib import Path

import torch


def _engine_config():
    """The engines' examples/llama/python/config.py, under a name of its own (a module
    named `config` elsewhere on the path is not it)."""
    name = "kpack_llama_engine_config"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "examples" / "llama" / "python" / "config.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


# Decode attention's split count, as the engines choose it (docs/llama.md).
S_MAX = _engine_config().S_MAX
decode_splits = _engine_config().decode_splits

BF16 = torch.bfloat16


def rmsnorm(h, g, eps):
    """bf16(float(bf16(x * r)) * float(g)), r = 1 / sqrt(mean(x^2) + eps) in fp32."""
    h = h.float()
    r = 1.0 / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return ((h * r).to(BF16).float() * g.float()).to(BF16)


def normed_rows(a, hdim):
    """The normalized rows a projection kernel reads: rmsnorm(h) at M = 1 (the kernel
    normalizes its one row), llama_rmsnorm's xn at M > 1 (docs/llama.md)."""
    m = a["M"]
    if m > 1:
        return a["xn"].view(-1, hdim)[:m]
    return rmsnorm(a["h"].view(-1, hdim)[:m], a["norm_w"], a["eps"])


def rmsnorm_rows(a):
    hdim, m = a["H"], a["M"]
    xn = a["xn"].clone()
    xn.view(-1, hdim)[:m] = rmsnorm(a["h"].view(-1, hdim)[:m], a["norm_w"], a["eps"])
    return {"xn": xn}


def project(x, w):
    """x · wᵀ summed in float64, as fp32."""
    return (x.double() @ w.double().t()).float()


def embed(a):
    m, hdim = a["M"], a["H"]
    h = a["h"].clone()
    h.view(-1, hdim)[:m] = a["table"].view(-1, hdim)[a["tokens"][:m].long()].float()
    return {"h": h}


def qkv_rope(a, head_dim):
    m, hdim, nh, nkv, cap = a["M"], a["H"], a["NH"], a["NKV"], a["CAP"]
    half = head_dim // 2
    heads = nh + 2 * nkv
    xn = normed_rows(a, hdim)
    y = project(xn, a["w"].view(-1, hdim)[:heads * head_dim]).view(m, heads, head_dim)
    pos = a["pos"][:m].long()
    angle = pos.float()[:, None] * a["inv_freq"][None, :half].float()  # fp32, as the kernel
    c, s = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
    lo, hi = y[..., :half], y[..., half:]
    rot = torch.cat([lo * c - hi * s, hi * c + lo * s], dim=-1)
    y = torch.cat([rot[:, :nh + nkv], y[:, nh + nkv:]], dim=1).to(BF16)
    q = a["q"].clone()
    q.view(-1, nh, head_dim)[:m] = y[:, :nh]
    k_cache, v_cache = a["k_cache"].clone(), a["v_cache"].clone()
    kc = k_cache.view(-1, nkv, cap, head_dim)
    vc = v_cache.view(-1, nkv, cap, head_dim)
    seq = a["seq"][:m].long()
    for row in range(m):
        if pos[row] < cap:
            kc[seq[row], :, pos[row]] = y[row, nh:nh + nkv]
            vc[seq[row], :, pos[row]] = y[row, nh + nkv:]
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache}


def _attend(q, k, v, scale, mask=None):
    """softmax(q kᵀ scale) v in float64 for q [..., G, D], k, v [..., L, D]; `mask`
    (broadcast to [..., G, L]) false where a key is not attended."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


def attn_decode(a, head_dim):
    m, nh, nkv, cap = a["M"], a["NH"], a["NKV"], a["CAP"]
    q = a["q"].view(-1, nkv, nh // nkv, head_dim)
    kc = a["k_cache"].view(-1, nkv, cap, head_dim)
    vc = a["v_cache"].view(-1, nkv, cap, head_dim)
    out = a["out"].clone()
    o = out.view(-1, nkv, nh // nkv, head_dim)
    for row in range(m):  # all kv heads (and their q heads) of a row at once
        length = int(a["pos"][row]) + 1
        s = int(a["seq"][row])
        o[row] = _attend(q[row], kc[s, :, :length], vc[s, :, :length],
                         a["sm_scale"]).to(BF16)
    return {"out": out, "counters": torch.zeros_like(a["counters"])}


def attn_prefill(a, head_dim):
    m, nh, nkv, cap = a["M"], a["NH"], a["NKV"], a["CAP"]
    group = nh // nkv
    q = a["q"].view(-1, nh, head_dim)
    s = int(a["seq"][0])
    kc = a["k_cache"].view(-1, nkv, cap, head_dim)[s]
    vc = a["v_cache"].view(-1, nkv, cap, head_dim)[s]
    pos = a["pos"][:m].long()
    length = int(pos.max()) + 1
    causal = torch.arange(length, device=pos.device)[None, :] <= pos[:, None]  # [m, L]
    out = a["out"].clone()
    o = out.view(-1, nh, head_dim)
    for head in range(nh):  # every row of a head at once, each over its own prefix
        g = head // group
        o[:m, head] = _attend(q[:m, head], kc[g, :length], vc[g, :length], a["sm_scale"],
                              causal).to(BF16)
    return {"out": out}


def proj_residual(a):
    m, n, k = a["M"], a["N"], a["K"]
    h = a["h"].clone()
    x = a["x"].view(-1, k)[:m]
    h.view(-1, n)[:m] = (h.view(-1, n)[:m].double()
                         + x.double() @ a["w"].view(-1, k)[:n].double().t()).float()
    return {"h": h, "counters": torch.zeros_like(a["counters"])}


def gate_up(a):
    m, hdim, inter = a["M"], a["H"], a["I"]
    xn = normed_rows(a, hdim)
    w = a["w"].view(-1, hdim)
    g, u = project(xn, w[:inter]), project(xn, w[inter:2 * inter])
    out = a["out"].clone()
    out.view(-1, inter)[:m] = (g / (1.0 + torch.exp(-g)) * u).to(BF16)
    return {"out": out}


def lm_head(a):
    m, v, hdim = a["M"], a["V"], a["H"]
    xn = normed_rows(a, hdim)
    y = project(xn, a["w"].view(-1, hdim)[:v])
    logits = a["logits"].clone()
    if a["keep_logits"]:  # else untouched
        logits.view(-1, v)[:m] = y
    tokens, pos = a["tokens"].clone(), a["pos"].clone()
    tokens[:m] = torch.argmax(y, dim=1).to(torch.int32)  # first index of the max
    pos[:m] += a["advance"]
    return {"logits": logits, "tokens": tokens, "pos": pos,
            "counters": torch.zeros_like(a["counters"])}


def llama3_inv_freq(head_dim, theta=500000.0, factor=32.0, low=1.0, high=4.0,
                    original=8192):
    """The rotary inverse frequencies with Llama 3 scaling, in float64 rounded once to
    fp32 (docs/llama.md: both engines compute them so)."""
    out = []
    for j in range(head_dim // 2):
        f = theta ** (-2.0 * j / head_dim)
        wavelen = 2 * math.pi / f
        if wavelen > original / low:
            f = f / factor
        elif wavelen >= original / high:
            smooth = (original / wavelen - low) / (high - low)
            f = (1 - smooth) * f / factor + smooth * f
        out.append(f)
    return torch.tensor(out, dtype=torch.float64).float()


# Model shapes (docs/llama.md).
TINY = {"H": 256, "NH": 4, "NKV": 2, "D": 64, "I": 512, "V": 1000}
LLAMA_1B = {"H": 2048, "NH": 32, "NKV": 8, "D": 64, "I": 8192, "V": 128256}
# The o and down projections' K splits: at most this many (llama_spec.SPLIT_MAX).
PROJ_SPLIT_MAX = 8


def _cdiv(a, b):
    return -(-a // b)


def _gen(device, seed):
    return torch.Generator(device=device).manual_seed(seed)


def _randn(shape, gen, device, scale=1.0, dtype=torch.float32, shift=0.0):
    return (torch.randn(shape, generator=gen, device=device) * scale + shift).to(dtype)


def _randint(high, shape, gen, device):
    return torch.randint(0, high, shape, generator=gen, device=device, dtype=torch.int32)


def make_inputs(kernel, shape, device="cpu", seed=0):
    """Arguments of pack kernel `kernel` for `shape` (M plus the model sizes H, NH, NKV,
    D, I, V; CAP and ctx, the context length, for the attention kernels and the KV
    append; `prefill` for rows of one sequence at consecutive positions; the LM head's
    `keep_logits`, 1 unless given)."""
    gen = _gen(device, seed)
    m, d = shape["M"], shape.get("D", 64)
    if kernel == "llama_embed":
        v, hdim = shape["V"], shape["H"]
        return {"tokens": _randint(v, (m,), gen, device),
                "table": _randn((v, hdim), gen, device, 0.02, BF16),
                "h": _randn((m, hdim), gen, device), "M": m, "H": hdim}
    if kernel == "llama_rmsnorm":
        hdim = shape["H"]
        return {"h": _randn((m, hdim), gen, device),
                "norm_w": _randn((hdim,), gen, device, 0.1, BF16, 1.0),
                "xn": torch.zeros((m, hdim), dtype=BF16, device=device),
                "M": m, "H": hdim, "eps": 1e-5}
    if kernel == "llama_qkv_rope":
        hdim, nh, nkv, cap = shape["H"], shape["NH"], shape["NKV"], shape["CAP"]
        prefill = shape.get("prefill", False)
        seqs = 1 if prefill else m
        if prefill:
            pos = torch.arange(m, dtype=torch.int32, device=device) + (cap - m) // 2
            seq = torch.zeros(m, dtype=torch.int32, device=device)
        else:
            pos = _randint(cap, (m,), gen, device)
            seq = torch.randperm(m, generator=gen, device=device).to(torch.int32)
        h = _randn((m, hdim), gen, device)
        norm_w = _randn((hdim,), gen, device, 0.1, BF16, 1.0)
        return {"h": h, "xn": rmsnorm(h, norm_w, 1e-5), "norm_w": norm_w,
                "w": _randn(((nh + 2 * nkv) * d, hdim), gen, device, 0.02, BF16),
                "inv_freq": llama3_inv_freq(d).to(device), "pos": pos, "seq": seq,
                "q": torch.zeros((m, nh, d), dtype=BF16, device=device),
                "k_cache": _randn((seqs, nkv, cap, d), gen, device, 1.0, BF16),
                "v_cache": _randn((seqs, nkv, cap, d), gen, device, 1.0, BF16),
                "M": m, "H": hdim, "NH": nh, "NKV": nkv, "CAP": cap, "eps": 1e-5}
    if kernel in ("llama_attn_decode", "llama_attn_prefill"):
        nh, nkv, cap, ctx = shape["NH"], shape["NKV"], shape["CAP"], shape["ctx"]
        prefill = kernel == "llama_attn_prefill"
        seqs = 1 if prefill else m
        if prefill:  # the last M of ctx positions
            pos = torch.arange(ctx - m, ctx, dtype=torch.int32, device=device)
            seq = torch.zeros(m, dtype=torch.int32, device=device)
        else:  # contexts ctx, ctx - 1, ... (at least 1)
            pos = (ctx - 1 - torch.arange(m, device=device) % max(1, ctx // 2)).to(torch.int32)
            seq = torch.randperm(m, generator=gen, device=device).to(torch.int32)
        args = {"q": _randn((m, nh, d), gen, device, 1.0, BF16),
                "k_cache": _randn((seqs, nkv, cap, d), gen, device, 1.0, BF16),
                "v_cache": _randn((seqs, nkv, cap, d), gen, device, 1.0, BF16),
                "pos": pos, "seq": seq}
        if not prefill:
            splits = shape.get("S", decode_splits(m, nkv))
            room = max(S_MAX, splits)  # the engine's scratch (a check may exceed S_MAX)
            args.update(o_part=torch.zeros(m * nh * room * d, device=device),
                        ml_part=torch.zeros(m * nh * room * 2, device=device),
                        counters=torch.zeros(m * nkv, dtype=torch.int32, device=device))
        args.update(out=torch.zeros((m, nh * d), dtype=BF16, device=device),
                    M=m, NH=nh, NKV=nkv, CAP=cap)
        if not prefill:
            args["S"] = splits
        args["sm_scale"] = 1.0 / math.sqrt(d)
        return args
    if kernel in ("llama_o_proj", "llama_down_proj"):
        n, k = shape["H"], (shape["NH"] * d if kernel == "llama_o_proj" else shape["I"])
        # part and counters: the split-K scratch (llama_proj_residual), room for any SPLIT
        # a config may have (the engines': SPLIT_MAX at M <= SPLIT_MAX_ROWS).
        return {"x": _randn((m, k), gen, device, 1.0, BF16),
                "w": _randn((n, k), gen, device, 0.02, BF16),
                "h": _randn((m, n), gen, device),
                "part": torch.zeros(PROJ_SPLIT_MAX * m * n, device=device),
                "counters": torch.zeros(_cdiv(m, 16) * _cdiv(n, 32), dtype=torch.int32,
                                        device=device),
                "M": m, "N": n, "K": k}
    if kernel == "llama_gate_up":
        hdim, inter = shape["H"], shape["I"]
        h = _randn((m, hdim), gen, device)
        norm_w = _randn((hdim,), gen, device, 0.1, BF16, 1.0)
        return {"h": h, "xn": rmsnorm(h, norm_w, 1e-5), "norm_w": norm_w,
                "w": _randn((2 * inter, hdim), gen, device, 0.02, BF16),
                "out": torch.zeros((m, inter), dtype=BF16, device=device),
                "M": m, "H": hdim, "I": inter, "eps": 1e-5}
    if kernel == "llama_lm_head":
        hdim, v = shape["H"], shape["V"]
        h = _randn((m, hdim), gen, device)
        norm_w = _randn((hdim,), gen, device, 0.1, BF16, 1.0)
        w = _randn((v, hdim), gen, device, 0.02, BF16)
        if shape.get("clear_winner", True):
            # Row m's greedy token far ahead of the rest, so that fp32 summation order
            # cannot change it: w[winner] = 0.05 * xn of the row.
            winners = _randint(v, (m,), gen, device).long()
            w[winners] = (rmsnorm(h, norm_w, 1e-5).float() * 0.05).to(BF16)
        keep = shape.get("keep_logits", 1)
        return {"h": h, "xn": rmsnorm(h, norm_w, 1e-5), "norm_w": norm_w, "w": w,
                # without keep_logits the logits must stay as they were: 123.0 each
                "logits": torch.full((m, v), 0.0 if keep else 123.0, device=device),
                "part_max": torch.zeros(m * v, device=device),
                "part_idx": torch.zeros(m * v, dtype=torch.int32, device=device),
                "counters": torch.zeros(m, dtype=torch.int32, device=device),
                "tokens": torch.zeros(m, dtype=torch.int32, device=device),
                "pos": _randint(1000, (m,), gen, device),
                "M": m, "V": v, "H": hdim, "eps": 1e-5, "advance": 1, "keep_logits": keep}
    raise KeyError(f"no inputs for kernel '{kernel}'")


def reference(kernel, args, head_dim=64):
    """{output: expected} for pack kernel `kernel` on `args`."""
    if kernel == "llama_embed":
        return embed(args)
    if kernel == "llama_rmsnorm":
        return rmsnorm_rows(args)
    if kernel == "llama_qkv_rope":
        return qkv_rope(args, head_dim)
    if kernel == "llama_attn_decode":
        return attn_decode(args, head_dim)
    if kernel == "llama_attn_prefill":
        return attn_prefill(args, head_dim)
    if kernel in ("llama_o_proj", "llama_down_proj"):
        return proj_residual(args)
    if kernel == "llama_gate_up":
        return gate_up(args)
    if kernel == "llama_lm_head":
        return lm_head(args)
    raise KeyError(kernel)
