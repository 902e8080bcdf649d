#!/usr/bin/env python3
"""GPU check of kpack.torch (ctest kpack_torch_ops_gpu): the example pack's kernels as
torch ops, under torch.compile and CUDA graphs, scratch memory from torch's caching
allocator, and the drop-in for Triton calls (kpack.install).

Sections, each printing what it measured; every failure is collected and printed at the end:
  native     the ops' CUDA implementations are kpack's C++ ones (libkpack_torch_ops.so,
             registered from torch_ops.cc, not Python); every example-pack case and the
             test pack's scalars kernel (int, i64, fp32, bf16, fp16, bool arguments, grid=)
             bit-identical through the C++ op, the Python-implemented op
             (register(native=False)) and the kernel object; wrong dtype (TypeError),
             device, grid, descriptor rank and refused values (ValueError) name the kernel
             and argument and launch nothing; a thread with no CUDA call yet; a plain
             torch.cuda.graph capture and replay
  ops        every example-pack kernel and shape (python_cases.py) through
             torch.ops.kpack_example.<kernel>: outputs bit-identical to Triton's JIT
  opcheck    torch.library.opcheck on every op of the example pack
  compile    torch.compile(fullgraph=True) over a step of four ops: no graph break, and
             with dynamic=True one compile for sizes across every bucket, outputs
             bit-identical to the eager ops
  cudagraph  mode="reduce-overhead" (cudagraph trees): recorded and replayed, no cudagraph
             skipped, outputs bit-identical to eager
  scratch    the test pack's kernel with Triton global scratch through its op: the scratch
             comes from torch's caching allocator (kpack keeps no arena), eagerly, under
             torch.cuda.graph capture + replay and under reduce-overhead; bit-identical to
             Triton's JIT
  dropin     kpack.torch.install(pack): the examples' own @triton.jit functions called as
             Triton programs call them launch through kpack, bit-identical to Triton's JIT;
             a call with a constexpr the pack lacks falls back to the JIT with a
             DropInWarning and is counted; strict=True raises DropInError
  dynamo     installed Triton calls inside torch.compile(fullgraph=True): the calls the pack
             serves become kpack ops in the graph (launched by kpack, bit-identical to the
             eager drop-in, also under reduce-overhead); one it cannot serve stays Dynamo's
             triton_kernel_wrapper_mutation (Inductor's), with a DropInWarning

Usage: torch_ops_check.py REPO_ROOT [--only SECTION,...]
(needs `pip install --no-build-isolation .` into this Python first). Exits 77 (skipped)
without torch or a GPU, unless KPACK_REQUIRE_GPU=1 (then 1).
"""

import argparse
import sys
import time
import traceback
import warnings
from pathlib import Path

SECTIONS = ("native", "ops", "opcheck", "compile", "cudagraph", "scratch", "dropin", "dynamo")


class Check:
    def __init__(self):
        self.failures = []

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
        return ok


def op_args(case):
    """A case's call arguments for its op: a tensor descriptor argument (the examples' are
    over whole tensors) is its tensor, as the op's schema takes it."""
    return [getattr(a, "base", a) if type(a).__name__ == "TensorDescriptor" else a
            for a in case.call]


def section_native(c, torch, ctx):
    import threading
    import triton
    import kpack.torch as kt
    pc, pack, ops, testpack = ctx["pc"], ctx["pack"], ctx["ops"], ctx["testpack"]
    print(f"native ops available: {kt.native_ops_available()} ({kt.native_ops_error()}); "
          f"kpack_example ops.native={ops.native}")
    c.expect(ops.native and kt.native_ops_available(),
             f"native: the ops are not C++: {kt.native_ops_error()}")
    dump = torch._C._dispatch_dump("kpack_example::vector_add")
    cuda = [line for line in dump.splitlines() if line.startswith("CUDA")]
    print(f"native: dispatcher's CUDA kernel of kpack_example::vector_add: {cuda}")
    c.expect(len(cuda) == 1 and "torch_ops.cc" in cuda[0],
             f"native: the CUDA kernel is not torch_ops.cc's: {cuda}")
    py = kt.register(pack, "kpack_example_py", native=False)
    c.expect(not py.native, "native: register(native=False) gave C++ implementations")

    for case in ctx["cases"]:
        extra = {"grid": list(case.grid)} if case.grid else {}
        runs = {"kernel": lambda: pack[case.name](*case.call, grid=case.grid),
                "native op": lambda: ops[case.name](*op_args(case), **extra),
                "python op": lambda: py[case.name](*op_args(case), **extra)}
        outs = {}
        for label, run in runs.items():
            case.reset_outputs()
            run()
            torch.cuda.synchronize()
            outs[label] = {o: case.args[o].clone() for o in case.spec.outputs}
        same = all(pc.same_bits(outs[label][o], outs["kernel"][o])
                   for label in ("native op", "python op") for o in case.spec.outputs)
        print(f"native {case.name:14} {str(case.shape):38} C++ op == Python op == kernel "
              f"object, bitwise: {same}")
        c.expect(same, f"native: {case.name} {case.shape}: the ops differ from the kernel object")

    scalars, k = torch.ops.kpack_test.scalars, testpack.scalars
    x = torch.randn(1000, device="cuda")
    for flag, big in ((True, 2**40 + 3), (False, -(2**40))):
        values = (1000, 1.5, -2.0, 0.25, flag, big)
        want, got = torch.zeros_like(x), torch.zeros_like(x)
        k(x, want, *values, grid=(triton.cdiv(1000, 256),))
        scalars(x, got, *values, grid=[triton.cdiv(1000, 256)])
        torch.cuda.synchronize()
        formula = x * 1.5 + (-2.0) + 0.25 + (3.0 if flag else -1.0)
        same = torch.equal(got, want) and torch.allclose(got, formula)
        print(f"native scalars flag={flag} big={big}: C++ op == kernel object == formula: {same}")
        c.expect(same, f"native: scalars flag={flag}: the op differs from the kernel object")

    n = 4096
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.zeros_like(a)
    tma = next((cs for cs in ctx["cases"] if cs.name == "matmul_tma"), None)
    bad = [
        ("dtype", TypeError, r"kernel 'vector_add': argument 0 \('x_ptr', \*fp32\): the "
         r"tensor's dtype is Half but the kernel was compiled for \*fp32",
         lambda: ops.vector_add(a.half(), b, out, n)),
        ("device", ValueError, r"kernel 'vector_add': argument 1 \('y_ptr', \*fp32\): the "
         r"tensor is on cpu; kpack launches on CUDA devices",
         lambda: ops.vector_add(a, b.cpu(), out, n)),
        ("value", ValueError, r"'n'.*2147483648", lambda: ops.vector_add(a, b, out, 2**31)),
        ("grid axes", ValueError, r"kernel 'scalars': grid must have 1 to 3 axes, got 4",
         lambda: scalars(a, out, n, 1.0, 1.0, 1.0, True, 0, grid=[1, 1, 1, 1])),
        ("grid value", ValueError, r"kernel 'scalars': grid: axis 0 is -1",
         lambda: scalars(a, out, n, 1.0, 1.0, 1.0, True, 0, grid=[-1])),
    ]
    if tma is not None:
        first = op_args(tma)[0]
        bad.append(("descriptor rank", ValueError, r"kernel 'matmul_tma': argument 0 .*: the "
                    r"tensor has 1 dimensions but the descriptor's block has 2",
                    lambda: ops.matmul_tma(first.flatten(), *op_args(tma)[1:],
                                           **({"grid": list(tma.grid)} if tma.grid else {}))))
    if torch.cuda.device_count() > 1:
        other = b.to("cuda:1")
        bad.append(("other device", ValueError, r"argument 1 \('y_ptr', \*fp32\): the tensor "
                    r"is on cuda:1 but the current device is cuda:0",
                    lambda: ops.vector_add(a, other, out, n)))
    import re
    for what, error, pattern, call in bad:
        out.zero_()
        try:
            call()
            torch.cuda.synchronize()
            c.expect(False, f"native: {what}: no error")
        except error as e:
            ok = re.search(pattern, str(e)) is not None
            print(f"native error {what}: {type(e).__name__}: {str(e).splitlines()[0]}")
            c.expect(ok, f"native: {what}: message {str(e).splitlines()[0]!r} does not match "
                         f"{pattern!r}")
        except Exception as e:  # noqa: BLE001 -- the wrong type is the failure reported
            c.expect(False, f"native: {what}: {type(e).__name__} instead of {error.__name__}: {e}")
        torch.cuda.synchronize()
        c.expect(not out.any().item(), f"native: {what}: raised but something was written")

    result = []

    def on_thread():
        o = torch.zeros_like(a)
        ops.vector_add(a, b, o, n)
        torch.cuda.synchronize()
        result.append(torch.equal(o, a + b))
    t = threading.Thread(target=on_thread)
    t.start()
    t.join()
    print(f"native op on a fresh thread: {result}")
    c.expect(result == [True], f"native: the op on a fresh thread: {result}")

    out.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.vector_add(a, b, out, n)
    c.expect(not out.any().item(), "native: captured, yet ran during the capture")
    graph.replay()
    torch.cuda.synchronize()
    same = torch.equal(out, a + b)
    print(f"native op under torch.cuda.graph: replay == a + b: {same}")
    c.expect(same, "native: the captured op's replay computed a wrong result")
    del graph


def section_ops(c, torch, ctx):
    ops, cases = ctx["ops"], ctx["cases"]
    for case in cases:
        case.reset_outputs()
        extra = {"grid": list(case.grid)} if case.grid else {}
        ops[case.name](*op_args(case), **extra)
        torch.cuda.synchronize()
        for out in case.spec.outputs:
            same = ctx["pc"].same_bits(case.args[out], case.expected[out])
            print(f"op {case.name:14} {str(case.shape):38} {out:8} bitwise == JIT: {same}")
            c.expect(same, f"ops: {case.name} {case.shape}: {out} differs from Triton's JIT")


def section_opcheck(c, torch, ctx):
    ops, done = ctx["ops"], set()
    for case in ctx["cases"]:
        if case.name in done:
            continue
        done.add(case.name)
        case.reset_outputs(0.0)  # opcheck compares outputs; NaN never equals itself
        kwargs = {"grid": list(case.grid)} if case.grid else {}
        result = torch.library.opcheck(ops[case.name].default, tuple(op_args(case)), kwargs)
        print(f"opcheck {case.name}: {result}")
        c.expect(all(v == "SUCCESS" for v in result.values()),
                 f"opcheck: {case.name}: {result}")
    c.expect(done == set(ctx["pack"].kernel_names),
             f"opcheck: ran {sorted(done)}, the pack has {ctx['pack'].kernel_names}")


def make_step(torch):
    ex = torch.ops.kpack_example

    def step(x, y, rows, a, b):
        """Four kpack ops: vector add, softmax over rows, fp16 matmul, layer norm."""
        s = torch.empty_like(x)
        ex.vector_add(x, y, s, x.numel())
        p = torch.empty_like(rows)
        ex.softmax(p, rows, rows.stride(0), p.stride(0), rows.shape[0], rows.shape[1])
        m, k = a.shape
        n = b.shape[1]
        mm = torch.empty((m, n), device=a.device, dtype=a.dtype)
        ex.matmul_fp16(a, b, mm, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                       mm.stride(0), mm.stride(1))
        w = torch.ones(k, device=a.device, dtype=a.dtype)
        bias = torch.zeros(k, device=a.device, dtype=a.dtype)
        ln = torch.empty_like(a)
        ex.layer_norm(a, ln, w, bias, a.stride(0), m, k, 1e-5)
        return s, p, mm, ln
    return step


# Sizes across every bucket of softmax (n_cols: 1024, 8192) and matmul (M: 16, 64, 256).
STEP_SIZES = [(1 << 16, 64, 512, 8), (5000, 32, 4096, 40), (123457, 16, 20000, 100),
              (77777, 8, 3000, 1000)]


def step_inputs(torch, n, rows, cols, m, k=256, nn=128):
    g = torch.Generator(device="cuda").manual_seed(n)
    return (torch.randn(n, device="cuda", generator=g),
            torch.randn(n, device="cuda", generator=g),
            torch.randn(rows, cols, device="cuda", generator=g),
            torch.randn(m, k, device="cuda", generator=g).half(),
            torch.randn(k, nn, device="cuda", generator=g).half())


def same_all(torch, got, want):
    return all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want))


def section_compile(c, torch, ctx):
    from torch._dynamo.testing import CompileCounterWithBackend
    step = make_step(torch)
    for dynamic in (False, True):
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("inductor")
        compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=dynamic)
        sizes = STEP_SIZES if dynamic else STEP_SIZES[:1]
        for size in sizes:
            inputs = step_inputs(torch, *size)
            want = [t.clone() for t in step(*inputs)]
            t0 = time.time()
            got = compiled(*inputs)
            torch.cuda.synchronize()
            same = same_all(torch, got, want)
            print(f"compile dynamic={dynamic} sizes {size}: bitwise == eager ops: {same} "
                  f"({time.time() - t0:.1f} s), compiles so far {counter.frame_count}")
            c.expect(same, f"compile dynamic={dynamic} {size}: outputs differ from the eager ops")
        c.expect(counter.frame_count == 1,
                 f"compile dynamic={dynamic}: {counter.frame_count} compiles for {len(sizes)} "
                 f"size sets across buckets (expected 1, no recompile)")


def section_cudagraph(c, torch, ctx):
    from torch._dynamo.utils import counters
    step = make_step(torch)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for size in STEP_SIZES[:2]:
        inputs = step_inputs(torch, *size)
        want = [t.clone() for t in step(*inputs)]
        for i in range(4):  # warm-up, record, replays
            torch.compiler.cudagraph_mark_step_begin()
            got = compiled(*inputs)
            torch.cuda.synchronize()
            same = same_all(torch, got, want)
            print(f"reduce-overhead {size} call {i}: bitwise == eager ops: {same}")
            c.expect(same, f"cudagraph: {size} call {i}: outputs differ from the eager ops")
    skips = dict(counters["inductor"])
    print(f"inductor counters: {skips}")
    c.expect(skips.get("cudagraph_skips", 0) == 0, f"cudagraph: cudagraphs skipped: {skips}")


def section_scratch(c, torch, ctx):
    import triton
    from kpack_tools.build_test_pack import scratch_kernel
    testpack, kt = ctx["testpack"], torch.ops.kpack_test
    m, n = 128, 96
    grid = [m // 32, n // 32]
    x = torch.randn(m, n, device="cuda")
    # Triton's JIT, with torch memory for its scratch, as a torch program sets it up.
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    jit_out = torch.zeros_like(x)
    scratch_kernel[tuple(grid)](x, jit_out, m, n, n, BLOCK_M=32, BLOCK_N=32, num_warps=4)
    torch.cuda.synchronize()
    c.expect(torch.equal(jit_out, x * 2), "scratch: Triton's JIT result is not x * 2")

    def allocations():
        return torch.cuda.memory_stats()["allocation.all.allocated"]

    out = torch.zeros_like(x)
    before = allocations()
    for _ in range(3):
        kt.scratch(x, out, m, n, n, grid=grid)
    torch.cuda.synchronize()
    took = allocations() - before
    stats = testpack.stats()
    same = torch.equal(out.view(torch.int32), jit_out.view(torch.int32))
    print(f"scratch eager: bitwise == JIT: {same}; caching-allocator allocations for 3 "
          f"launches: {took}; kpack {stats}")
    c.expect(same, "scratch: the op's output differs from Triton's JIT")
    c.expect(took >= 3, f"scratch: 3 launches made {took} caching-allocator allocations")
    c.expect(stats["scratch_arenas"] == 0 and stats["scratch_bytes"] == 0,
             f"scratch: kpack made its own scratch arena: {stats}")

    out2 = torch.zeros_like(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kt.scratch(x, out2, m, n, n, grid=grid)
    graph.replay()
    torch.cuda.synchronize()
    same = torch.equal(out2, jit_out)
    print(f"scratch under torch.cuda.graph: replay bitwise == JIT: {same}; kpack "
          f"{testpack.stats()}")
    c.expect(same, "scratch: captured and replayed, the output differs from Triton's JIT")
    c.expect(testpack.stats()["scratch_arenas"] == 0, "scratch: capture made a kpack arena")
    del graph

    def doubled(t):
        o = torch.empty_like(t)
        kt.scratch(t, o, t.shape[0], t.shape[1], t.stride(0),
                   grid=[triton.cdiv(t.shape[0], 32), triton.cdiv(t.shape[1], 32)])
        return o
    torch._dynamo.reset()
    compiled = torch.compile(doubled, mode="reduce-overhead", fullgraph=True)
    for i in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        got = compiled(x)
        torch.cuda.synchronize()
        same = torch.equal(got, jit_out)
        print(f"scratch reduce-overhead call {i}: bitwise == JIT: {same}")
        c.expect(same, f"scratch: reduce-overhead call {i} differs from Triton's JIT")
    c.expect(testpack.stats()["scratch_arenas"] == 0,
             f"scratch: reduce-overhead made a kpack arena: {testpack.stats()}")


def section_dropin(c, torch, ctx):
    import kpack
    import kpack.torch
    import triton
    from kpack_tools.autotune import jit_launcher
    from vector_add import vector_add_kernel
    pack = ctx["pack"]
    inst = kpack.torch.install(pack, namespace="kpack_example")
    try:
        calls = {}
        for case in ctx["cases"]:
            case.reset_outputs()
            # The examples' own functions, called the way Triton programs call them.
            jit_launcher(case.spec, case.config, case.args)()
            torch.cuda.synchronize()
            qualname = f"{case.spec.fn.fn.__module__}.{case.spec.fn.fn.__qualname__}"
            calls[qualname] = calls.get(qualname, 0) + 1
            for out in case.spec.outputs:
                same = ctx["pc"].same_bits(case.args[out], case.expected[out])
                print(f"drop-in {case.name:14} {str(case.shape):38} {out:8} bitwise == JIT: "
                      f"{same}")
                c.expect(same, f"dropin: {case.name} {case.shape}: {out} differs from Triton's "
                               f"JIT")
        stats = inst.stats()
        print(f"drop-in stats: {stats}")
        for qualname, n in calls.items():
            row = stats.get(qualname, {})
            c.expect(row.get("kpack") == n and row.get("triton") == 0,
                     f"dropin: {qualname}: {n} calls, stats {row} (expected all through kpack)")

        x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
        out = torch.zeros_like(x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            vector_add_kernel[(triton.cdiv(5000, 512),)](x, y, out, 5000, BLOCK=512)
        torch.cuda.synchronize()
        messages = [str(w.message) for w in caught if issubclass(w.category, kpack.DropInWarning)]
        print(f"drop-in fallback (BLOCK=512, not in the pack): {messages}")
        c.expect(len(messages) == 1 and "BLOCK=512" in messages[0],
                 f"dropin: expected one DropInWarning naming BLOCK=512, got {messages}")
        c.expect(torch.equal(out, x + y), "dropin: the JIT fallback computed a wrong result")
        row = inst.stats()["vector_add.vector_add_kernel"]
        c.expect(row["triton"] == 1, f"dropin: the fallback was not counted: {row}")

        kpack.install(pack, strict=True)
        out.zero_()
        try:
            vector_add_kernel[(triton.cdiv(5000, 512),)](x, y, out, 5000, BLOCK=512)
            c.expect(False, "dropin: strict=True did not raise")
        except kpack.DropInError as e:
            print(f"drop-in strict: DropInError: {e}")
        torch.cuda.synchronize()
        c.expect(not out.any().item(), "dropin: strict=True raised but something ran")
    finally:
        kpack.uninstall()


def section_dynamo(c, torch, ctx):
    import kpack
    import kpack.torch
    import triton
    from matmul import matmul_kernel
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx
    from vector_add import vector_add_kernel
    pack = ctx["pack"]
    kpack.torch.install(pack, namespace="kpack_example")
    try:
        def uses_triton(x, y, a, b):
            """Triton calls as a program writes them; the pack serves both."""
            out = torch.empty_like(x)
            vector_add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
            m, k = a.shape
            n = b.shape[1]
            mm = torch.empty((m, n), device=a.device, dtype=a.dtype)
            matmul_kernel[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]),
                                        triton.cdiv(n, meta["BLOCK_N"]))](
                a, b, mm, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                mm.stride(0), mm.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
            return out, mm

        def launches():
            return sum(s.launches for k in ("vector_add", "matmul_fp16")
                       for s in pack[k].stats().values())

        graphs = []

        def backend(gm, example_inputs):
            graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
            return compile_fx(gm, example_inputs)

        g = torch.Generator(device="cuda").manual_seed(3)
        x, y = (torch.randn(1 << 20, device="cuda", generator=g) for _ in range(2))
        a = torch.randn(300, 128, device="cuda", generator=g).half()
        b = torch.randn(128, 256, device="cuda", generator=g).half()
        want = [t.clone() for t in uses_triton(x, y, a, b)]  # eager: the drop-in
        torch._dynamo.reset()
        compiled = torch.compile(uses_triton, backend=backend, fullgraph=True)
        before = launches()
        got = compiled(x, y, a, b)
        torch.cuda.synchronize()
        targets = graphs[-1] if graphs else []
        routed = [t for t in targets if t.startswith("kpack_example.")]
        print(f"dynamo: installed Triton calls under torch.compile(fullgraph=True) traced as "
              f"{routed}; kpack launches during the compiled call: {launches() - before}; "
              f"bitwise == eager drop-in: {same_all(torch, got, want)}")
        c.expect("kpack_example.vector_add.default" in targets and
                 any(t.startswith("kpack_example.matmul_fp16__v") for t in targets),
                 f"dynamo: the installed calls did not become kpack ops: {targets}")
        c.expect(not any("triton_kernel_wrapper" in t for t in targets),
                 f"dynamo: a served call stayed Dynamo's Triton call: {targets}")
        c.expect(launches() - before == 2, f"dynamo: {launches() - before} kpack launches "
                                           f"during the compiled call, expected 2")
        c.expect(same_all(torch, got, want), "dynamo: compiled outputs differ from eager")

        torch._dynamo.reset()
        counters.clear()
        graphed = torch.compile(uses_triton, mode="reduce-overhead", fullgraph=True)
        for i in range(4):
            torch.compiler.cudagraph_mark_step_begin()
            got = graphed(x, y, a, b)
            torch.cuda.synchronize()
            same = same_all(torch, got, want)
            print(f"dynamo reduce-overhead call {i}: bitwise == eager drop-in: {same}")
            c.expect(same, f"dynamo: reduce-overhead call {i} differs from eager")
        c.expect(counters["inductor"].get("cudagraph_skips", 0) == 0,
                 f"dynamo: cudagraphs skipped: {dict(counters['inductor'])}")

        def unserved(x, y):
            out = torch.empty_like(x)
            vector_add_kernel[(triton.cdiv(x.numel(), 512),)](x, y, out, x.numel(), BLOCK=512)
            return out
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = torch.compile(unserved, backend=backend, fullgraph=True)(x, y)
        torch.cuda.synchronize()
        messages = [str(w.message) for w in caught if issubclass(w.category, kpack.DropInWarning)]
        print(f"dynamo: a call the pack cannot serve (BLOCK=512) under compile: {graphs[-1]}; "
              f"warnings {messages}")
        c.expect(any("triton_kernel_wrapper_mutation" in t for t in graphs[-1]),
                 f"dynamo: the unserved call should stay Dynamo's Triton call: {graphs[-1]}")
        c.expect(any("BLOCK=512" in m for m in messages), f"dynamo: no DropInWarning: {messages}")
        c.expect(torch.equal(got, x + y), "dynamo: the unserved call computed a wrong result")
    finally:
        kpack.torch.uninstall()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help="comma-separated sections: " + ", ".join(SECTIONS))
    args = parser.parse_args()
    repo = args.repo.resolve()
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}")
    sys.path.insert(0, str(repo / "tests" / "gpu"))
    import python_cases as pc
    stack = pc.import_stack(repo)
    if isinstance(stack, int):
        return stack
    torch, _, kpack = stack
    pack_dir, specs, chosen = pc.load(repo)
    pack = kpack.open(pack_dir)
    testpack = kpack.open(repo / "kernels" / "testpack")
    ctx = {"pc": pc, "pack": pack, "testpack": testpack,
           "ops": kpack.torch.register(pack, "kpack_example")}
    kpack.torch.register(testpack, "kpack_test", kernels=["scratch", "scalars"])
    print(f"registered {ctx['ops']}")
    ctx["cases"] = list(pc.cases(pack, specs, chosen))  # Triton's JIT outputs, before install
    c = Check()
    for name in only:
        t0 = time.time()
        print(f"== {name}", flush=True)
        before = len(c.failures)
        try:
            globals()[f"section_{name}"](c, torch, ctx)
        except Exception:  # noqa: BLE001 -- reported, and the other sections still run
            c.failures.append(f"{name}: raised\n{traceback.format_exc()}")
        print(f"== {name}: {'ok' if len(c.failures) == before else 'FAILED'} "
              f"({time.time() - t0:.1f} s)", flush=True)
    if c.failures:
        print("FAILED:\n  " + "\n  ".join(c.failures))
        return 1
    print(f"kpack torch ops: {len(ctx['cases'])} cases bit-identical to Triton's JIT through "
          f"torch.ops and the drop-in; opcheck, torch.compile (fullgraph, dynamic, one compile), "
          f"reduce-overhead, scratch from the caching allocator: ok ({', '.join(only)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
