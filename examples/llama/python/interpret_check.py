#!/usr/bin/env python3
"""The whole step plan on the CPU: the engine's triton backend (the pack's @triton.jit
kernels, kernels/llama/llama_kernels.py, launched with the contract's arguments and grids)
under TRITON_INTERPRET=1 on CPU torch tensors, against the numpy model of the contract
(numpy_model.py) and the PyTorch reference (reference.py, fp32), on a tiny checkpoint.

Checks, for greedy and teacher-forced runs with mixed prompt lengths (prefill buckets 1,
2-4, 5-16 and 17-64, decode at batch 1 and 3):
- every prefill and decode step's logits within --atol of the numpy model's, and the
  numpy model's within --atol of the reference's;
- greedy tokens equal to the numpy model's wherever the numpy model's top two logits are
  more than 2 --atol apart (elsewhere a tie may go either way; a greedy run stops
  comparing that row's later tokens, whose inputs then may differ).

Configs: each launch's constexprs, num_warps and num_stages are those of the variant kpack
selects (``--pack`` with its manifest; kpack's select_variant through ``--driver``, e.g.
the fake driver, when kpack is importable), or ``--configs builtin`` (a small fixed set of
block sizes: no pack needed). USE_PDL is forced off (the interpreter runs no inline PTX).

Triton 3.6's interpreter needs three fixes to run these kernels as the GPU does, applied
in this process by kernels/llama/check_kernels.py's ``interpreter_fixes``: ``tl.dot`` on
bf16 operands multiplies their raw uint16 bits; an fp32 -> bf16 cast truncates (the GPU
rounds to nearest even); and with numpy >= 2.4 a runtime integer used as a ``range``
bound fails (``int()`` of a one-element array).

    TRITON_INTERPRET=1 python3 interpret_check.py [--pack DIR [--driver LIB]] \
        [--configs builtin] [--steps 4]

Needs torch, triton, numpy, safetensors. Takes minutes (the interpreter is slow).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402


def patch_interpreter(kernels_dir: str) -> None:
    """The kernels' own check's fixes to Triton 3.6's interpreter (check_kernels.py)."""
    sys.path.insert(0, kernels_dir)
    import check_kernels  # noqa: PLC0415
    check_kernels.interpreter_fixes()


class BuiltinConfigs:
    """A fixed config per kernel (BLOCK_M by M: 1, 4, 16): for runs without a pack."""

    SOURCES = {"llama_o_proj": "llama_proj_residual", "llama_down_proj": "llama_proj_residual"}

    def source(self, kernel: str) -> str:
        return self.SOURCES.get(kernel, kernel)

    def __call__(self, call) -> tuple:
        M = call.named()["M"]
        bm = 1 if M == 1 else 4 if M <= 4 else 16
        proj = dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=64, STAGES=1, SWAP=0)
        c = {
            "llama_embed": dict(BLOCK=128),
            "llama_rmsnorm": dict(BLOCK=128),
            "llama_qkv_rope": dict(HEAD_DIM=64, BLOCK_M=bm, BLOCK_J=32, BLOCK_K=64, STAGES=1,
                                   SWAP=0),
            "llama_attn_decode": dict(HEAD_DIM=64, GROUP_BLOCK=2, BLOCK_N=16,
                                      SHORT_CTX=0, SHORT_N=16, SHORT_STAGES=1),
            "llama_attn_prefill": dict(HEAD_DIM=64, BLOCK_M=16, BLOCK_N=16),
            "llama_o_proj": dict(proj, SPLIT=1), "llama_down_proj": dict(proj, SPLIT=1),
            "llama_gate_up": proj,
            "llama_lm_head": dict(proj, BLOCK_N=128, FLAT=0),
        }[call.kernel]
        return dict(c, USE_PDL=False), 4, 1, 1, False


class NoPdl:
    """A chooser's configs with USE_PDL off."""

    def __init__(self, chooser):
        self.chooser = chooser
        self.source = chooser.source

    def __call__(self, call) -> tuple:
        constexprs, warps, stages, ctas, _ = self.chooser(call)
        constexprs = dict(constexprs)
        if "USE_PDL" in constexprs:
            constexprs["USE_PDL"] = False
        return constexprs, warps, stages, ctas, False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="The step plan under Triton's interpreter.")
    ap.add_argument("--pack", help="pack directory (its manifest's configs)")
    ap.add_argument("--driver", help="CUDA driver library for kpack (e.g. the fake driver)")
    ap.add_argument("--configs", choices=("pack", "builtin"), default="pack")
    ap.add_argument("--kernels", default=str(REPO / "kernels" / "llama"),
                    help="directory of llama_kernels.py")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--atol", type=float, default=1e-2)
    args = ap.parse_args(argv)
    patch_interpreter(args.kernels)
    import torch  # noqa: PLC0415

    import checkpoint  # noqa: PLC0415
    import engine  # noqa: PLC0415
    import numpy_model  # noqa: PLC0415
    import reference  # noqa: PLC0415
    from config import preset_dict, prompt_tokens  # noqa: PLC0415

    sys.path.insert(0, args.kernels)
    import llama_kernels  # noqa: PLC0415

    if args.configs == "builtin":
        chooser = BuiltinConfigs()
    else:
        if not args.pack:
            ap.error("--configs pack needs --pack")
        pack = None
        if args.driver:
            import kpack  # noqa: PLC0415
            pack = kpack.open(args.pack, driver=args.driver)
        chooser = engine.VariantChooser(Path(args.pack), pack)
    chooser = NoPdl(chooser)
    tmp = Path(tempfile.mkdtemp(prefix="llama_interp_"))
    checkpoint.write_checkpoint(tmp, preset_dict("tiny"), seed=5, backend="numpy")
    cfg, bits = checkpoint.load(tmp)
    weights = checkpoint.torch_weights(tmp, cfg)
    failures = []
    seed, steps, atol = 4, args.steps, args.atol
    for batch, lens in ((1, [1]), (3, [20, 3, 7])):
        capacity = max(lens) + steps + 1
        state = engine.DeviceState(cfg, weights, batch, max(lens), capacity, "cpu",
                                   read_logits=True)
        eng = engine.LlamaEngine.__new__(engine.LlamaEngine)
        eng.torch, eng.cfg, eng.state, eng.stream = torch, cfg, state, None  # a CPU engine
        eng.backends = {"triton": engine.TritonBackend(chooser, llama_kernels)}
        eng.use("triton")
        prompts = prompt_tokens(batch, lens, seed, cfg.V)
        for teacher_force in (False, True):
            label = f"batch {batch}, prompts {lens}, {'teacher-forced' if teacher_force else 'greedy'}"
            t0 = time.perf_counter()
            teacher = (engine.teacher_tokens(lens, steps, seed, cfg.V) if teacher_force
                       else None)
            got = eng.run_sequence(prompts, steps, keep_logits=True, teacher=teacher)
            model = numpy_model.NumpyLlama(cfg, bits, capacity, batch)
            want = numpy_model.generate(model, batch, lens, steps, seed, teacher_force)
            ref = reference.ReferenceLlama(cfg, weights, torch.float32, "cpu", batch, capacity)
            inputs = torch.from_numpy(want["inputs"] if teacher_force else
                                      want["tokens"][:, :steps].T.copy()).long()
            ref_logits = reference.teacher_forced(ref, prompts, inputs).numpy()
            ours = np.concatenate([got.prefill_logits.numpy()[None], got.step_logits.numpy()])
            oracle = np.concatenate([want["prefill_logits"][None], want["step_logits"]])
            d_np = np.abs(ours - oracle).max(axis=(1, 2))
            d_ref = np.abs(oracle - ref_logits).max(axis=(1, 2))
            if d_np.max() > atol:
                failures.append(f"{label}: logits differ from the numpy model's by "
                                f"{d_np.max():.3e} (per step {np.round(d_np, 5).tolist()})")
            if d_ref.max() > atol:
                failures.append(f"{label}: the numpy model differs from the reference by "
                                f"{d_ref.max():.3e}")
            tokens = np.array(got.generated)
            top2 = np.sort(oracle, axis=-1)[..., -2:]
            clear = (top2[..., 1] - top2[..., 0]) > 2 * atol      # [steps + 1, B]
            compared = 0
            for b in range(batch):
                for t in range(steps + 1):
                    if not clear[t, b]:
                        if teacher_force:  # later inputs do not depend on this token
                            continue
                        break
                    compared += 1
                    if tokens[b, t] != want["tokens"][b, t]:
                        failures.append(f"{label}: row {b} token {t} is {tokens[b, t]}, the "
                                        f"numpy model's {want['tokens'][b, t]}")
                        break
            print(f"{label}: max |logit - numpy| {d_np.max():.2e}, numpy vs reference "
                  f"{d_ref.max():.2e}, {compared} tokens compared (not tied), tokens "
                  f"{tokens.tolist()} ({time.perf_counter() - t0:.0f} s)")
    for f in failures:
        print(f"FAILED: {f}")
    if not failures:
        print("OK: the triton backend's step plan matches the numpy model and the reference")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
