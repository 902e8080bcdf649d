#!/usr/bin/env python3
"""GPU check of the example pack: build it from source (autotuned), launch every kernel
in every bucket and specialization through the C++ runtime (`kpack run`), and compare
with Triton's JIT running the same kernel, config and specialization in this process
(bit for bit) and with a torch reference (tolerance).

Usage: examples_check.py KPACK_BINARY REPO_ROOT [--fixed] [--pack DIR] [--tune-reps N]
  --fixed     build with each spec's default configs (no tuning): a fast rerun
  --pack DIR  check an existing pack (e.g. kernels/examplepack) instead of building
Environment: KPACK_EXAMPLES_KEEP=DIR builds the pack into DIR and keeps it (to commit a
tuned pack); KPACK_REQUIRE_GPU=1 turns a missing GPU/torch into a failure.
Exits 77 (skipped) when no GPU or torch is usable, unless KPACK_REQUIRE_GPU=1 (then 1).

Why the JIT comparison is bit-exact: for each pack variant the JIT reference is the same
Python function wrapped with do_not_specialize on every call parameter the variant makes
no assumption about, launched on arguments that satisfy the variant's assumptions, with
the variant's constexprs, num_warps, num_stages and num_ctas. Triton then compiles the
same specialization (div16 / eq1 on exactly the variant's parameters) for the same
target with the same options, so both sides run the same machine code on the same bytes;
line info is off on both sides, so the cubins are even byte-identical (printed, not
asserted). The torch references differ by rounding (fp32 sum order, ex2.approx, fp16/bf16
output rounding): they are compared with stated tolerances.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gpu_check import gpu_missing, unavailable

os.environ["TRITON_DISABLE_LINE_INFO"] = "1"  # the pack's cubins are built without it

# Check shapes per kernel: (shape, aligned?) per bucket. "Aligned" shapes satisfy every
# div16 of the kernel's specialization; the others break one integer's (the C++ side's
# buffers are always 256-byte aligned, so an odd size is what selects the generic variant).
SHAPES = {
    "vector_add": [({"n": 1 << 20}, True), ({"n": (1 << 20) + 3}, False), ({"n": 1}, False)],
    "layer_norm_fwd": [({"n_rows": 512, "N": 4096}, True), ({"n_rows": 300, "N": 1001}, False)],
    "layer_norm_bwd": [({"M": 500, "N": 512}, True), ({"M": 100, "N": 1000}, False),
                       ({"M": 1000, "N": 2048}, True), ({"M": 33, "N": 3001}, False),
                       ({"M": 64, "N": 8192}, True), ({"M": 40, "N": 10001}, False)],
    "softmax": [({"n_rows": 300, "n_cols": 512}, True), ({"n_rows": 300, "n_cols": 999}, False),
                ({"n_rows": 200, "n_cols": 4096}, True), ({"n_rows": 200, "n_cols": 3001}, False),
                ({"n_rows": 64, "n_cols": 20000}, True), ({"n_rows": 64, "n_cols": 20001}, False)],
    "layer_norm": [({"M": 512, "N": 4096}, True), ({"M": 500, "N": 1001}, False),
                   ({"M": 3, "N": 10000}, True)],
}
# The TMA kernels at shapes that are and are not multiples of their tiles (TMA clips the
# tiles; rows must stay 16-byte aligned: N, K multiples of 8).
SHAPES["matmul_tma"] = [({"M": 64, "N": 512, "K": 512}, True), ({"M": 40, "N": 520, "K": 264}, False),
                        ({"M": 1024, "N": 1024, "K": 512}, True),
                        ({"M": 1000, "N": 520, "K": 264}, False), ({"M": 4096, "N": 4096, "K": 4096}, True)]
for _name in ("attention_fwd", "attention_fwd_causal"):
    SHAPES[_name] = [({"Z": 2, "H": 4, "N_CTX": 1024}, True), ({"Z": 1, "H": 3, "N_CTX": 1000}, False),
                     ({"Z": 1, "H": 2, "N_CTX": 77}, False)]
for _dtype in ("fp16", "bf16"):
    SHAPES[f"matmul_{_dtype}"] = [
        ({"M": m, "N": n, "K": k}, aligned)
        for m in (1, 16, 17, 64, 100, 256, 257, 1000)
        for n, k, aligned in ((512, 512, True), (200, 200, False))]

# Tolerances against the torch references: each spec's `tolerance` (see each example's
# docstring), as the tuner uses them.


def holds(spec, special, args):
    """Whether the specialization's assumptions hold for ``args``."""
    import torch
    for name in special.div16:
        value = args[name]
        value = value.data_ptr() if isinstance(value, torch.Tensor) else value
        if value % 16:
            return False
    return all(args[name] == 1 for name in special.eq1)


def expected_variant(spec, args):
    """The most specialized valid specialization (ties: manifest order), as the runtime
    picks; the generic one is always valid."""
    valid = [s for s in spec.all_specializations() if holds(spec, s, args)]
    return max(valid, key=lambda s: len(s.div16) + len(s.eq1))


NPY_DTYPES = {"torch.float32": "float32", "torch.float16": "float16",
              "torch.bfloat16": "uint16"}  # bf16 travels as its bit pattern


def to_numpy(t):
    import numpy as np
    import torch
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)
    return t.contiguous().cpu().numpy()


def from_numpy(a, like):
    import numpy as np
    import torch
    if like.dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(like.device)
    return torch.from_numpy(a.copy()).to(like.device)


def bits(t):
    import torch
    return t.contiguous().view({4: torch.int32, 2: torch.int16}[t.element_size()])


def run_kpack(binary, pack, kernel, args, outputs, tmp, grid=None, descs=()):
    """Launch through `kpack run` (with ``grid`` when the manifest has none); return
    (variant name, {output: tensor}). ``descs``: the tensordesc parameters, whose tensors go
    as `tdesc:` arguments of their shape."""
    import numpy as np
    import torch
    # The buffers are the reference's own tensors, right by construction; some (a layer
    # norm's per-row statistics) are smaller than every size argument, which `kpack run`
    # otherwise refuses as a likely mistake.
    cmd = [binary, "run", str(pack), kernel, "--no-size-check"]
    if grid is not None:
        cmd += ["--grid", ",".join(str(g) for g in grid)]
    for name, value in args.items():
        if name in descs:
            if name in outputs:
                shape = "x".join(str(d) for d in value.shape)
                cmd += ["--arg", f"{name}=tdesc:zeros:{NPY_DTYPES[str(value.dtype)]}:{shape}"]
            else:
                path = os.path.join(tmp, f"{name}.npy")
                np.save(path, to_numpy(value))
                cmd += ["--arg", f"{name}=tdesc:@{path}"]
        elif isinstance(value, torch.Tensor):
            if name in outputs:
                cmd += ["--arg", f"{name}=zeros:{NPY_DTYPES[str(value.dtype)]}:{value.numel()}"]
            else:
                path = os.path.join(tmp, f"{name}.npy")
                np.save(path, to_numpy(value).reshape(-1))
                cmd += ["--arg", f"{name}=@{path}"]
        else:
            cmd += ["--arg", f"{name}={value!r}"]
    for name in outputs:
        cmd += ["--out", f"{name}=@{os.path.join(tmp, name + '.out.npy')}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"kpack run {kernel} failed ({result.returncode}): {result.stderr}"
                         f"\ncommand: {' '.join(cmd)}")
    first = result.stdout.splitlines()[0]  # "kernel K: variant V, grid (...) ..., block B"
    variant = first.split("variant ", 1)[1].split(",", 1)[0]
    got = {name: from_numpy(np.load(os.path.join(tmp, name + ".out.npy")), args[name])
           .view(args[name].shape) for name in outputs}
    return variant, first, got


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("repo")
    parser.add_argument("--fixed", action="store_true")
    parser.add_argument("--pack")
    parser.add_argument("--tune-reps", type=int, default=25)
    opts = parser.parse_args()
    missing = gpu_missing(opts.binary)
    if missing:
        return unavailable("examples check", missing)

    import torch
    import triton
    repo = Path(opts.repo).resolve()
    sys.path.insert(0, str(repo / "tools"))
    from kpack_tools import build as builder
    from kpack_tools.autotune import jit_launcher, tolerance_for
    from kpack_tools.spec import load_specs

    spec_files = [repo / "kernels" / "examples" / f"{n}.py"
                  for n in ("vector_add", "softmax", "layer_norm", "matmul", "layer_norm_train",
                            "matmul_tma", "attention_tma")]
    specs = {s.name: s for f in spec_files for s in load_specs(f)}
    print(f"triton {triton.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    with tempfile.TemporaryDirectory() as tmp:
        if opts.pack:
            pack = Path(opts.pack)
        else:
            pack = Path(os.environ.get("KPACK_EXAMPLES_KEEP") or os.path.join(tmp, "pack"))
            builder.build(spec_files, pack, tune=not opts.fixed, reps=opts.tune_reps)
        manifest = json.loads((pack / "manifest.json").read_text())
        tuning = json.loads((pack / "tuning.json").read_text())
        print(f"pack {pack}: tuned={tuning['tuned']} ({tuning.get('device') or tuning['reason']})")
        for k in tuning["kernels"]:
            for b in k["buckets"]:
                times = ", ".join(f"{c}={'fail' if t is None else f'{t:.2f}us'}"
                                  for c, t in (b["times_us"] or {}).items()) or "untimed"
                print(f"  tuning {k['name']:12} bucket {b['bucket']} ({b['range']}): "
                      f"chosen {b['chosen']}  [{times}]")
        chosen = {(k["name"], tuple(b["bucket"])): b["chosen"]
                  for k in tuning["kernels"] for b in k["buckets"]}

        failures, seen = [], set()
        for name, cases in SHAPES.items():
            spec = specs[name]
            kernel = next(k for k in manifest["kernels"] if k["name"] == name)
            variants = {v["name"]: v for v in kernel["variants"]}
            for shape, aligned in cases:
                args = spec.make_inputs(shape, "cuda")
                for out in spec.outputs:
                    args[out].zero_()
                index = spec.bucket_of(args)
                special = expected_variant(spec, args)
                if aligned != (special.name != "generic"):
                    failures.append(f"{name} {shape}: test shape meant aligned={aligned} but "
                                    f"selects {special.name}")
                want = builder.variant_name(spec, index, special)
                config = spec.config(chosen[(name, index)])
                grid = None if spec.manifest_grid else spec.grid_for(args, config)
                variant, line, got = run_kpack(opts.binary, pack, name,
                                               {p: args[p] for p in spec.call_params},
                                               spec.outputs, tmp, grid, spec.tensordesc_params)
                # Triton's JIT, specialized exactly like the variant.
                assumed = set(special.div16) | set(special.eq1)
                jit_fn = triton.JITFunction(
                    spec.fn.fn, do_not_specialize=[p for p in spec.call_params
                                                   if p not in assumed])
                compiled = jit_launcher(spec, config, args, fn=jit_fn)()
                torch.cuda.synchronize()
                same_cubin = hashlib.sha256(compiled.asm["cubin"]).hexdigest() == \
                    variants[variant]["sha256"]
                ref = spec.reference(args)
                for out in spec.outputs:
                    rtol, atol = tolerance_for(spec, out, ref[out])
                    bitwise = torch.equal(bits(got[out]), bits(args[out]))
                    err = (got[out].double() - ref[out].double()).abs().max().item()
                    ok_tol = torch.allclose(got[out].double(), ref[out].double(),
                                            rtol=rtol, atol=atol)
                    print(f"{name:14} {out:4} {str(shape):32} bucket {list(index)} variant {variant:12} "
                          f"config {config.name:20} C++==JIT bitwise: {bitwise}  "
                          f"same cubin: {same_cubin}  max|err| vs torch {err:.3e} "
                          f"(rtol {rtol}, atol {atol}): {'ok' if ok_tol else 'FAIL'}")
                    if variant != want:
                        failures.append(f"{name} {shape}: runtime chose {variant}, expected {want}")
                    if not bitwise:
                        failures.append(f"{name} {shape} {out}: C++ output differs from JIT")
                    if not ok_tol:
                        failures.append(f"{name} {shape} {out}: max error {err:.3e} vs torch")
                seen.add((name, variant))
        for kernel in manifest["kernels"]:
            for v in kernel["variants"]:
                if (kernel["name"], v["name"]) not in seen:
                    failures.append(f"{kernel['name']}: variant {v['name']} never launched")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"example pack: {len(seen)} variants launched through kpack run, every output "
          f"bit-identical to Triton's JIT and within tolerance of torch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
