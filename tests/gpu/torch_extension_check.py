#!/usr/bin/env python3
"""GPU check of kpack/torch.h (ctest kpack_torch_extension_gpu): builds the example torch
C++ extension (examples/torch_extension, setup.py with torch.utils.cpp_extension against
the installed kpack package) in a temporary directory, then launches its kernels on torch
tensors and compares every output bit for bit with the same kernels launched through
kpack's Python package (the same cubins), and with torch (tolerance); checks its errors
(CPU tensor, wrong dtype) and a CUDA graph capture of one of its calls.

Usage: torch_extension_check.py REPO_ROOT   (needs `pip install --no-build-isolation .`)
Exits 77 (skipped) without torch or a GPU, unless KPACK_REQUIRE_GPU=1 (then 1).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SKIP = 77


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    repo = Path(sys.argv[1]).resolve()
    try:
        import torch
    except ImportError as e:
        print(f"SKIPPED: cannot import torch: {e}")
        return 1 if os.environ.get("KPACK_REQUIRE_GPU") == "1" else SKIP
    if not torch.cuda.is_available():
        print("SKIPPED: torch sees no CUDA device")
        return 1 if os.environ.get("KPACK_REQUIRE_GPU") == "1" else SKIP
    try:
        import kpack
    except ImportError as e:
        print(f"FAILED: cannot import kpack ({e}); install it into {sys.executable} with "
              f"`pip install --no-build-isolation {repo}`")
        return 1

    failures = []
    with tempfile.TemporaryDirectory(prefix="kpack_torch_ext.") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(repo / "examples" / "torch_extension", src)
        t0 = time.time()
        build = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib",
                                str(Path(tmp) / "lib"), "--build-temp", str(Path(tmp) / "obj")],
                               cwd=src, capture_output=True, text=True)
        if build.returncode != 0:
            print(build.stdout[-6000:] + build.stderr[-6000:])
            print(f"FAILED: building the example extension (exit {build.returncode})")
            return 1
        print(f"built examples/torch_extension in {time.time() - t0:.0f} s")
        sys.path.insert(0, str(Path(tmp) / "lib"))
        import kpack_torch_example as ext

        pack_dir = repo / "kernels" / "examplepack"
        ext.open(str(pack_dir))
        pack = kpack.open(pack_dir)

        def check(what, got, want, reference=None, tol=(0.0, 0.0)):
            same = torch.equal(got.view(torch.int16 if got.element_size() == 2 else torch.int32),
                               want.view(torch.int16 if want.element_size() == 2 else torch.int32))
            line = f"{what:34} bitwise == kpack Python: {same}"
            if reference is not None:
                ok = torch.allclose(got.double(), reference.double(), rtol=tol[0], atol=tol[1])
                line += f"; vs torch within {tol}: {ok}"
                if not ok:
                    failures.append(f"{what}: differs from torch beyond {tol}")
            print(line)
            if not same:
                failures.append(f"{what}: differs from the Python launch of the same kernel")

        for n in (1 << 20, (1 << 20) + 3, 1):
            x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
            want = torch.empty_like(x)
            pack.vector_add(x, y, want, n)
            check(f"vector_add n={n}", ext.vector_add(x, y), want, x + y)
            check(f"vector_add_grid n={n}", ext.vector_add_grid(x, y, (n + 1023) // 1024), want)
        for rows, cols in ((300, 512), (300, 999), (64, 20000)):
            x = torch.randn(rows, cols, device="cuda")
            want = torch.empty_like(x)
            pack.softmax(want, x, x.stride(0), want.stride(0), rows, cols)
            check(f"softmax {rows}x{cols}", ext.softmax(x), want, torch.softmax(x, -1),
                  (1e-5, 1e-6))
        for m, n in ((512, 4096), (500, 1001)):
            x = torch.randn(m, n, device="cuda", dtype=torch.float16)
            w = torch.randn(n, device="cuda", dtype=torch.float16)
            b = torch.randn(n, device="cuda", dtype=torch.float16)
            want = torch.empty_like(x)
            pack.layer_norm(x, want, w, b, x.stride(0), m, n, 1e-5)
            ref = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5)
            check(f"layer_norm {m}x{n}", ext.layer_norm(x, w, b, 1e-5), want, ref, (2e-3, 1e-3))
        torch.cuda.synchronize()

        x = torch.randn(4096, device="cuda")
        for what, call, text in [
                ("CPU tensor", lambda: ext.vector_add(x.cpu(), x.cpu()), "is on cpu"),
                ("float64 tensor", lambda: ext.vector_add(x.double(), x.double()),
                 "dtype is Double but the kernel was compiled for *fp32")]:
            try:
                call()
                failures.append(f"{what}: no error")
            except RuntimeError as e:
                print(f"{what}: RuntimeError: {str(e).splitlines()[0]}")
                if text not in str(e):
                    failures.append(f"{what}: message lacks {text!r}: {e}")

        pack.preload()
        out = [None]
        graph = torch.cuda.CUDAGraph()
        y = torch.randn(4096, device="cuda")
        ext.vector_add(x, y)  # warm-up outside the capture (lazy loads, allocator)
        with torch.cuda.graph(graph):
            out[0] = ext.vector_add(x, y)
        graph.replay()
        torch.cuda.synchronize()
        print(f"graph capture + replay of the extension: {torch.equal(out[0], x + y)}")
        if not torch.equal(out[0], x + y):
            failures.append("extension call captured in a CUDA graph: wrong output")

    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("kpack/torch.h: the example extension builds with torch.utils.cpp_extension and "
          "launches bit-identically to kpack's Python package")
    return 0


if __name__ == "__main__":
    sys.exit(main())
