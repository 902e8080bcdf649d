"""Where the test-only module ``kpack_testing`` (tests/python/kpack_testing.cc: tensor
stand-ins) is: built beside the extension by ``pip install .`` in the wheel's build tree,
build/python/<wheel tag>/kpack/src/python, and never installed. ``$KPACK_TESTING_MODULE_DIR``
overrides the directory."""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def testing_module_dir() -> str:
    override = os.environ.get("KPACK_TESTING_MODULE_DIR")
    if override:
        return override
    name = "kpack_testing" + importlib.machinery.EXTENSION_SUFFIXES[0]
    for d in sorted((REPO / "build" / "python").glob("*/kpack/src/python")):
        if (d / name).is_file():
            return str(d)
    raise RuntimeError(f"the test module {name} is missing: `pip install .` from {REPO} builds "
                       "it in build/python/<wheel tag>/kpack/src/python (or set "
                       "KPACK_TESTING_MODULE_DIR)")


def add_to_sys_path() -> None:
    d = testing_module_dir()
    if d not in sys.path:
        sys.path.insert(0, d)
