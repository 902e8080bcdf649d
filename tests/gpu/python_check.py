#!/usr/bin/env python3
"""GPU check of the kpack Python package on torch tensors (ctest kpack_python_gpu).

For every kernel of the committed example pack (kernels/examplepack) and every shape of
examples_check.SHAPES (each bucket, aligned and not): launches through kpack's Python
eager call, through a bound launch, and through kernel[grid] with a callable grid, and
compares each output bit for bit with Triton's JIT running the same kernel, config and
specialization (examples_check explains why that is exact). Then: launches inside
torch.cuda.graph capture and replay (which fails if kpack launched on any stream but
torch's current one), a launch on a side stream, and the error paths (CPU tensor, wrong
dtype, wrong count) on real tensors.

Usage: python_check.py REPO_ROOT       (needs `pip install --no-build-isolation .` first)
Exits 77 (skipped) without torch or a GPU, unless KPACK_REQUIRE_GPU=1 (then 1).
"""

import os
import sys
from pathlib import Path

SKIP = 77


def skip_or_fail(reason):
    print(f"SKIPPED: {reason}")
    return 1 if os.environ.get("KPACK_REQUIRE_GPU") == "1" else SKIP


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    repo = Path(sys.argv[1]).resolve()
    try:
        import torch
        import triton
    except ImportError as e:
        return skip_or_fail(f"cannot import torch/triton: {e}")
    if not torch.cuda.is_available():
        return skip_or_fail("torch sees no CUDA device")
    try:
        import kpack
    except ImportError as e:
        print(f"FAILED: cannot import kpack ({e}); install it into {sys.executable} with "
              f"`pip install --no-build-isolation {repo}`")
        return 1
    sys.path[:0] = [str(repo / "tools"), str(repo / "tests" / "gpu")]
    import examples_check as ec
    from kpack_tools import build as builder
    from kpack_tools.autotune import jit_launcher, tensor_descriptor
    from kpack_tools.pack import parse_tensordesc
    from kpack_tools.spec import load_specs

    print(f"kpack {kpack.__file__}, triton {triton.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    pack_dir = repo / "kernels" / "examplepack"
    pack = kpack.open(pack_dir)
    spec_files = [repo / "kernels" / "examples" / f"{n}.py"
                  for n in ("vector_add", "softmax", "layer_norm", "matmul", "layer_norm_train",
                            "matmul_tma", "attention_tma")]
    specs = {s.name: s for f in spec_files for s in load_specs(f)}
    import json
    tuning = json.loads((pack_dir / "tuning.json").read_text())
    chosen = {(k["name"], tuple(b["bucket"])): b["chosen"]
              for k in tuning["kernels"] for b in k["buckets"]}

    failures, seen = [], set()
    for name, cases in ec.SHAPES.items():
        spec, kernel = specs[name], pack[name]
        for shape, _ in cases:
            args = spec.make_inputs(shape, "cuda")
            index = spec.bucket_of(args)
            config = spec.config(chosen[(name, index)])
            # A tensordesc parameter takes Triton's TensorDescriptor over the tensor (its
            # block shape is the config's here, as Triton needs; kpack does not read it).
            types = dict(spec.params_for(config))
            objs = {p: tensor_descriptor(args[p], parse_tensordesc(types[p])[1])
                    if p in spec.tensordesc_params else args[p] for p in spec.call_params}
            call = [objs[p] for p in spec.call_params]
            special = ec.expected_variant(spec, args)
            want = builder.variant_name(spec, index, special)
            variant = kernel.select_variant(*call)
            if variant != want:
                failures.append(f"{name} {shape}: kpack selects {variant}, expected {want}")
            # Triton's JIT, specialized exactly like the variant, into the outputs.
            assumed = set(special.div16) | set(special.eq1)
            jit_fn = triton.JITFunction(spec.fn.fn, do_not_specialize=[
                p for p in spec.call_params if p not in assumed])
            for out in spec.outputs:
                args[out].zero_()
            jit_launcher(spec, config, args, fn=jit_fn)()
            expected = {out: args[out].clone() for out in spec.outputs}
            constexprs = dict(spec.constexprs(config))
            metas = []

            def grid(meta, spec=spec, args=args, config=config):
                # kpack's meta dict: the arguments, the chosen variant's constexprs (the
                # tuned config's) and its launch options.
                metas.append(meta)
                return spec.grid_for(args, config)

            paths = {
                "eager": lambda: kernel(*call),
                "bound": lambda: kernel.bind(*call)(),
                "grid": lambda: kernel[grid](*call),
            }
            for path, launch in paths.items():
                for out in spec.outputs:
                    args[out].fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
                for out in spec.outputs:
                    same = torch.equal(ec.bits(args[out]), ec.bits(expected[out]))
                    print(f"{name:12} {str(shape):38} {variant:12} {path:6} bitwise == JIT: "
                          f"{same}")
                    if not same:
                        failures.append(f"{name} {shape} {path}: {out} differs from Triton's JIT")
            meta = metas[-1]
            if {k: meta[k] for k in constexprs} != constexprs or \
                    meta["num_warps"] != config.num_warps or \
                    any(meta[p] is not objs[p] for p in spec.call_params):
                failures.append(f"{name} {shape}: callable grid got meta {meta}, expected the "
                                f"arguments and {constexprs}, num_warps {config.num_warps}")
            seen.add((name, variant))
    for name in pack.kernel_names:
        for v in pack[name].variants:
            if (name, v.name) not in seen:
                failures.append(f"{name}: variant {v.name} never launched")

    # Streams: graph capture (torch captures on a side stream; a launch anywhere else
    # breaks the capture) and an explicit side stream.
    pack.preload()
    add = pack.vector_add
    n = 1 << 20
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.zeros(n, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add(x, y, out, n)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    print(f"graph capture + replay: {torch.equal(out, x + y)}")
    if not torch.equal(out, x + y):
        failures.append("vector_add captured in a CUDA graph: wrong output after replay")
    side = torch.cuda.Stream()
    out.zero_()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        add(x, y, out, n)
        bound = add.bind(x, y, out, n)
    side.synchronize()
    if not torch.equal(out, x + y):
        failures.append("vector_add on a side stream: wrong output after that stream synced")

    # Errors on real tensors: nothing launched, the parameter named.
    for what, call, error in [
            ("CPU tensor", lambda: add(x.cpu(), y, out, n), ValueError),
            ("fp16 tensor", lambda: add(x.half(), y, out, n), TypeError),
            ("3 arguments", lambda: add(x, y, out), TypeError),
            ("n too big", lambda: add(x, y, out, 2**40), ValueError)]:
        try:
            call()
            failures.append(f"{what}: no exception")
        except error as e:
            print(f"{what}: {type(e).__name__}: {e}")
    del bound

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"kpack Python: {len(seen)} example-pack variants launched eager, bound and with a "
          f"callable grid on torch tensors, every output bit-identical to Triton's JIT; graph "
          f"capture, side stream and error paths ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
