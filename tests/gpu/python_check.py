#!/usr/bin/env python3
"""GPU check of the kpack Python package on torch tensors (ctest kpack_python_gpu).

For every kernel of the committed example pack (kernels/examplepack) and every shape of
examples_check.SHAPES (each bucket, aligned and not; python_cases.py): launches through
kpack's Python eager call (grid= for kernels without grid expressions), through a bound
launch, and through kernel[grid] with a callable grid, and compares each output bit for
bit with Triton's JIT running the same kernel, config and specialization (examples_check
explains why that is exact). Then: launches inside torch.cuda.graph capture and replay, on
tensors and on raw pointers (which fails if kpack launched on any stream but torch's
current one), a launch on a side stream, and the error paths (CPU tensor, wrong dtype,
wrong count) on real tensors.

Usage: python_check.py REPO_ROOT       (needs `pip install --no-build-isolation .` first)
Exits 77 (skipped) without torch or a GPU, unless KPACK_REQUIRE_GPU=1 (then 1).
"""

import sys
from pathlib import Path


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    repo = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(repo / "tests" / "gpu"))
    import python_cases as pc
    stack = pc.import_stack(repo)
    if isinstance(stack, int):
        return stack
    torch, triton, kpack = stack
    pack_dir, specs, chosen = pc.load(repo)
    pack = kpack.open(pack_dir)

    failures, seen = [], set()
    for case in pc.cases(pack, specs, chosen):
        name, spec, kernel, call = case.name, case.spec, pack[case.name], case.call
        variant = kernel.select_variant(*call)
        if variant != case.want:
            failures.append(f"{name} {case.shape}: kpack selects {variant}, expected {case.want}")
        constexprs = dict(spec.constexprs(case.config))
        metas = []

        def grid(meta, case=case):
            # kpack's meta dict: the arguments, the chosen variant's constexprs (the
            # tuned config's) and its launch options.
            metas.append(meta)
            return spec.grid_for(case.args, case.config)

        # A kernel without grid expressions takes the caller's grid (grid=).
        explicit = {} if case.grid is None else {"grid": case.grid}
        paths = {
            "eager": lambda: kernel(*call, **explicit),
            "bound": lambda: (kernel[case.grid] if case.grid else kernel).bind(*call)(),
            "grid": lambda: kernel[grid](*call),
        }
        for path, launch in paths.items():
            case.reset_outputs()
            launch()
            torch.cuda.synchronize()
            for out in spec.outputs:
                same = pc.same_bits(case.args[out], case.expected[out])
                print(f"{name:14} {str(case.shape):38} {variant:12} {path:6} bitwise == JIT: "
                      f"{same}")
                if not same:
                    failures.append(f"{name} {case.shape} {path}: {out} differs from Triton's JIT")
        meta = metas[-1]
        if {k: meta[k] for k in constexprs} != constexprs or \
                meta["num_warps"] != case.config.num_warps or \
                any(meta[p] is not a for p, a in zip(spec.call_params, call)):
            failures.append(f"{name} {case.shape}: callable grid got meta {meta}, expected the "
                            f"arguments and {constexprs}, num_warps {case.config.num_warps}")
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
    # Raw device pointers (ints) carry no stream: once torch has initialized CUDA (it has
    # here), kpack launches them on torch's current stream, so they are captured too.
    for what, args in [("tensors", (x, y, out, n)),
                       ("raw pointers", (x.data_ptr(), y.data_ptr(), out.data_ptr(), n))]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            add(*args)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        print(f"graph capture + replay, {what}: {torch.equal(out, x + y)}")
        if not torch.equal(out, x + y):
            failures.append(f"vector_add on {what} captured in a CUDA graph: wrong output "
                            "after replay")
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
