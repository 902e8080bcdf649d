"""The ``kpack-build`` and ``kpack-record`` console scripts.

They run ``kpack_tools.build`` and ``kpack_tools.record`` (shipped in the same wheel) after
checking that the Triton they need is installed: the tools reproduce Triton 3.6.0's
specialization and ABI exactly, and ``kpack`` itself does not depend on Triton (a torch
install brings its own; ``pip install 'kpack[tools]'`` adds ``triton==3.6.0``).
"""

from __future__ import annotations

import importlib.metadata
import sys

from kpack_tools import SUPPORTED_TRITON_VERSIONS


def _check_triton(tool: str) -> bool:
    try:
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version in SUPPORTED_TRITON_VERSIONS:
        return True
    found = f"Triton {version} is installed" if version else "Triton is not installed"
    wanted = SUPPORTED_TRITON_VERSIONS[-1]
    print(f"{tool}: error: {found} in {sys.executable}; {tool} needs triton=={wanted} "
          f"(pip install 'kpack[tools]', or pip install triton=={wanted})", file=sys.stderr)
    return False


def build() -> int:
    if not _check_triton("kpack-build"):
        return 1
    from kpack_tools import build as tool  # noqa: PLC0415 (imports triton)
    return tool.main(prog="kpack-build")


def record() -> int:
    if not _check_triton("kpack-record"):
        return 1
    from kpack_tools import record as tool  # noqa: PLC0415
    return tool.main(prog="kpack-record")
