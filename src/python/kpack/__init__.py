"""kpack: launch precompiled Triton kernels (a kpack *pack*) from Python at the driver's cost.

::

    import kpack
    pack = kpack.open("mypack")               # kpack.open(dir, preload=False, driver=None)
    add = pack["add"]                         # or pack.add; resolve once, keep it
    add(x, y, out, n)                         # grid from the manifest's grid expressions
    add[(triton.cdiv(n, 1024),)](x, y, out, n)          # explicit grid, as with Triton
    add[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    b = add.bind(x, y, out, n); b(); b.set("n", m); b()  # pack once, relaunch cheaply
    g = kpack.graph([b, ...]); b.set("n", m); g.replay()  # a CUDA graph of a step, patched

Arguments are the kernel's non-constexpr parameters in declaration order (or by name):
torch tensors (any object with ``__dlpack_c_exchange_api__``, ``data_ptr()`` or
``__dlpack__()``) and plain ints (raw device pointers) for pointer parameters, ints,
floats and bools for scalars. Each is checked against the parameter's Triton type before
anything is launched: a wrong count or kind is a ``TypeError``; a tensor on the CPU or on
another device than the current one, or a value that does not fit, is a ``ValueError``
(``kpack.InvalidArgumentError``). Both name the parameter.

The stream is ``stream=`` if given (an int ``CUstream``, a ``torch.cuda.Stream``, or an
object with ``__cuda_stream__``), else torch's current stream of the tensors' device (read
in C through the tensors' DLPack exchange table, not through ``torch.cuda``), else the
legacy default stream.

A callable grid gets a ``meta`` dict, as Triton's does: every call argument by parameter
name (the objects passed), the constexprs of the variant the arguments select (so
``meta["BLOCK"]`` is that variant's block size) and its ``num_warps``, ``num_ctas`` and
``num_stages``.

Errors from the runtime are ``kpack.Error`` subclasses chosen by the ``absl::Status`` code,
with its message and ``.code`` (the code's name):

=============================  =================================  ====================
class                          also a                             code
=============================  =================================  ====================
``InvalidArgumentError``       ``ValueError``                     INVALID_ARGUMENT
``NotFoundError``              ``LookupError``                    NOT_FOUND
``FailedPreconditionError``                                       FAILED_PRECONDITION
``UnavailableError``                                              UNAVAILABLE
``UnimplementedError``         ``NotImplementedError``            UNIMPLEMENTED
``ResourceExhaustedError``                                        RESOURCE_EXHAUSTED
``OutOfRangeError``            ``IndexError``                     OUT_OF_RANGE
``InternalError``                                                 INTERNAL
``Error`` (the base)           ``RuntimeError``                   any other
=============================  =================================  ====================

``k(*args, grid=g)`` is ``k[g](*args)``; ``scratch=`` gives kernels with Triton global
scratch their memory (a callable ``(nbytes, align, stream)`` returning an address or an
object with ``data_ptr()``, held until the launch is issued); ``k.restrict(variants)``
launches only some variants. ``kpack.torch`` registers a pack's kernels as torch ops, and
``kpack.install(pack)`` makes existing Triton ``kernel[grid](...)`` calls launch through
the pack (``kpack._dropin``).

Launches need a current CUDA context on the calling thread (torch makes one when it puts
a tensor on the GPU); a thread with none gets the primary context of its tensors' device,
as the CUDA runtime would do. The extension does not import torch.
"""

from __future__ import annotations

import os as _os
from typing import Iterator, List, Optional

from kpack import _kpack
from kpack._dropin import DropInError, DropInWarning, install, installed, uninstall
from kpack._kpack import (BoundLaunch, Error, FailedPreconditionError, GridLaunch, InternalError,
                          InvalidArgumentError, Kernel, NotFoundError, OutOfRangeError, Param,
                          ResourceExhaustedError, StepGraph, UnavailableError, UnimplementedError,
                          Variant, VariantStats, graph)

__all__ = [
    "open", "Pack", "Kernel", "GridLaunch", "BoundLaunch", "Param", "Variant", "VariantStats",
    "graph", "StepGraph",
    "Error", "InvalidArgumentError", "NotFoundError", "FailedPreconditionError",
    "UnavailableError", "UnimplementedError", "ResourceExhaustedError", "OutOfRangeError",
    "InternalError", "build_flags", "install", "uninstall", "installed", "DropInWarning",
    "DropInError",
]

__version__ = "0.1.0"


class Pack:
    """An open pack: its kernels by name (``pack["add"]`` or ``pack.add``).

    Kernel objects are made once per name and cached; they keep the pack open while they
    live. Thread safety: kernels may be launched from any thread (the launch holds the GIL).
    """

    def __init__(self, runtime: _kpack.Runtime):
        self._runtime = runtime
        self._kernels = {}

    @property
    def dir(self) -> str:
        """The pack directory as given to :func:`open`."""
        return self._runtime.dir

    @property
    def kernel_names(self) -> List[str]:
        """Every kernel's name, in manifest order."""
        return self._runtime.kernel_names

    def __getitem__(self, name: str) -> Kernel:
        kernel = self._kernels.get(name)
        if kernel is None:
            try:
                kernel = self._runtime.kernel(name)
            except NotFoundError as e:
                raise KeyError(str(e)) from None
            self._kernels[name] = kernel
        return kernel

    def __getattr__(self, name: str) -> Kernel:
        # Only called when normal lookup fails; the kernel is then stored as an instance
        # attribute, so the next `pack.name` is a plain attribute read.
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            kernel = self[name]
        except KeyError as e:
            raise AttributeError(e.args[0]) from None
        self.__dict__[name] = kernel
        return kernel

    def __contains__(self, name: object) -> bool:
        return name in self.kernel_names

    def __iter__(self) -> Iterator[str]:
        return iter(self.kernel_names)

    def __len__(self) -> int:
        return len(self.kernel_names)

    def __repr__(self) -> str:
        return f"<kpack.Pack {self.dir!r}: {', '.join(self.kernel_names)}>"

    def preload(self) -> None:
        """Load every variant now (needs a current CUDA context). Required before CUDA graph
        capture, which forbids loading."""
        self._runtime.preload()

    def reserve_scratch(self, nbytes: int, stream: Optional[int] = None) -> None:
        """Grow ``stream``'s scratch arena (kernels with Triton global scratch) so that no
        launch allocates, e.g. before graph capture."""
        self._runtime.reserve_scratch(nbytes, stream)

    def stats(self) -> dict:
        """Runtime counters: libraries loaded, scratch arenas and their bytes."""
        return self._runtime.stats()


def open(dir: str | _os.PathLike, preload: bool | str = False,  # noqa: A001
         driver: Optional[str] = None, nvtx: bool = True) -> Pack:
    """Open the pack in ``dir``: read and check the manifest and every cubin's sha256, and
    load the CUDA driver (``driver``: the library's path; default ``$KPACK_CUDA_DRIVER``,
    else ``libcuda.so.1``). Kernels load lazily at their first launch, or all now with
    ``preload=True`` (needs a current CUDA context), or all into a device's context at the
    first launch on that device with ``preload="first_use"`` (so that no later launch there
    loads: CUDA graph capture forbids loading). ``nvtx=False`` drops the per-launch NVTX
    range. Raises ``UnavailableError`` without a usable driver, ``NotFoundError`` for a
    missing directory or file, ``InvalidArgumentError`` for a malformed pack."""
    if preload not in (False, True, "first_use"):
        raise ValueError(f"preload must be False, True or 'first_use', got {preload!r}")
    runtime = _kpack.Runtime.open(_os.fspath(dir), preload is True, driver, nvtx)
    runtime.preload_on_first_use = preload == "first_use"
    return Pack(runtime)


def build_flags() -> dict:
    """How to build a C++ extension (e.g. a torch extension with ``kpack/torch.h``) against
    this installed kpack: ``include_dirs``, ``extra_compile_args``, ``extra_link_args``, as
    ``setuptools.Extension`` / ``torch.utils.cpp_extension.CppExtension`` take them::

        CppExtension("myext", ["myext.cpp"], **kpack.build_flags())

    The library is the wheel's ``kpack/lib/libkpack.so`` (found through an rpath); abseil and
    the CUDA headers are where they were when kpack was built."""
    from kpack import _build_config as cfg  # noqa: PLC0415
    if not cfg.LIBRARY:
        raise Error("this kpack was built with a static library; build C++ extensions "
                    "against the CMake package (find_package(kpack)) instead")
    here = _os.path.dirname(_os.path.abspath(__file__))
    library = _os.path.join(here, cfg.LIBRARY)
    # An rpath for every library linked by path: the extension needs them directly
    # (libkpack's own rpath does not serve its dependents).
    rpaths = dict.fromkeys(_os.path.dirname(f) for f in [library, *cfg.LINK_FILES])
    return {
        "include_dirs": [_os.path.join(here, "include")] + list(cfg.INCLUDE_DIRS),
        "extra_compile_args": [f"-std={cfg.CXX_STANDARD}"],
        "extra_link_args": [library] + list(cfg.LINK_FILES) +
                           [f"-Wl,-rpath,{d}" for d in rpaths],
    }
