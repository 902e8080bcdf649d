"""kpack for PyTorch: a pack's kernels as torch ops, scratch memory from torch's caching
allocator, and the drop-in for existing Triton calls.

::

    import kpack, kpack.torch
    pack = kpack.open("mypack")
    ops = kpack.torch.register(pack, namespace="mypack")
    torch.ops.mypack.vector_add(x, y, out, n)            # grid from the manifest
    torch.ops.mypack.layer_norm_fwd(..., grid=[M])        # required without grid expressions

    kpack.torch.install(pack)   # existing `my_kernel[grid](...)` calls launch through kpack

Each kernel becomes ``torch.ops.<namespace>.<kernel>`` with a schema made from the
manifest (:func:`op_schema`): pointer parameters are ``Tensor(a!)`` -- mutated, since a
manifest cannot know what a kernel writes -- unless the build spec declared them
``readonly`` (then ``Tensor``); integer scalars are ``SymInt``, floating-point ones
``float``, ``i1``/``u1`` ``bool``; constexprs are compiled in and absent. A keyword-only
``grid`` (1 to 3 ints) overrides the manifest's grid expressions and is required for
kernels that have none. The op returns nothing: it writes into the tensors it is given.

The CUDA implementation is the kpack kernel object itself (no Python frame between torch's
dispatcher and kpack's launch); it launches on torch's current stream, so it works under
``torch.cuda.graph`` capture and cudagraph trees. The fake (meta) implementation returns
nothing, which is all a mutating op needs for ``torch.compile``, ``torch.library.opcheck``
and fake tensors. Kernels with Triton global scratch take it from torch's caching allocator
(:func:`caching_allocator_scratch`) on the launch's stream and free it right after the
launch, stream-ordered, so that a capture puts it in the graph's memory pool rather than
kpack's own arenas. ``register`` also makes the pack load every variant into a device's
context at its first launch there (``preload="first_use"``): a capture may not load.

This module imports torch only in the functions that need it; :func:`op_schema` works
without.
"""

from __future__ import annotations

import keyword
import re
from typing import Dict, Iterable, List, Optional

from kpack import _dropin

__all__ = ["op_schema", "op_name", "register", "TorchOps", "caching_allocator_scratch",
           "install", "uninstall"]

_INT_TYPES = {"i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"}
_FLOAT_TYPES = {"fp16", "bf16", "fp32", "fp64"}
_BOOL_TYPES = {"i1", "u1"}


def op_name(kernel_name: str) -> str:
    """The op name for a kernel: its name with every character an op name cannot hold
    (kernel names may contain '.') replaced by '_'."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", kernel_name)
    return name if not name[:1].isdigit() else "_" + name


def _alias_sets() -> Iterable[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    yield from letters
    n = 1
    while True:
        for c in letters:
            yield f"{c}{n}"
        n += 1


def op_schema(kernel, name: Optional[str] = None) -> str:
    """The torch op schema of a kpack kernel (a ``kpack.Kernel``, or anything with the same
    ``name``, ``params`` (``name``, ``type``, ``constexpr``, ``readonly``) and ``grid``):
    ``name(Tensor x, Tensor(a!) out, SymInt n, *, SymInt[]? grid=None) -> ()``.

    Raises ``ValueError`` for a parameter no schema can take (an ``nvTmaDesc``), or a
    parameter named like the ``grid`` keyword."""
    name = name or op_name(kernel.name)
    aliases = _alias_sets()
    args: List[str] = []
    for p in kernel.params:
        if p.constexpr:
            continue
        if p.name == "grid":
            raise ValueError(f"kernel '{kernel.name}': a parameter named 'grid' clashes with "
                             "the op's grid= keyword")
        if keyword.iskeyword(p.name):
            raise ValueError(f"kernel '{kernel.name}': parameter '{p.name}' is a Python keyword")
        t = p.type
        if t.startswith("*"):
            readonly = getattr(p, "readonly", False)
            args.append(f"Tensor {p.name}" if readonly else f"Tensor({next(aliases)}!) {p.name}")
        elif t in _INT_TYPES:
            args.append(f"SymInt {p.name}")
        elif t in _FLOAT_TYPES:
            args.append(f"float {p.name}")
        elif t in _BOOL_TYPES:
            args.append(f"bool {p.name}")
        else:
            raise ValueError(f"kernel '{kernel.name}': parameter '{p.name}' has type {t}, "
                             "which a torch op schema cannot take")
    grid = "SymInt[]? grid=None" if kernel.grid else "SymInt[] grid"
    return f"{name}({', '.join(args + ['*', grid])}) -> ()"


def caching_allocator_scratch(nbytes: int, align: int, stream: int):
    """A ``scratch=`` allocator (see ``kpack.Kernel``): ``nbytes`` from torch's CUDA caching
    allocator on ``stream``, returned as an object whose ``data_ptr()`` is aligned to
    ``align`` and whose release frees the block back to the allocator -- stream-ordered, so
    that only work ordered after the launch on ``stream`` reuses it. Inside a capture on
    ``stream`` the block comes from the capture's memory pool, as torch's own
    allocations do."""
    return _CachingBlock(nbytes, align, stream)


class _CachingBlock:
    __slots__ = ("base", "ptr", "__weakref__")
    _alloc = _delete = None

    def __init__(self, nbytes: int, align: int, stream: int):
        if _CachingBlock._alloc is None:
            import torch  # noqa: PLC0415
            _CachingBlock._alloc = torch._C._cuda_cudaCachingAllocator_raw_alloc
            _CachingBlock._delete = torch._C._cuda_cudaCachingAllocator_raw_delete
        # The allocator's blocks are 512-byte aligned; a larger alignment takes slack.
        slack = align if align > 512 else 0
        self.base = _CachingBlock._alloc(nbytes + slack, stream)
        self.ptr = (self.base + align - 1) // align * align

    def data_ptr(self) -> int:
        return self.ptr

    def __del__(self):
        _CachingBlock._delete(self.base)


class TorchOps:
    """The ops ``register`` made: ``ops.<kernel>`` (or ``ops[kernel]``) is the op
    (``torch.ops.<namespace>.<op name>``), ``ops.names`` maps kernel names to op names."""

    def __init__(self, pack, namespace: str, names: Dict[str, str], library):
        self.pack = pack
        self.namespace = namespace
        self.names = names
        self._library = library  # the registrations live as long as it does

    def __getitem__(self, kernel_name: str):
        import torch  # noqa: PLC0415
        return getattr(getattr(torch.ops, self.namespace), self.names[kernel_name])

    def __getattr__(self, kernel_name: str):
        if kernel_name.startswith("_") or kernel_name not in self.names:
            raise AttributeError(kernel_name)
        return self[kernel_name]

    def __repr__(self) -> str:
        return f"<kpack.torch ops torch.ops.{self.namespace}: {', '.join(self.names.values())}>"


_registered: Dict[str, TorchOps] = {}


def register(pack, namespace: Optional[str] = None,
             kernels: Optional[Iterable[str]] = None) -> TorchOps:
    """Register the pack's kernels (or those named in ``kernels``) as
    ``torch.ops.<namespace>.<kernel>``; see the module's documentation. ``namespace``
    defaults to the pack directory's name. Registering the same pack under the same
    namespace again returns the ops already registered; another pack there is a
    ``ValueError``."""
    import os  # noqa: PLC0415

    import torch  # noqa: PLC0415

    namespace = namespace or op_name(os.path.basename(os.path.normpath(pack.dir)))
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", namespace):
        raise ValueError(f"namespace {namespace!r} is not an identifier")
    names = list(kernels) if kernels is not None else list(pack.kernel_names)
    existing = _registered.get(namespace)
    if existing is not None:
        if existing.pack is pack and set(names) <= set(existing.names):
            return existing
        raise ValueError(f"torch op namespace '{namespace}' already holds the kernels of "
                         f"{existing.pack.dir} ({', '.join(existing.names)})")
    op_names: Dict[str, str] = {}
    for kernel_name in names:
        name = op_name(kernel_name)
        if name in op_names.values():
            raise ValueError(f"kernels '{kernel_name}' and another both make op '{name}'")
        op_names[kernel_name] = name
    library = torch.library.Library(namespace, "DEF")
    for kernel_name, name in op_names.items():
        kernel = pack[kernel_name]
        library.define(op_schema(kernel, name))
        impl = kernel.with_scratch(caching_allocator_scratch) if kernel.has_scratch else kernel
        library.impl(name, impl, "CUDA")
        torch.library.register_fake(f"{namespace}::{name}", _fake, lib=library)
    pack._runtime.preload_on_first_use = True
    ops = TorchOps(pack, namespace, op_names, library)
    _registered[namespace] = ops
    return ops


def _fake(*args, grid=None):
    """The fake implementation of every kpack op: it only writes into its arguments."""
    return None


def install(pack, namespace: Optional[str] = None, strict: bool = False):
    """``kpack.install(pack, strict)`` with the pack's kernels also registered as torch ops
    (``register(pack, namespace)``), which a ``torch.compile``\\ d function calls directly
    (Dynamo traces a ``@triton.jit`` call itself; see the README's Python section).
    Returns the installation (``kpack.install``)."""
    register(pack, namespace)
    return _dropin.install(pack, strict=strict)


def uninstall() -> None:
    """``kpack.uninstall()``."""
    _dropin.uninstall()
