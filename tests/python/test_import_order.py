"""kpack loaded before other native libraries: it must not change what they bind to.

Python loads extensions RTLD_LOCAL, so libkpack.so's and _kpack's symbols stay out of the
libraries loaded after them, except STB_GNU_UNIQUE ones, which the dynamic loader binds
process-wide: the first loaded definition wins for every later library. On the H200,
`import kpack` before `import torch` aborted inside torch's import ("free(): invalid
pointer") while the other order worked; GCC emits such symbols for the statics of inline
functions and templates (libstdc++'s, fmt's, nlohmann-json's), and kpack builds with
-fno-gnu-unique so that it exports none (CMakeLists.txt).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kpack
from kpack import _build_config

PACKAGE = Path(kpack.__file__).resolve().parent


def _libraries():
    """The native files `import kpack` loads from the package: the extension, and
    libkpack.so beside it in a shared build."""
    files = sorted(PACKAGE.glob("_kpack*.so"))
    if _build_config.LIBRARY:
        files.append(PACKAGE / _build_config.LIBRARY)
    return files


def _unique_symbols(path: Path) -> list[str]:
    readelf = shutil.which("readelf")
    assert readelf, "readelf (binutils) is needed to read the dynamic symbol table"
    out = subprocess.run([readelf, "-W", "--dyn-syms", str(path)], check=True,
                         capture_output=True, text=True).stdout
    names = []
    for line in out.splitlines():
        fields = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(fields) >= 8 and fields[4] == "UNIQUE" and fields[6] != "UND":
            names.append(fields[7])
    return names


def test_the_package_exports_no_gnu_unique_symbols():
    files = _libraries()
    assert any(f.name.startswith("_kpack") for f in files), files
    for path in files:
        assert path.is_file(), path
        assert _unique_symbols(path) == [], f"{path.name} exports STB_GNU_UNIQUE symbols"


def test_torch_imports_after_kpack():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed in this interpreter")
    code = ("import kpack, torch; "
            "assert int(torch.arange(4).sum()) == 6; print('imported')")
    result = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "imported" in result.stdout, (
        f"rc={result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}")
