#!/usr/bin/env python3
"""kpack imported before torch, on the GPU machine's own toolchain and torch: the checks of
tests/python/test_import_order.py (libkpack.so and _kpack need the shared libstdc++ and
define none of its symbols; `import kpack, torch` in a fresh interpreter works), run here
so that a machine with torch cannot skip them. The wheel's libkpack.so had libstdc++
linked in statically on the H200, and that import order aborted (test_import_order.py).

Exits 77 (skipped) without torch, unless KPACK_REQUIRE_GPU=1 (then 1).
"""

import importlib.util
import sys
import traceback
from pathlib import Path

import python_cases


def main():
    repo = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
    if importlib.util.find_spec("torch") is None:
        return python_cases.skip_or_fail("torch is not installed")
    path = repo / "tests" / "python" / "test_import_order.py"
    spec = importlib.util.spec_from_file_location("test_import_order", path)
    checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checks)  # imports kpack, not torch
    cases = [(f"shared C++ runtime: {lib.name}",
              lambda lib=lib: checks.test_the_package_uses_the_shared_cxx_runtime(lib))
             for lib in checks._libraries()]
    cases.append(("import kpack, torch", checks.test_torch_imports_after_kpack))
    failed = 0
    for name, check in cases:
        try:
            check()
            print(f"PASS {name}")
        except Exception:  # noqa: BLE001 (an assertion or a skip: both are failures here)
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
