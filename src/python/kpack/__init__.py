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
in C through the tensors' DLPack exchange table, not through ``torch.cuda``); with raw
pointers only, torch's current stream of the current device once torch has initialized
CUDA (before that torch's current stream is the legacy default stream, and kpack does not
make torch initialize CUDA to ask); else the legacy default stream.

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
as the CUDA runtime would do. Without torch (int device pointers, or tensors of a library
that made no context on this thread), ``pack.use_device(0)`` makes device 0's primary
context current on the calling thread, and ``pack.current_device()`` says which device is
current (None: no context). The extension does not import torch.

Testing without a GPU: kpack loads the CUDA driver at run time (``driver=`` of
:func:`open`, else ``$KPACK_CUDA_DRIVER``, else ``libcuda.so.1``), so code that uses kpack
can run against kpack's fake driver, ``libkpack_fake_cuda.so`` (a build of kpack's
repository makes it: ``cmake --build build --target kpack_fake_cuda``, then
``build/tests/fake_driver/libkpack_fake_cuda.so``). It models devices, contexts, memory
(host memory: a "device pointer" is a host address), streams, launches, graphs and
captures, records every launch (entry, grid, block, stream and parameter bytes) and runs
no kernel: ``KPACK_CUDA_DRIVER=.../libkpack_fake_cuda.so python -m pytest`` checks what
your code launches, with what arguments, on which stream. Its C functions
(``kpack_fake_launch_count``, ``kpack_fake_get_launch``, ``kpack_fake_fail_next``, ...,
tests/fake_driver/fake_driver.h) read the record and inject driver errors through
ctypes; kpack's own Python tests (tests/python/conftest.py) show how.
"""

from __future__ import annotations

import os as _os
from collections.abc import Iterator as _Iterator

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


def __dir__() -> list[str]:
    # kpack's API only: not the modules and names this file uses to implement it.
    return sorted([*__all__, "__version__", *(["torch"] if "torch" in globals() else [])])


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
    def kernel_names(self) -> list[str]:
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

    def __iter__(self) -> _Iterator[str]:
        return iter(self.kernel_names)

    def __len__(self) -> int:
        return len(self.kernel_names)

    def __repr__(self) -> str:
        return f"<kpack.Pack {self.dir!r}: {', '.join(self.kernel_names)}>"

    def preload(self) -> None:
        """Load every variant now (needs a current CUDA context). Required before CUDA graph
        capture, which forbids loading."""
        self._runtime.preload()

    def use_device(self, device: int = 0) -> None:
        """Make ``device``'s primary context current on the calling thread, as the CUDA
        runtime (and so torch) does on a thread's first call there: what a launch needs
        when nothing else made a context current (``kpack::Runtime::UseDevice``).
        ``InvalidArgumentError`` for a device that does not exist."""
        self._runtime.use_device(device)

    def current_device(self) -> int | None:
        """The device of the calling thread's current CUDA context, or None when no
        context is current (``kpack::Runtime::CurrentDevice``)."""
        return self._runtime.current_device()

    def reserve_scratch(self, nbytes: int, stream=None) -> None:
        """Grow ``stream``'s scratch arena (kernels with Triton global scratch) and set one
        of ``nbytes`` aside for the next capture on it, so that no launch allocates: call
        it before capturing a CUDA graph (``kpack::Runtime::ReserveScratch``). ``stream``
        takes what a launch's ``stream=`` takes (an int ``CUstream``, a
        ``torch.cuda.Stream``, an object with ``__cuda_stream__``); None is the stream a
        launch without ``stream=`` and without tensor arguments uses: torch's current
        stream of the current device when torch is imported, else the legacy default
        stream."""
        self._runtime.reserve_scratch(nbytes, stream)

    def release_scratch(self, stream=None) -> None:
        """Free ``stream``'s scratch arena and capture reservation (``stream`` as
        :meth:`reserve_scratch` takes it), e.g. before destroying the stream
        (``kpack::Runtime::ReleaseScratch``)."""
        self._runtime.release_scratch(stream)

    def stats(self) -> dict:
        """Runtime counters, every field of ``kpack::Runtime::Stats``: libraries_loaded,
        scratch_arenas (streams with an arena), scratch_reserved (arenas set aside for a
        capture), scratch_in_graphs (arenas owned by captured graphs), scratch_idle
        (arenas graphs gave back) and scratch_bytes (device bytes of all of them)."""
        return self._runtime.stats()


def open(dir: str | _os.PathLike, preload: bool | str = False,  # noqa: A001
         driver: str | None = None, nvtx: bool = True) -> Pack:
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
