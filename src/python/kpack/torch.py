"""kpack for PyTorch: a pack's kernels as torch ops, scratch memory from torch's caching
allocator, and the drop-in for existing Triton calls.

::

    import kpack, kpack.torch
    pack = kpack.open("mypack")
    ops = kpack.torch.register(pack, namespace="mypack")
    torch.ops.mypack.vector_add(x, y, out, n)            # grid from the manifest
    torch.ops.mypack.layer_norm_fwd(..., grid=[M])        # required without grid expressions

    kpack.torch.install(pack)   # existing `my_kernel[grid](...)` calls launch through kpack,
                                # and become the ops above inside torch.compile

Each kernel becomes ``torch.ops.<namespace>.<kernel>`` with a schema made from the
manifest (:func:`op_schema`): pointer parameters are ``Tensor(a!)`` -- mutated, since a
manifest cannot know what a kernel writes -- unless the build spec declared them
``readonly`` (then ``Tensor``); a host TMA descriptor parameter (``tensordesc<...>``) is
a tensor too, described whole (as ``TensorDescriptor.from_tensor``); integer scalars are
``SymInt``, floating-point ones ``float``, ``i1``/``u1`` ``bool``; a flattened tuple
element ``ptrs.0`` is argument ``ptrs_0``; constexprs are compiled in and absent. A keyword-only
``grid`` (1 to 3 ints) overrides the manifest's grid expressions and is required for
kernels that have none. The op returns nothing: it writes into the tensors it is given.

The CUDA implementation is C++ (``libkpack_torch_ops.so``, src/python/torch_ops.cc): a
boxed kernel registered with torch's dispatcher that reads the op's arguments off torch's
stack and launches the very kernel object of the pack, through the runtime it belongs to
(``_kpack``'s native launch entry; no second copy of kpack, no Python frame): the first
tensor's device made current, torch's current stream of that device, each tensor checked
against its parameter's Triton type (wrong dtype: ``TypeError``; wrong device: ``ValueError``;
messages naming the kernel and the argument). So an op costs the eager ``kernel(...)``
call plus torch's own dispatch from Python, without what torch adds for a Python
implementation (on the H200, 0.3-2.8 µs per call with 4 to 14 arguments in two runs;
``bench/python_launch_bench.py`` measures both).
The library is built when kpack is installed with torch importable in the build's Python
(``pip install --no-build-isolation .`` into the environment that has torch), against that
torch; it is used only under the same torch version. When it is missing or cannot be
loaded, :func:`register` warns (:class:`NativeOpsWarning`, naming why) and registers the
kernel objects themselves as Python implementations -- the same results, slower; the
``native`` argument of :func:`register` requires (``True``) or refuses (``False``) the
C++ implementations, :func:`native_ops_available` and :func:`native_ops_error` tell whether
they load and why not, and ``ops.native`` which kind a registration got. The environment
variable ``KPACK_TORCH_NATIVE=0`` turns them off.

Either implementation launches on torch's current stream, so the ops work under
``torch.cuda.graph`` capture and cudagraph trees. The fake (meta) implementation is Python
and returns nothing, which is all a mutating op needs for ``torch.compile``,
``torch.library.opcheck`` and fake tensors. Kernels with Triton global scratch take it from
torch's caching allocator on the launch's stream and free it right after the launch,
stream-ordered (:func:`caching_allocator_scratch` for the Python implementation), so that a
capture puts it in the graph's memory pool rather than kpack's own arenas. ``register`` also
makes the pack load every variant into a device's context at its first launch there
(``preload="first_use"``): a capture may not load.

This module imports torch only in the functions that need it; :func:`op_schema` works
without.
"""

from __future__ import annotations

import keyword
import re
from typing import Dict, Iterable, List, Optional

from kpack import _dropin

__all__ = ["op_schema", "op_name", "register", "TorchOps", "caching_allocator_scratch",
           "install", "uninstall", "native_ops_available", "native_ops_error",
           "NativeOpsWarning"]

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

    A ``tensordesc<...>`` parameter (a host TMA descriptor) is a ``Tensor`` too: the op
    describes the whole tensor (``TensorDescriptor.from_tensor``: its shape and strides,
    zero padding); a descriptor of part of a tensor needs the kernel object, not the op.
    A flattened tuple element ``ptrs.0`` is argument ``ptrs_0``.

    Raises ``ValueError`` for a parameter no schema can take, or a parameter named like the
    ``grid`` keyword."""
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
        # A flattened tuple element `ptrs.0` is argument `ptrs_0`.
        arg = p.name.replace(".", "_")
        if arg != p.name and any(q.name == arg for q in kernel.params):
            raise ValueError(f"kernel '{kernel.name}': tuple element '{p.name}' and parameter "
                             f"'{arg}' would both be argument '{arg}'")
        t = p.type
        if t.startswith("*") or t.startswith("tensordesc<"):
            readonly = getattr(p, "readonly", False)
            args.append(f"Tensor {arg}" if readonly else f"Tensor({next(aliases)}!) {arg}")
        elif t in _INT_TYPES:
            args.append(f"SymInt {arg}")
        elif t in _FLOAT_TYPES:
            args.append(f"float {arg}")
        elif t in _BOOL_TYPES:
            args.append(f"bool {arg}")
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


# ---------------------------------------------------------------- the C++ implementations


class NativeOpsWarning(UserWarning):
    """``register`` could not use kpack's C++ op implementations (the message says why) and
    registered Python implementations: correct, but each call costs torch's Python-kernel
    boundary more (0.3-2.8 µs on the H200, growing with the argument count)."""


class _Native:
    """libkpack_torch_ops.so, loaded, and _kpack's native launch entry."""

    def __init__(self, lib, api: int, capsule):
        self.lib = lib
        self.api = api
        self._capsule = capsule  # owns nothing, but keeps the pointer's provenance alive

    def register(self, namespace: str, name: str, kernel, dispatch_key: str = "CUDA") -> int:
        """Registers ``kernel`` as the ``dispatch_key`` implementation of
        ``namespace::name``; the registration's handle (``release`` undoes it). The caller
        keeps ``kernel`` alive. (Only tests use another key than CUDA: the implementation
        refuses tensors that are not CUDA tensors.)"""
        import ctypes  # noqa: PLC0415
        error = ctypes.create_string_buffer(1024)
        handle = self.lib.kpack_torch_ops_register(namespace.encode(), name.encode(),
                                                   dispatch_key.encode(),
                                                   self.api, kernel._native_handle(), error,
                                                   len(error))
        if not handle:
            raise RuntimeError(f"kpack.torch: registering op {namespace}::{name}: "
                               f"{error.value.decode(errors='replace')}")
        return handle

    def register_noop(self, namespace: str, name: str, num_args: int,
                      dispatch_key: str = "CUDA") -> int:
        """Registers a C++ implementation of ``namespace::name`` (``num_args`` arguments)
        that does nothing: torch's own cost of a C++ op, for the launch benchmark."""
        import ctypes  # noqa: PLC0415
        error = ctypes.create_string_buffer(1024)
        handle = self.lib.kpack_torch_ops_register_noop(namespace.encode(), name.encode(),
                                                        dispatch_key.encode(), num_args, error,
                                                        len(error))
        if not handle:
            raise RuntimeError(f"kpack.torch: registering op {namespace}::{name}: "
                               f"{error.value.decode(errors='replace')}")
        return handle

    def release(self, handle: int) -> None:
        self.lib.kpack_torch_ops_release(handle)


_native_state = None  # a _Native, or why there is none (str); None: not tried yet
_native_warned = False


def _load_native():
    """A _Native, or why the C++ implementations cannot be used (str)."""
    import ctypes  # noqa: PLC0415
    import os  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from kpack import _kpack  # noqa: PLC0415
    if os.environ.get("KPACK_TORCH_NATIVE", "1") == "0":
        return "turned off by KPACK_TORCH_NATIVE=0"
    try:
        from kpack import _build_config  # noqa: PLC0415
    except ImportError:
        return "this kpack was not installed by pip (kpack._build_config is missing)"
    name = getattr(_build_config, "TORCH_OPS", "")
    if not name:
        why = getattr(_build_config, "TORCH_OPS_WHY", "") or "no torch at build time"
        return (f"libkpack_torch_ops.so was not built when kpack was installed ({why}); "
                "`pip install --no-build-isolation .` in an environment whose Python imports "
                "torch builds it")
    built_for = getattr(_build_config, "TORCH_OPS_TORCH_VERSION", "")
    if built_for != torch.__version__:
        return (f"libkpack_torch_ops.so was built against torch {built_for}, but this is torch "
                f"{torch.__version__}: reinstall kpack (`pip install --no-build-isolation .`)")
    path = os.path.join(os.path.dirname(os.path.abspath(_build_config.__file__)), name)
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        return f"loading {path} failed: {e}"
    lib.kpack_torch_ops_torch_version.restype = ctypes.c_char_p
    lib.kpack_torch_ops_register.restype = ctypes.c_void_p
    lib.kpack_torch_ops_register.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p,
                                             ctypes.c_size_t]
    lib.kpack_torch_ops_register_noop.restype = ctypes.c_void_p
    lib.kpack_torch_ops_register_noop.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                                  ctypes.c_char_p, ctypes.c_size_t,
                                                  ctypes.c_char_p, ctypes.c_size_t]
    lib.kpack_torch_ops_release.argtypes = [ctypes.c_void_p]
    lib.kpack_torch_ops_release.restype = None
    linked = lib.kpack_torch_ops_torch_version().decode()
    if linked != torch.__version__:
        return f"{path} was built against torch {linked}, but this is torch {torch.__version__}"
    capsule = _kpack._native_api()
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return _Native(lib, get_pointer(capsule, b"kpack._kpack.native_api"), capsule)


def _native():
    """The loaded C++ implementations, or why there are none (str); tried once."""
    global _native_state
    if _native_state is None:
        _native_state = _load_native()
    return _native_state


def native_ops_available() -> bool:
    """Whether :func:`register` can give ops C++ implementations (loads
    libkpack_torch_ops.so on the first call; imports torch)."""
    return isinstance(_native(), _Native)


def native_ops_error() -> Optional[str]:
    """Why :func:`register` cannot give ops C++ implementations, or None when it can."""
    state = _native()
    return None if isinstance(state, _Native) else state


class TorchOps:
    """The ops ``register`` made: ``ops.<kernel>`` (or ``ops[kernel]``) is the op
    (``torch.ops.<namespace>.<op name>``), ``ops.names`` maps kernel names to op names,
    ``ops.native`` whether their CUDA implementations are C++ (else the kernel objects, from
    Python)."""

    def __init__(self, pack, namespace: str, names: Dict[str, str], library, native):
        self.pack = pack
        self.namespace = namespace
        self.names = names
        self._library = library  # the registrations live as long as it does
        self._native = native    # a _Native, or None: Python implementations
        self.native = native is not None
        # The C++ registrations: (handle, kernel object), the object kept alive for the
        # handle, which launches through it. Never released: the ops live in torch's
        # dispatcher until the interpreter exits, like the Python library's definitions.
        self._impls: List[tuple] = []
        self._views: Dict[tuple, str] = {}  # (kernel, variants, ignore_buckets) -> op name

    def view_op(self, target):
        """The op that launches a drop-in target (``kpack._dropin._Target``): the kernel's
        own when the target is the whole kernel, else one defined for that set of variants
        (``<op>__v<N>``, same schema), once."""
        import torch  # noqa: PLC0415
        kernel = target.kernel
        if target.view is kernel:
            return self[kernel.name].default
        key = (kernel.name, tuple(target.names), target.ignore_buckets)
        name = self._views.get(key)
        if name is None:
            name = f"{self.names[kernel.name]}__v{len(self._views)}"
            _define(self._library, self.namespace, name, target.view, self._native, self._impls)
            self._views[key] = name
        return getattr(getattr(torch.ops, self.namespace), name).default

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
             kernels: Optional[Iterable[str]] = None,
             native: Optional[bool] = None) -> TorchOps:
    """Register the pack's kernels (or those named in ``kernels``) as
    ``torch.ops.<namespace>.<kernel>``; see the module's documentation. ``namespace``
    defaults to the pack directory's name. Registering the same pack under the same
    namespace again returns the ops already registered (a ``ValueError`` if ``native``
    asks for the other kind of implementation than they have); another pack there is a
    ``ValueError``.

    ``native``: None (the default) gives the ops C++ implementations when
    :func:`native_ops_available`, else Python ones with a :class:`NativeOpsWarning` (once
    per process) naming why; True requires the C++ ones (``RuntimeError`` naming why not);
    False registers the Python ones (for comparison)."""
    import os  # noqa: PLC0415

    import torch  # noqa: PLC0415

    namespace = namespace or op_name(os.path.basename(os.path.normpath(pack.dir)))
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", namespace):
        raise ValueError(f"namespace {namespace!r} is not an identifier")
    names = list(kernels) if kernels is not None else list(pack.kernel_names)
    existing = _registered.get(namespace)
    if existing is not None:
        if existing.pack is pack and set(names) <= set(existing.names):
            if native is not None and native != existing.native:
                kind = "C++" if existing.native else "Python"
                raise ValueError(f"torch op namespace '{namespace}' already holds this pack's "
                                 f"kernels with {kind} implementations (native={native} asks "
                                 "for the other kind: use another namespace)")
            return existing
        raise ValueError(f"torch op namespace '{namespace}' already holds the kernels of "
                         f"{existing.pack.dir} ({', '.join(existing.names)})")
    op_names: Dict[str, str] = {}
    for kernel_name in names:
        name = op_name(kernel_name)
        if name in op_names.values():
            raise ValueError(f"kernels '{kernel_name}' and another both make op '{name}'")
        op_names[kernel_name] = name
    impl = _choose_native(native)
    library = torch.library.Library(namespace, "DEF")
    ops = TorchOps(pack, namespace, op_names, library, impl)
    try:
        for kernel_name, name in op_names.items():
            _define(library, namespace, name, pack[kernel_name], impl, ops._impls)
    except BaseException:
        for handle, _ in ops._impls:  # the definitions go with `library`; so do these
            impl.release(handle)
        raise
    pack._runtime.preload_on_first_use = True
    _registered[namespace] = ops
    return ops


def _choose_native(native: Optional[bool]):
    """The _Native to register with (None: Python implementations), as ``register``'s
    ``native`` asks."""
    import warnings  # noqa: PLC0415
    global _native_warned
    if native is False:
        return None
    state = _native()
    if isinstance(state, _Native):
        return state
    if native:
        raise RuntimeError(f"kpack.torch: C++ op implementations unavailable: {state}")
    if not _native_warned:
        _native_warned = True
        warnings.warn(f"kpack.torch: the ops get Python implementations (correct, but each "
                      f"call costs more): {state}", NativeOpsWarning, stacklevel=3)
    return None


def _define(library, namespace: str, name: str, kernel, native, impls: list) -> None:
    """Defines op ``namespace::name`` launching ``kernel`` (see the module's documentation):
    its CUDA implementation C++ through ``native`` (a _Native; the registration goes to
    ``impls``), or the kernel object itself when ``native`` is None."""
    import torch  # noqa: PLC0415
    library.define(op_schema(kernel, name))
    torch.library.register_fake(f"{namespace}::{name}", _fake, lib=library)
    if native is not None:
        impls.append((native.register(namespace, name, kernel), kernel))
        return
    impl = kernel.with_scratch(caching_allocator_scratch) if kernel.has_scratch else kernel
    call = [p for p in kernel.params if not p.constexpr]
    descriptors = [i for i, p in enumerate(call) if p.type.startswith("tensordesc<")]
    if descriptors:
        impl = _whole_tensor_descriptors(impl, descriptors)
    library.impl(name, impl, "CUDA")


class _WholeTensor:
    """A tensor descriptor over all of tensor ``base`` (what the kernel object reads:
    ``base``, ``shape``, ``strides``, ``padding``), as ``TensorDescriptor.from_tensor``."""
    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, base):
        self.base = base
        self.shape = base.shape
        self.strides = base.stride()
        self.padding = "zero"


def _whole_tensor_descriptors(launch, positions):
    """The CUDA implementation of an op whose kernel takes tensor descriptors: the tensors
    at ``positions`` (of the call parameters) become descriptors of the whole tensor."""
    def impl(*args, grid=None):
        args = list(args)
        for i in positions:
            args[i] = _WholeTensor(args[i])
        return launch(*args, grid=grid)
    return impl


def _fake(*args, grid=None):
    """The fake implementation of every kpack op: it only writes into its arguments."""
    return None


def install(pack, namespace: Optional[str] = None, strict: bool = False):
    """``kpack.install(pack, strict)``, with the pack's kernels registered as torch ops
    (``register(pack, namespace)``) through which installed Triton calls go inside
    ``torch.compile``: Dynamo traces a ``@triton.jit`` call itself, into its
    ``triton_kernel_wrapper_mutation`` for Inductor to compile, and this routes the calls
    the pack serves to the kpack op instead (see ``_route_dynamo``). Returns the
    installation (``kpack.install``)."""
    register(pack, namespace)
    installation = _dropin.install(pack, strict=strict)
    _patch_dynamo()
    return installation


def uninstall() -> None:
    """``kpack.uninstall()``, and Dynamo traces Triton calls as before."""
    _dropin.uninstall()
    _unpatch_dynamo()


# ---------------------------------------------------------------- torch.compile

_DLPACK = None  # torch dtype -> the drop-in's dtype code (DLPack code << 8 | bits)
_dynamo_original = None
_dynamo_warned: set = set()


def _dtype_code(dtype) -> int:
    global _DLPACK
    if _DLPACK is None:
        import torch  # noqa: PLC0415
        pairs = {torch.int8: (0, 8), torch.int16: (0, 16), torch.int32: (0, 32),
                 torch.int64: (0, 64), torch.uint8: (1, 8), torch.float16: (2, 16),
                 torch.float32: (2, 32), torch.float64: (2, 64), torch.bfloat16: (4, 16),
                 torch.bool: (6, 8), torch.float8_e4m3fn: (10, 8),
                 torch.float8_e4m3fnuz: (11, 8), torch.float8_e5m2: (12, 8),
                 torch.float8_e5m2fnuz: (13, 8)}
        for name, bits in (("uint16", 16), ("uint32", 32), ("uint64", 64)):
            if hasattr(torch, name):
                pairs[getattr(torch, name)] = (1, bits)
        _DLPACK = {d: code << 8 | b for d, (code, b) in pairs.items()}
    return _DLPACK.get(dtype, 0)


def _route_dynamo(variable, grids, combined_args, tx):
    """For Dynamo's DynamoTritonHOPifier.call_HOP: a traced call of an installed Triton
    kernel becomes a call of the kpack op that launches what the drop-in would launch
    eagerly (the same resolver: source, constexprs, launch options, dtypes). None when the
    pack cannot serve the call, or for an autotuner with several configs (Inductor tunes
    those itself): Dynamo then records its own Triton call, as without kpack."""
    import torch  # noqa: PLC0415
    from torch._dynamo import variables  # noqa: PLC0415
    from triton.runtime.autotuner import Autotuner  # noqa: PLC0415

    installation = _dropin.installed()
    if installation is None:
        return None
    kernel = variable.kernel
    config = None
    if isinstance(kernel, Autotuner):
        if len(kernel.configs) != 1:
            _not_routed(installation, kernel.fn, "an autotuned kernel inside torch.compile is "
                        "tuned and compiled by Inductor, not launched by kpack")
            return None
        config, kernel = kernel.configs[0], kernel.fn
    resolver = installation._resolver
    found = resolver.function(kernel)
    if found is None or found[1] is not None or found[2]:
        return None
    info = found[0]
    if any(p.type.startswith("tensordesc<") for p in info.candidates[0][1].params):
        _not_routed(installation, info.base, "a call with tensor descriptor arguments inside "
                    "torch.compile is compiled by Inductor (Dynamo traces the descriptors)")
        return None

    def value(name):
        v = combined_args[name]
        return v.as_python_constant() if v.is_python_constant() else v

    key, values = [], []
    for p in info.base.params:
        if p.is_constexpr:
            given = config.kwargs[p.name] if config is not None and p.name in config.kwargs \
                else value(p.name) if p.name in combined_args else p.default
            key.append(("c", p.name))
            values.append(given)
    if config is not None:
        for option in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
            if getattr(config, option, None) is not None:
                key.append(("o", option))
                values.append(getattr(config, option))
    pointers = [p.name for p in info.candidates[0][1].params if p.type.startswith("*")]
    dtypes = []
    for name in pointers:
        example = value(name).as_proxy().node.meta.get("example_value") \
            if name in combined_args and not combined_args[name].is_python_constant() else None
        dtypes.append(_dtype_code(example.dtype) if isinstance(example, torch.Tensor) else 0)
    shape = _dropin._Shape(key, {}, pointers)
    target = resolver.resolve(info, shape, tuple(values), tuple(dtypes))
    if isinstance(target, str):
        _not_routed(installation, info.base, f"inside torch.compile, Inductor compiles it: "
                    f"{target}")
        return None
    ops = next((o for o in _registered.values()
                if o.pack is target.pack and target.kernel.name in o.names), None)
    if ops is None:
        return None  # not registered as an op (register(..., kernels=...) left it out)
    op = ops.view_op(target)
    args = []
    for p in info.base.params:
        if p.is_constexpr:
            continue
        v = value(p.name) if p.name in combined_args else p.default
        args.append(v.as_proxy() if isinstance(v, variables.VariableTracker) else v)
    grid = list(grids[0])
    tx.output.create_proxy("call_function", op, tuple(args), {"grid": grid})
    return variables.ConstantVariable.create(None)


def _not_routed(installation, fn, reason: str) -> None:
    """A traced call kpack leaves to Dynamo: warned once (strict: DropInError)."""
    import warnings  # noqa: PLC0415
    name = _dropin._Resolver._name(fn)
    message = f"kpack: {name}: {reason}"
    if installation.strict:
        raise _dropin.DropInError(message)
    if (name, reason) not in _dynamo_warned:
        _dynamo_warned.add((name, reason))
        warnings.warn(message, _dropin.DropInWarning, stacklevel=2)


def _patch_dynamo() -> None:
    """Routes Dynamo's traced Triton calls through ``_route_dynamo`` (once)."""
    global _dynamo_original
    if _dynamo_original is not None:
        return
    try:
        from torch._dynamo.variables.functions import DynamoTritonHOPifier  # noqa: PLC0415
    except ImportError:
        return  # a torch without Dynamo's Triton support: nothing to route
    original = DynamoTritonHOPifier.call_HOP

    def call_HOP(self, variable, grids, combined_args, tx):  # noqa: N802
        routed = _route_dynamo(variable, grids, combined_args, tx)
        return routed if routed is not None else original(self, variable, grids, combined_args, tx)

    DynamoTritonHOPifier.call_HOP = call_HOP
    _dynamo_original = (DynamoTritonHOPifier, original)


def _unpatch_dynamo() -> None:
    global _dynamo_original
    if _dynamo_original is not None:
        cls, original = _dynamo_original
        cls.call_HOP = original
        _dynamo_original = None
