#!/usr/bin/env python3
"""GPU check of kpack.graph (kpack::StepGraph from Python) on torch tensors (ctest
kpack_python_graph_gpu).

A step of kernels/graphpack -- layer_norm, matmul_fp16 on its output, softmax, vector_add --
bound once to torch tensors; 150 steps whose sizes change (crossing bucket edges) and whose
matmul output alternates between two tensors (a pointer change): each step replayed from
its graph on torch's current stream, then launched eagerly through the same bound launches,
and every output compared bit for bit. Prints the graph counters.

Usage: python_graph_check.py REPO_ROOT   (needs `pip install --no-build-isolation .` first)
Exits 77 (skipped) without torch or a GPU, unless KPACK_REQUIRE_GPU=1 (then 1).
"""

import random
import sys
from pathlib import Path

import python_cases


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    repo = Path(sys.argv[1]).resolve()
    # torch, triton and kpack (a missing package with torch and a GPU is a failure), or the
    # exit code: the GPU tier's skip rule (KPACK_REQUIRE_GPU).
    stack = python_cases.import_stack(repo)
    if isinstance(stack, int):
        return stack
    torch, _, kpack = stack
    pack = kpack.open(repo / "kernels" / "graphpack")
    gen = torch.Generator(device="cuda").manual_seed(3)
    rows, max_n, mm_cols, sm_rows, max_cols, max_vec = 80, 2048, 64, 16, 4096, 1 << 17
    lx = torch.randn(rows, max_n, device="cuda", generator=gen).half()
    ly = torch.empty_like(lx)
    w = torch.randn(max_n, device="cuda", generator=gen).half()
    b = torch.randn(max_n, device="cuda", generator=gen).half()
    wmat = torch.randn(max_n, mm_cols, device="cuda", generator=gen).half()
    cs = [torch.empty(rows, mm_cols, device="cuda", dtype=torch.half) for _ in range(2)]
    sm_in = torch.randn(sm_rows, max_cols, device="cuda", generator=gen) * 4
    sm_out = torch.empty_like(sm_in)
    x = torch.randn(max_vec, device="cuda", generator=gen)
    y = torch.randn(max_vec, device="cuda", generator=gen)
    out = torch.empty_like(x)
    outputs = [ly, *cs, sm_out, out]

    norm = pack.layer_norm.bind(lx, ly, w, b, max_n, rows, 512, 1e-5)
    mm = pack.matmul_fp16.bind(ly, wmat, cs[0], 10, mm_cols, 512, max_n, 1, mm_cols, 1,
                               mm_cols, 1)
    sm = pack.softmax.bind(sm_out, sm_in, max_cols, max_cols, sm_rows, 700)
    va = pack.vector_add.bind(x, y, out, 5000)
    step = [norm, mm, sm, va]
    graph = kpack.graph(step)

    rng = random.Random(5)
    failures = []
    steps = 150
    for i in range(steps):
        n_norm = rng.choice([rng.randrange(16, 1025, 16), rng.randrange(1040, max_n + 1, 16)])
        m = rng.choice([rng.randrange(1, 17), rng.randrange(17, 65), rng.randrange(65, rows + 1)])
        cols = rng.choice([rng.randrange(1, 1025), rng.randrange(1025, max_cols + 1)])
        n = rng.choice([rng.randrange(1, 4097), rng.randrange(4097, max_vec + 1)])
        norm.set("N", n_norm)
        mm.set("M", m)
        mm.set("K", n_norm)
        mm.set("c_ptr", cs[i % 2])
        sm.set("n_cols", cols)
        va.set("n", n)
        for t in outputs:
            t.view(torch.uint8).fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        replayed = [t.clone() for t in outputs]
        for t in outputs:
            t.view(torch.uint8).fill_(0xFF)
        for launch in step:
            launch()
        torch.cuda.synchronize()
        for k, (got, want) in enumerate(zip(replayed, outputs)):
            if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                failures.append(f"step {i} (N {n_norm}, M {m}, cols {cols}, n {n}): output {k} "
                                f"differs from the eager step's; graph {graph.signature}")
    stats = graph.stats()
    print(f"{steps} steps: {stats['graphs_built']} graphs built, {stats['replays']} replays, "
          f"{stats['nodes_patched']} nodes patched")
    if stats["replays"] != steps:
        failures.append(f"{stats['replays']} replays, expected {steps}")
    for line in failures[:20]:
        print(f"FAILED: {line}")
    if failures:
        return 1
    print("OK: every replay bit-identical to the eager step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
