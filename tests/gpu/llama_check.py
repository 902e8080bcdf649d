#!/usr/bin/env python3
"""GPU check of the Llama decode engine (ctest kpack_llama_python_gpu): the Python engine
(examples/llama/python/engine.py) through kernels/llamapack, at the tiny size and at the
full Llama-3.2-1B size, each a random checkpoint written here (make_checkpoint's writer, in
a temporary directory).

(a) Bit-identity, every step of a 128-step greedy run at batch 1 (prompt 32) and batch 8
    (mixed prompt lengths, prefill buckets 1 to 65-256): the sha256 digests of the logits
    after each step and of each row's prefill logits, and the tokens, of the kpack step
    graph, kpack eager (bound launches) and, given --kpack-llama, the C++ engine
    (`kpack-llama --json --digests`, graphs on and off). The Triton JIT arm's digests are
    reported, not required (Triton may pick another specialization than the pack). And
    the tokens of engines that do not read the logits (their LM head writes none): the
    Python step graph and the C++ engine without --digests.
(b) Against the PyTorch reference, teacher-forced on the same tokens (4 prompts x 64 steps,
    the prompt formula continued): KL(ref fp32 || x) and max |logit difference| per step,
    for x = kpack (graph) and x = the reference run in bf16. Criterion: kpack's mean KL and
    mean per-step max |difference| within 1.05x of the bf16 reference's. Greedy-token
    agreement with the fp32 reference is reported, not required.
(c) If transformers is importable: the reference (fp32, Hugging Face's rotary
    frequencies) against LlamaForCausalLM on the same checkpoint, every teacher-forced
    step of (b) against one forward over the whole token history.

Usage: llama_check.py REPO_ROOT [--kpack-llama PATH] [--sizes tiny,full] [--keep DIR]
Exits 77 (skipped) without torch or a GPU, unless KPACK_REQUIRE_GPU=1 (then 1).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import python_cases  # noqa: E402

STEPS = 128
KL_PROMPTS = [32, 17, 40, 9]
KL_STEPS = 64
RUNS = [(1, [32]), (8, [32, 17, 40, 5, 64, 23, 1, 100])]
SEED = 3
CRITERION = 1.05
# One KV capacity for every engine of (a), C++ and Python alike: CAP is a kernel argument,
# and the same values select the same variants (a multiple of 16, as 16384 is).
CAPACITY = 256


def write_checkpoint(llama_py: Path, out: Path, preset: str) -> None:
    """make_checkpoint.py's command line: numpy for the tiny one, torch on the GPU for the
    full size (seconds)."""
    t0 = time.perf_counter()
    backend = "numpy" if preset == "tiny" else "torch"
    cmd = [sys.executable, str(llama_py / "make_checkpoint.py"), "--preset", preset, "--seed",
           "11", "--out", str(out), "--backend", backend, "--device", "cuda"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    print(f"[{preset}] checkpoint written in {time.perf_counter() - t0:.1f} s ({backend})")


def run_cpp(binary: str, pack: Path, ckpt: Path, batch: int, lens, capacity: int,
            graphs: bool, out: Path, digests: bool = True) -> dict:
    cmd = [binary, "--pack", str(pack), "--checkpoint", str(ckpt), "--batch", str(batch),
           "--prompt-lens", ",".join(map(str, lens)), "--steps", str(STEPS), "--capacity",
           str(capacity), "--seed", str(SEED), "--graphs", "on" if graphs else "off",
           "--warmup-seqs", "0", "--timed-seqs", "1", "--json", str(out)]
    if digests:
        cmd.append("--digests")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return json.loads(out.read_text())


def compare(name_a: str, a: dict, name_b: str, b: dict) -> list:
    """Failures: every field of the two runs that differs, at its first step (the tokens
    alone where either run read no logits)."""
    fails = []
    keys = ("prefill_digests", "step_digests", "generated")
    if "step_digests" not in a or "step_digests" not in b:
        keys = ("generated",)
    for key in keys:
        x, y = a[key], b[key]
        if len(x) != len(y):
            fails.append(f"{name_a} vs {name_b}: {len(x)} {key}, {len(y)} {key}")
            continue
        bad = [i for i, (u, v) in enumerate(zip(x, y)) if u != v]
        if bad:
            fails.append(f"{name_a} vs {name_b}: {key} differ at {len(bad)} of {len(x)} "
                         f"(first: index {bad[0]})")
    return fails


def bit_identity(llama_py, engines, ckpt, pack, cpp, tmp, preset) -> list:
    import engine as eng_mod  # noqa: PLC0415
    from config import prompt_tokens  # noqa: PLC0415
    fails = []
    for batch, lens in RUNS:
        prompts = prompt_tokens(batch, lens, SEED, engines["graph"].cfg.V)
        runs = {}
        for name, e in engines.items():
            if not e.state.read_logits:
                runs[name] = {"generated": e.run_sequence(prompts, STEPS).generated}
                continue
            r = e.run_sequence(prompts, STEPS, digests=True)
            runs[name] = {"prefill_digests": r.prefill_digests, "step_digests": r.step_digests,
                          "generated": r.generated}
        graph_stats = engines["graph"].backend.stats()
        if cpp:
            for graphs in (True, False):
                out = tmp / f"cpp_{preset}_{batch}_{int(graphs)}.json"
                runs[f"c++ {'graph' if graphs else 'eager'}"] = run_cpp(
                    cpp, pack, ckpt, batch, lens, CAPACITY, graphs, out)
            j = run_cpp(cpp, pack, ckpt, batch, lens, CAPACITY, True,
                        tmp / f"cpp_{preset}_{batch}_nologits.json", digests=False)
            runs["c++ graph, no logits"] = {"generated": j["generated"]}
        label = f"[{preset}] batch {batch}, prompts {lens}"
        required = [n for n in runs if n != "triton"]
        mine = []
        for other in required[1:]:
            mine += compare(required[0], runs[required[0]], other, runs[other])
        fails += [f"{label}: {f}" for f in mine]
        print(f"{label}: {' = '.join(required)} -> "
              f"{'bit-identical, ' + str(STEPS) + ' steps' if not mine else 'DIFFERENT'}; "
              f"graph stats {graph_stats}")
        if "triton" in runs:
            t = compare("graph", runs["graph"], "triton", runs["triton"])
            print(f"{label}: triton JIT arm {'bit-identical' if not t else '; '.join(t)} "
                  "(reported, not required)")
        first = runs["graph"]["generated"]
        print(f"{label}: tokens row 0: {first[0][:12]}...")
        if not cpp:
            print(f"{label}: C++ engine not compared (no --kpack-llama given)")
    return fails


def kl_stats(ref32, other):
    """Per step: mean over rows of KL(ref32 || other), max over rows of max |diff|."""
    import torch  # noqa: PLC0415
    lp = torch.log_softmax(ref32.double(), dim=-1)
    lq = torch.log_softmax(other.double(), dim=-1)
    kl = (lp.exp() * (lp - lq)).sum(-1).mean(-1)
    diff = (ref32.double() - other.double()).abs().amax(dim=(-1, -2))
    return kl, diff


def against_reference(llama_py, graph_engine, ckpt, preset, hf_ok) -> list:
    import torch  # noqa: PLC0415
    import reference  # noqa: PLC0415
    from config import prompt_tokens  # noqa: PLC0415
    from engine import teacher_tokens  # noqa: PLC0415
    cfg = graph_engine.cfg
    B = len(KL_PROMPTS)
    prompts = prompt_tokens(B, KL_PROMPTS, SEED, cfg.V)
    teacher = teacher_tokens(KL_PROMPTS, KL_STEPS, SEED, cfg.V)
    r = graph_engine.run_sequence(prompts, KL_STEPS, keep_logits=True, teacher=teacher)
    kp = torch.cat([r.prefill_logits[None], r.step_logits]).cuda()
    inputs = torch.tensor(teacher, device="cuda")
    capacity = max(KL_PROMPTS) + KL_STEPS + 1
    weights = __import__("checkpoint").torch_weights(ckpt, cfg)
    logits = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = reference.ReferenceLlama(cfg, weights, dtype, "cuda", B, capacity)
        logits[name] = reference.teacher_forced(model, prompts, inputs)
        del model
    kl_k, d_k = kl_stats(logits["fp32"], kp)
    kl_b, d_b = kl_stats(logits["fp32"], logits["bf16"])
    agree_k = (kp.argmax(-1) == logits["fp32"].argmax(-1)).float().mean().item()
    agree_b = (logits["bf16"].argmax(-1) == logits["fp32"].argmax(-1)).float().mean().item()
    label = f"[{preset}] vs reference fp32, {B} prompts x {KL_STEPS} steps (+ prefill)"
    print(f"{label}: KL mean kpack {kl_k.mean():.3e} / ref bf16 {kl_b.mean():.3e} "
          f"(ratio {kl_k.mean() / kl_b.mean():.3f}); max|dlogit| mean kpack {d_k.mean():.3e} "
          f"/ ref bf16 {d_b.mean():.3e} (ratio {d_k.mean() / d_b.mean():.3f}); worst step "
          f"kpack KL {kl_k.max():.3e}, max|d| {d_k.max():.3e}; ref bf16 KL {kl_b.max():.3e}, "
          f"max|d| {d_b.max():.3e}; steps with kpack within {CRITERION}x on both: "
          f"{int(((kl_k <= CRITERION * kl_b) & (d_k <= CRITERION * d_b)).sum())}/{len(kl_k)}; "
          f"greedy agreement kpack {agree_k:.3f}, ref bf16 {agree_b:.3f}")
    fails = []
    if not kl_k.mean() <= CRITERION * kl_b.mean():
        fails.append(f"{label}: kpack's mean KL {kl_k.mean():.3e} > {CRITERION} x the bf16 "
                     f"reference's {kl_b.mean():.3e}")
    if not d_k.mean() <= CRITERION * d_b.mean():
        fails.append(f"{label}: kpack's mean max|dlogit| {d_k.mean():.3e} > {CRITERION} x the "
                     f"bf16 reference's {d_b.mean():.3e}")
    if hf_ok:
        fails += against_transformers(cfg, weights, ckpt, prompts, teacher, preset)
    return fails


def against_transformers(cfg, weights, ckpt, prompts, teacher, preset) -> list:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    import reference  # noqa: PLC0415
    try:
        hf = transformers.LlamaForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
    except TypeError:
        hf = transformers.LlamaForCausalLM.from_pretrained(str(ckpt), torch_dtype=torch.float32)
    hf = hf.cuda().eval()
    B = len(prompts)
    capacity = max(map(len, prompts)) + len(teacher) + 1
    ours = reference.ReferenceLlama(cfg, weights, torch.float32, "cuda", B, capacity,
                                    hf_rope=True)
    mine = reference.teacher_forced(ours, prompts, torch.tensor(teacher, device="cuda"))
    worst, scale = 0.0, 0.0
    with torch.no_grad():
        for b, prompt in enumerate(prompts):
            history = list(prompt) + [row[b] for row in teacher]
            out = hf(torch.tensor([history], device="cuda")).logits[0].float()
            want = out[len(prompt) - 1:]  # the prefill's last row, then one per step
            worst = max(worst, (want - mine[:, b]).abs().max().item())
            scale = max(scale, want.abs().max().item())
    ok = worst <= 1e-3 * max(1.0, scale)
    print(f"[{preset}] reference fp32 vs transformers {transformers.__version__} "
          f"LlamaForCausalLM: max |dlogit| {worst:.3e} over {B} rows x {len(teacher) + 1} "
          f"steps (logit scale {scale:.2f}) -> {'OK' if ok else 'DIFFERENT'}")
    return [] if ok else [f"[{preset}] reference vs transformers: max |dlogit| {worst:.3e}"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--kpack-llama", default="", help="the C++ engine's binary")
    ap.add_argument("--sizes", default="tiny,full")
    ap.add_argument("--keep", help="write the checkpoints here and keep them")
    args = ap.parse_args()
    repo = Path(args.repo).resolve()
    stack = python_cases.import_stack(repo)
    if isinstance(stack, int):
        return stack
    torch, _, _ = stack
    llama_py = repo / "examples" / "llama" / "python"
    sys.path.insert(0, str(llama_py))
    import engine as eng_mod  # noqa: PLC0415
    pack = repo / "kernels" / "llamapack"
    if not (pack / "manifest.json").is_file():
        print(f"FAILED: no pack at {pack}")
        return 1
    try:
        import transformers  # noqa: F401,PLC0415
        hf_ok = True
    except ImportError:
        hf_ok = False
        print("transformers is not importable: (c) not run")
    cpp = args.kpack_llama if args.kpack_llama and Path(args.kpack_llama).is_file() else ""
    fails = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(args.keep or tmpdir)
        for size in args.sizes.split(","):
            preset = {"tiny": "tiny", "full": "llama-3.2-1b"}[size]
            ckpt = tmp / preset
            if not (ckpt / "model.safetensors").is_file():
                write_checkpoint(llama_py, ckpt, preset)
            assert CAPACITY > max(max(lens) for _, lens in RUNS) + STEPS
            engines = {}
            # The Triton JIT arm at the tiny size only (its compiles cost GPU-machine time).
            for backend in ("graph", "eager") + (("triton",) if size == "tiny" else ()):
                engines[backend] = eng_mod.LlamaEngine(
                    str(ckpt), str(pack), backend, max_batch=8, max_prompt=128,
                    capacity=CAPACITY, device="cuda", read_logits=True)
            engines["graph, no logits"] = eng_mod.LlamaEngine(
                str(ckpt), str(pack), "graph", max_batch=8, max_prompt=128, capacity=CAPACITY,
                device="cuda")
            t0 = time.perf_counter()
            fails += bit_identity(llama_py, engines, ckpt, pack, cpp, tmp, preset)
            for name in [n for n in engines if n != "graph"]:
                del engines[name]
            fails += against_reference(llama_py, engines["graph"], ckpt, preset, hf_ok)
            del engines
            torch.cuda.empty_cache()
            print(f"[{preset}] checked in {time.perf_counter() - t0:.1f} s")
    for f in fails:
        print(f"FAILED: {f}")
    if fails:
        return 1
    print("OK: graph, eager" + (" and the C++ engine" if cpp else "") + " bit-identical; "
          f"kpack within {CRITERION}x of the bf16 reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
