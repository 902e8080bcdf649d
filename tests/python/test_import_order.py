"""kpack loaded before other native libraries must not change what they bind to.

On the H200 the wheel's libkpack.so once came out with libstdc++ linked in statically
(std::locale among its objects, no DT_NEEDED on libstdc++.so.6). Loaded first, its copies
became the definitions that libstdc++.so.6 itself bound to, and `import torch` after
`import kpack` aborted in torch's import ("free(): invalid pointer" in std::locale's
destructor, called from libkpack.so); torch first worked. Shared builds link the shared
C++ runtime by path (CMakeLists.txt); these tests check the result on any machine and,
where torch is installed, the import itself.
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
# Defined by libstdc++ itself, never instantiated in a user's object: a library that
# defines it has a static copy of the C++ runtime in it.
RUNTIME_CANARIES = ["_ZNSt6localeD1Ev", "_ZNSt6locale5_ImplD1Ev", "_ZNSt8ios_base4InitC1Ev"]


def _libraries():
    """The native files `import kpack` loads from the package: the extension, and
    libkpack.so beside it in a shared build."""
    files = sorted(PACKAGE.glob("_kpack*.so"))
    assert files, f"no _kpack extension in {PACKAGE}"
    if _build_config.LIBRARY:
        files.append(PACKAGE / _build_config.LIBRARY)
    return files


def _readelf(*args: str) -> str:
    readelf = shutil.which("readelf")
    assert readelf, "readelf (binutils) is needed to read the libraries' dynamic sections"
    return subprocess.run([readelf, "-W", *args], check=True, capture_output=True,
                          text=True).stdout


def _needed(path: Path) -> list[str]:
    return [line.split("[", 1)[1].split("]", 1)[0]
            for line in _readelf("-d", str(path)).splitlines() if "(NEEDED)" in line]


def _defined(path: Path) -> set[str]:
    names = set()
    for line in _readelf("--dyn-syms", str(path)).splitlines():
        fields = line.split()  # Num: Value Size Type Bind Vis Ndx Name
        if len(fields) >= 8 and fields[6] != "UND":
            names.add(fields[7].split("@", 1)[0])
    return names


@pytest.mark.parametrize("path", _libraries(), ids=lambda p: p.name)
def test_the_package_uses_the_shared_cxx_runtime(path):
    assert "libstdc++.so.6" in _needed(path), f"{path.name} does not need libstdc++.so.6"
    static = sorted(set(RUNTIME_CANARIES) & _defined(path))
    assert static == [], f"{path.name} defines libstdc++'s own symbols {static}"


def test_torch_imports_after_kpack():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed in this interpreter")
    code = ("import kpack, torch; "
            "assert int(torch.arange(4).sum()) == 6; print('imported')")
    result = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "imported" in result.stdout, (
        f"rc={result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}")
