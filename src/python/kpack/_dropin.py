"""The drop-in: existing Triton ``my_kernel[grid](...)`` calls launch through a kpack pack
(``kpack.install``; see its documentation).

The C half (``kpack._kpack.DropIn``, src/python/dropin.h) replaces Triton's
``KernelInterface.__getitem__`` and serves repeated calls without Python; this module is
the resolver it asks, once per function, per call shape and per key, what a call means:

* a function (a ``JITFunction``, or a ``triton.autotune`` ``Autotuner`` over one) is the
  pack's when a pack kernel's ``source`` names it: the same sha256 of ``JITFunction.src``
  (as ``kpack_tools.pack.source_identity`` computes it) and the pack's qualname equal to the
  function's ``module.qualname`` or a dotted tail of it (the builder names spec-file
  functions ``<file stem>.<name>``, which a program may import as ``pkg.<file stem>``);
* a call binds like Triton's: positional and keyword arguments to the function's
  parameters (defaults filled in), other keywords to Triton's launch options;
* the constexpr values and launch options of a plain ``@triton.jit`` call select the pack
  variants compiled with exactly those (``num_warps``, ``num_ctas``, ``num_stages`` -- the
  pack's when it recorded them -- ``launch_pdl`` and ``launch_cooperative_grid``, Triton's
  defaults when not given); among them the launch picks the most specialized whose
  assumptions hold, whatever bucket they were tuned for (``Kernel.restrict(...,
  ignore_buckets=True)``);
* an autotuned function's call launches through the pack kernel's buckets, which record
  (``autotune_key``) or tune its configurations, among the variants that agree with any
  constexpr the call gives;
* the tensors' dtypes select among pack kernels compiled from one function
  (``matmul_fp16`` and ``matmul_bf16``);
* an argument passed as ``None`` (which Triton compiles in) selects the pack kernel that
  has that parameter as a constexpr ``None`` -- what the recorder writes for such a call --
  and is not passed to it;
* an autotuner config's ``pre_hook`` that only sets tensor descriptors' block shapes (the
  tutorials' TMA matmuls) needs no counterpart: each variant encodes its own block shape.
  A hook is taken as such when its code names nothing but ``block_shape``, ``get`` and a few
  pure builtins, and a dry run on stand-in arguments sets only descriptors' block shapes,
  to the block shapes of the pack's variants of that config;
* ``fn.warmup(...)`` returns Triton's ``CompiledKernel``; its ``compiled[grid](*args)`` (every
  argument, constexprs included) launches the pack variant compiled with the same
  constexprs and options (``CompiledKernel.__getitem__`` is replaced too).

Anything else -- an unknown constexpr value or option, a function whose source changed or
that no pack kernel was compiled from, other dtypes, ``triton.heuristics`` wrappers,
pre-run hooks, a config ``pre_hook`` that does more -- goes to Triton's JIT with a
``kpack.DropInWarning`` once per function and reason, and is counted; ``strict=True``
raises ``kpack.DropInError`` instead.
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import inspect
import re
import types
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from kpack import _kpack

__all__ = ["install", "uninstall", "installed", "Installation", "DropInWarning", "DropInError"]


class DropInWarning(UserWarning):
    """A Triton call that kpack's drop-in could not serve: it runs on Triton's JIT."""


class DropInError(RuntimeError):
    """``strict=True``: a Triton call that the installed packs cannot serve."""


# Launch options the manifest records per variant (and so can match); Triton's others
# must be left at their defaults.
_RECORDED_OPTIONS = ("num_warps", "num_ctas", "num_stages", "launch_pdl",
                     "launch_cooperative_grid")
# DLPack (code, bits) -> the Triton element types of pointers that take such tensors.
_DLPACK_TYPES = {(0, 8): {"i8"}, (0, 16): {"i16"}, (0, 32): {"i32"}, (0, 64): {"i64"},
                 (1, 8): {"u8"}, (1, 16): {"u16"}, (1, 32): {"u32"}, (1, 64): {"u64"},
                 (2, 16): {"fp16"}, (2, 32): {"fp32"}, (2, 64): {"fp64"}, (4, 16): {"bf16"},
                 (6, 8): {"i1", "u1"}, (10, 8): {"fp8e4nv"}, (11, 8): {"fp8e4b8"},
                 (12, 8): {"fp8e5"}, (13, 8): {"fp8e5b16"}}


# The dtype code the C half gives a None argument (dropin.h): no DLPack (code, bits) is it.
NONE_DTYPE = 0xFFFF


def source_sha256(fn) -> str:
    """sha256 of a ``JITFunction``'s source, as ``kpack_tools.pack.source_identity``."""
    return hashlib.sha256(fn.src.encode("utf-8")).hexdigest()


def qualname_matches(pack_qualname: str, qualname: str) -> bool:
    """Whether a pack's ``source.qualname`` names a function whose ``module.qualname`` is
    ``qualname``: equal, or a tail of it at a '.' (``examples.vector_add.vector_add_kernel``
    is ``vector_add.vector_add_kernel`` imported from a package)."""
    return qualname == pack_qualname or qualname.endswith("." + pack_qualname)


def constexpr_value(value) -> Any:
    """A constexpr as the pack tools write it into a manifest: JSON scalars as they are,
    ``tl.constexpr`` unwrapped, Triton dtypes by name, jitted functions by qualname."""
    if type(value).__name__ == "constexpr":
        value = getattr(value, "value", value)
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if (type(value).__module__ or "").startswith("triton.language"):
        return str(value)
    if hasattr(value, "fn") and hasattr(value, "arg_names"):
        return f"{value.fn.__module__}.{value.fn.__qualname__}"
    return value


def _same(a, b) -> bool:
    """Equal and of the same type: True is not 1, 1.0 is not 1, for Triton."""
    return type(a) is type(b) and a == b


def _describe(values: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values.items()) or "no constexprs"


def _element(pointer_type: str) -> str:
    """The element type of a Triton pointer type: ``*fp16`` and ``*kfp16`` (const) are fp16."""
    element = pointer_type[1:]
    return element[1:] if element.startswith("k") and len(element) > 1 else element


def _block(desc_type: str) -> List[int]:
    """The block shape of ``tensordesc<fp16[64, 128]>``."""
    return [int(d) for d in re.search(r"\[([0-9, ]*)\]", desc_type).group(1).split(",")]


def _nullable(kernel, names: List[str], constexpr: List[bool]) -> Optional[frozenset]:
    """Whether pack ``kernel`` can serve the function of these parameters (None: not), and
    the parameters it has as a constexpr None where the function takes a value: what
    Triton (and so the recorder) makes of a None argument."""
    if [p.name for p in kernel.params] != names:
        return None
    nullable = set()
    for p, declared in zip(kernel.params, constexpr):
        if p.constexpr == declared:
            continue
        if not (p.constexpr and kernel.variants and
                all(p.name in v.constexprs and v.constexprs[p.name] is None
                    for v in kernel.variants)):
            return None
        nullable.add(p.name)
    return frozenset(nullable)


# What a config pre_hook's code may name and still be a hook that only sets descriptors'
# block shapes: the attribute it sets, the dict's get, and builtins without side effects.
_HOOK_NAMES = frozenset({"block_shape", "get", "min", "max", "len", "int", "list", "tuple",
                         "range", "abs", "divmod", "bool", "sum", "any", "all", "zip",
                         "enumerate"})


class _NotDescriptorOnly(Exception):
    """A config pre_hook's dry run did something besides setting descriptors' blocks."""


def _plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (tuple, frozenset)) and all(_plain(v) for v in value)


def _hook_problem(hook) -> Optional[str]:
    """Why ``hook``'s code is not that of a hook that only sets descriptors' block shapes
    (None: its code names nothing else, so its dry run is all it can do)."""
    if not isinstance(hook, types.FunctionType):
        return f"it is a {type(hook).__name__}, not a function kpack can read"
    for cell in hook.__closure__ or ():
        if not _plain(cell.cell_contents):
            return f"it closes over a {type(cell.cell_contents).__name__}"
    todo, names = [hook.__code__], set()
    while todo:
        code = todo.pop()
        names |= set(code.co_names)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    other = sorted(names - _HOOK_NAMES)
    if other:
        return f"it uses {', '.join(repr(n) for n in other)}"
    shadowed = sorted(n for n in names if n in hook.__globals__
                      and hook.__globals__[n] is not getattr(builtins, n, None))
    if shadowed:
        return f"its {', '.join(repr(n) for n in shadowed)} are its module's, not Python's"
    return None


class _Descriptor:
    """A descriptor argument in a pre_hook's dry run: its block shape may be set."""

    def __init__(self, name: str):
        self.__dict__.update(_name=name, block_shape=None, set_to=None)

    def __getattr__(self, attr):
        raise _NotDescriptorOnly(f"it reads {self._name}.{attr}")

    def __setattr__(self, attr, value):
        if attr != "block_shape":
            raise _NotDescriptorOnly(f"it sets {self._name}.{attr}")
        self.__dict__.update(block_shape=value, set_to=value)


class _Opaque:
    """Any other argument in a pre_hook's dry run: the hook may pass it along, nothing more."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattribute__(self, attr):
        raise _NotDescriptorOnly(f"it reads {object.__getattribute__(self, '_name')}.{attr}")

    def __setattr__(self, attr, value):
        raise _NotDescriptorOnly(f"it sets {object.__getattribute__(self, '_name')}.{attr}")


def _dry_run(hook, params: List[str], descs: List[str], config: Dict[str, Any]):
    """Runs a config pre_hook (whose code ``_hook_problem`` accepted) on stand-ins of the
    call's arguments and the config's values, as Triton calls it (``{**args, **config}``);
    returns ``{descriptor: block shape}`` for the blocks it set. Raises
    ``_NotDescriptorOnly`` saying what else it did."""
    nargs = {name: _Descriptor(name) if name in descs else _Opaque(name) for name in params}
    nargs.update(config)
    try:
        hook(nargs)
    except _NotDescriptorOnly:
        raise
    except Exception as e:  # noqa: BLE001 - whatever it is, the hook needs Triton's run
        raise _NotDescriptorOnly(f"on stand-in arguments it raised {type(e).__name__}: "
                                 f"{e}") from None
    blocks = {}
    for name in descs:
        # type(), not isinstance(): isinstance would ask an _Opaque for its __class__.
        value = nargs[name].__dict__["set_to"] if type(nargs[name]) is _Descriptor else None
        if value is None:
            continue
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in value):
            raise _NotDescriptorOnly(f"it sets {name}'s block shape to {value!r}")
        blocks[name] = list(value)
    return blocks


@dataclasses.dataclass
class _Function:
    """What the resolver knows about one Triton kernel object."""
    fn: Any
    qualname: str
    base: Any = None    # the JITFunction
    tuner: Any = None   # the Autotuner, if fn is one
    candidates: List[Tuple[Any, Any]] = dataclasses.field(default_factory=list)  # (pack, Kernel)
    tuned: frozenset = frozenset()  # names the autotuner's configs set
    # Per candidate kernel name: the parameters it has as a constexpr None where the
    # function takes a value (Triton compiled a None argument in).
    nullable: Dict[str, frozenset] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Shape:
    """How one call shape binds: the key's (kind, name) in order ('c' constexpr, 'o'
    option), constexpr defaults, and the call parameters whose dtype joins the key."""
    key: List[Tuple[str, str]]
    constexpr_defaults: Dict[str, Any]
    dtype_params: List[str]


@dataclasses.dataclass
class _Target:
    """What a call launches: ``view`` (``kernel`` of ``pack`` restricted to ``names``)."""
    view: Any
    pack: Any
    kernel: Any
    names: List[str]
    ignore_buckets: bool


class _Resolver:
    """Answers kpack._kpack.DropIn's questions (dropin.h)."""

    def __init__(self, packs: Sequence[Any], strict: bool):
        from triton.backends.nvidia.compiler import CUDAOptions  # noqa: PLC0415
        self.strict = strict
        self.option_defaults = {f.name: f.default for f in dataclasses.fields(CUDAOptions)
                                if f.default is not dataclasses.MISSING}
        self.option_names = {f.name for f in dataclasses.fields(CUDAOptions)}
        # sha256 -> [(pack, kernel name, pack qualname)]; every kernel with a source.
        self.by_sha: Dict[str, List[Tuple[Any, str, str]]] = {}
        self.sources: List[Tuple[str, str]] = []  # (qualname, sha256) of every kernel
        for pack in packs:
            for name in pack.kernel_names:
                source = pack[name].source
                if source is None:
                    continue
                qualname, sha = source
                self.by_sha.setdefault(sha, []).append((pack, name, qualname))
                self.sources.append((qualname, sha))
        self.warned: set = set()
        self.reasons: Dict[str, set] = {}  # qualname -> reasons for falling back
        self.views: Dict[Tuple[int, Tuple[str, ...], bool], Any] = {}

    # ---- the questions

    def function(self, fn):
        from triton.runtime.autotuner import Autotuner, Heuristics  # noqa: PLC0415
        from triton.runtime.jit import JITFunction  # noqa: PLC0415
        tuner = fn if isinstance(fn, Autotuner) else None
        base = fn.fn if tuner is not None else fn
        if isinstance(base, Heuristics) or isinstance(fn, Heuristics):
            inner = base
            while not isinstance(inner, JITFunction) and hasattr(inner, "fn"):
                inner = inner.fn
            info = _Function(fn, self._name(inner))
            return info, "it is wrapped in triton.heuristics, which the drop-in does not " \
                         "serve", []
        if not isinstance(base, JITFunction):
            return None  # not a Triton kernel the drop-in knows: Triton's, uncounted
        info = _Function(fn, self._name(base), base=base, tuner=tuner)
        hooks = base.pre_run_hooks
        sha = source_sha256(base)
        found = [(pack, name) for pack, name, q in self.by_sha.get(sha, [])
                 if qualname_matches(q, info.qualname)]
        if not found:
            changed = [q for q, s in self.sources if qualname_matches(q, info.qualname)]
            if changed:
                return info, (f"its source changed since the pack was built (sha256 "
                              f"{sha[:12]}, the pack's {changed[0]} has another)"), hooks
            return info, "no kernel of the installed packs was compiled from it", hooks
        names = [p.name for p in base.params]
        constexpr = [bool(p.is_constexpr) for p in base.params]
        for pack, name in found:
            kernel = pack[name]
            nullable = _nullable(kernel, names, constexpr)
            if nullable is not None:
                info.candidates.append((pack, kernel))
                info.nullable[kernel.name] = nullable
        if not info.candidates:
            return info, f"its parameters differ from pack kernel '{found[0][1]}'", hooks
        if getattr(base, "debug", None):
            return info, "it was jitted with debug=True, which the pack was not compiled with", \
                hooks
        if tuner is not None:
            why = self._config_hooks(info, tuner)
            if why is not None:
                return info, why, hooks
            info.tuned = frozenset(k for c in tuner.configs for k in c.all_kwargs())
        return info, None, hooks

    def compiled(self, compiled):
        """What ``compiled[grid](*args)`` launches, for a Triton ``CompiledKernel`` (what
        ``fn.warmup(...)`` returns): None (not compiled from a function the drop-in
        knows: Triton's, uncounted), ``(info, reason)``, or ``(info, view, positions)``:
        the kernel view to launch and, per call parameter, the position of its argument
        (a CompiledKernel takes every argument, constexprs included)."""
        from triton.runtime.jit import JITFunction  # noqa: PLC0415
        src = getattr(compiled, "src", None)
        fn = getattr(src, "fn", None)
        if not isinstance(fn, JITFunction):
            return None
        found = self.function(fn)
        if found is None:
            return None
        info, reason, _ = found  # pre-run hooks: a CompiledKernel's launcher runs none
        if reason is not None:
            return info, reason
        params = list(fn.params)
        constants = {}
        for path, value in src.constants.items():
            if len(path) != 1:
                return info, "its compile has a constant inside a tuple parameter"
            constants[params[path[0]].name] = value
        constexprs = {p.name: constexpr_value(constants.get(p.name)) for p in params
                      if p.is_constexpr}
        nones = {p.name for p in params if not p.is_constexpr and p.name in constants
                 and constants[p.name] is None}
        options = {k: getattr(compiled.metadata, k) for k in _RECORDED_OPTIONS}
        signature = dict(src.signature)

        def wrong(kernel) -> str:
            types = {p.name: p.type for p in kernel.params}
            return ", ".join(f"{n}: {types[n]}" for n, t in signature.items()
                             if isinstance(t, str) and t.startswith("*") and
                             types.get(n, "").startswith("*") and
                             _element(types[n]) != _element(t))

        found = self._pick(info, constexprs, options, nones, wrong)
        if isinstance(found, str):
            return info, found
        index = {p.name: i for i, p in enumerate(params)}
        positions = [index[p.name] for p in found.kernel.params if not p.constexpr]
        return info, found.view, positions

    def shape(self, info: _Function, nargs: int, kwnames):
        params = info.base.params
        names = [p.name for p in params]
        if nargs > len(names):
            return f"it takes {len(names)} arguments, the call gives {nargs}"
        bound = {names[i]: i for i in range(nargs)}
        options: Dict[str, int] = {}
        for j, key in enumerate(kwnames or ()):
            if key in names:
                if key in bound:
                    return f"the call gives '{key}' twice"
                bound[key] = nargs + j
            elif key in self.option_names:
                options[key] = nargs + j
            else:
                return f"keyword '{key}' is neither a parameter nor a Triton launch option"
        given_tuned = sorted(k for k in list(bound) + list(options) if k in info.tuned)
        if given_tuned:
            return f"the call sets {', '.join(given_tuned)}, which the autotuner's configs set"
        defaults: List[Any] = []
        call_pos: List[int] = []
        key: List[Tuple[str, str]] = []
        key_pos: List[int] = []
        constexpr_defaults: Dict[str, Any] = {}
        for p in params:
            pos = bound.get(p.name)
            if p.is_constexpr:
                if pos is not None:
                    key.append(("c", p.name))
                    key_pos.append(pos)
                elif p.name in info.tuned:
                    pass  # the autotuner's
                elif p.default is not inspect.Parameter.empty:
                    constexpr_defaults[p.name] = p.default
                else:
                    return f"the call does not give constexpr '{p.name}'"
                continue
            if pos is None:
                if p.default is inspect.Parameter.empty:
                    return f"the call does not give '{p.name}'"
                defaults.append(p.default)
                pos = -len(defaults)  # -1-d for defaults[d]
            call_pos.append(pos)
        for name, pos in options.items():
            key.append(("o", name))
            key_pos.append(pos)
        call_names = [p.name for p in params if not p.is_constexpr]
        # Pointers (a tensor's dtype chooses the kernel) and the parameters a kernel was
        # compiled with as None (a None argument chooses it): the C half reads both.
        watched = set()
        for _, kernel in info.candidates:
            watched |= {p.name for p in kernel.params if p.type.startswith("*")}
            watched |= info.nullable[kernel.name]
        dtype_params = [i for i, n in enumerate(call_names) if n in watched]
        shape = _Shape(key, constexpr_defaults, [call_names[i] for i in dtype_params])
        return shape, tuple(key_pos), tuple(call_pos), tuple(defaults), tuple(dtype_params)

    def target(self, info: _Function, shape: _Shape, values: tuple, dtypes: tuple):
        found = self.resolve(info, shape, values, dtypes)
        return found if isinstance(found, str) else found.view

    def resolve(self, info: _Function, shape: _Shape, values: tuple, dtypes: tuple):
        """The kernel view a call launches (a ``_Target``), or why it cannot (a str)."""
        constexprs = {k: constexpr_value(v) for k, v in shape.constexpr_defaults.items()}
        options: Dict[str, Any] = {}
        for (kind, name), value in zip(shape.key, values):
            if kind == "c":
                constexprs[name] = constexpr_value(value)
            else:
                options[name] = value
        unrecorded = [f"{k}={v!r}" for k, v in options.items()
                      if k not in _RECORDED_OPTIONS and not _same(v, self.option_defaults.get(k))]
        if unrecorded:
            return f"launch option {', '.join(unrecorded)} is not recorded in the pack"
        nones = {n for n, code in zip(shape.dtype_params, dtypes) if code == NONE_DTYPE}
        return self._pick(info, constexprs, options, nones,
                          lambda kernel: self._dtype_mismatch(kernel, shape.dtype_params, dtypes))

    def _pick(self, info: _Function, constexprs: Dict[str, Any], options: Dict[str, Any],
              nones: set, wrong_types: Callable[[Any], str]):
        """The kernel view a call with these constexprs, launch options and None arguments
        launches (a ``_Target``), or why none can (a str); ``wrong_types(kernel)`` says
        which pointer arguments the kernel does not take."""
        effective = {k: options.get(k, self.option_defaults[k]) for k in _RECORDED_OPTIONS}
        misses = []
        for pack, kernel in info.candidates:
            wrong = wrong_types(kernel)
            if wrong:
                misses.append(f"'{kernel.name}' takes {wrong}")
                continue
            nullable = info.nullable[kernel.name]
            if nones - nullable:
                name = sorted(nones - nullable)[0]
                kind = next(p.type for p in kernel.params if p.name == name)
                misses.append(f"'{kernel.name}' takes {name}: {kind}, the call passes None")
                continue
            if nullable - nones:
                misses.append(f"'{kernel.name}' was compiled with "
                              f"{', '.join(f'{n}=None' for n in sorted(nullable - nones))}; "
                              f"the call passes a value")
                continue
            wanted = {**constexprs, **{n: None for n in nullable}}
            if info.tuner is not None:
                names = [v.name for v in kernel.variants
                         if all(k in v.constexprs and _same(v.constexprs[k], c)
                                for k, c in wanted.items())]
                if not names:
                    misses.append(f"'{kernel.name}' has no variant with {_describe(wanted)}")
                    continue
                try:
                    return _Target(self._view(kernel, names, False), pack, kernel, names, False)
                except ValueError as e:  # a bucket none of them serves
                    misses.append(str(e))
                    continue
            names = [v.name for v in kernel.variants if self._matches(v, wanted, effective)]
            if names:
                return _Target(self._view(kernel, names, True), pack, kernel, names, True)
            have = sorted({f"{_describe(v.constexprs)}, num_warps={v.num_warps}"
                           for v in kernel.variants})
            misses.append(f"'{kernel.name}' has no variant with {_describe(wanted)}, "
                          f"num_warps={effective['num_warps']}, num_stages="
                          f"{effective['num_stages']}, num_ctas={effective['num_ctas']} (it has "
                          f"{'; '.join(have[:4])}{'; ...' if len(have) > 4 else ''})")
        return "; ".join(misses)

    def _config_hooks(self, info: _Function, tuner) -> Optional[str]:
        """Why the autotuner's config pre-hooks need Triton (None: they only set tensor
        descriptors' block shapes, each to the block of the pack's variants of its
        config, so the pack's launch does what they would)."""
        names = [p.name for p in info.base.params]
        for config in tuner.configs:
            hook = getattr(config, "pre_hook", None)
            if hook is None:
                continue
            label = getattr(hook, "__name__", None) or repr(hook)
            why = _hook_problem(hook)
            for _, kernel in info.candidates:
                if why is not None:
                    break
                descs = [p.name for p in kernel.params if p.type.startswith("tensordesc")]
                try:
                    blocks = _dry_run(hook, names, descs, config.all_kwargs())
                except _NotDescriptorOnly as e:
                    why = str(e)
                    break
                call = [p.name for p in kernel.params if not p.constexpr]
                for v in kernel.variants:
                    if not all(k in v.constexprs and _same(v.constexprs[k], value)
                               for k, value in config.kwargs.items()):
                        continue  # another config's variant
                    for name, block in blocks.items():
                        want = _block(v.arg_types[call.index(name)])
                        if want != block:
                            return (f"an autotuner config's pre_hook ({label}) disagrees with "
                                    f"pack kernel '{kernel.name}': the pre_hook sets {name}'s "
                                    f"block shape to {block} where the pack's variants of that "
                                    f"config have {want}")
            if why is not None:
                return (f"an autotuner config has a pre_hook that does more than set tensor "
                        f"descriptors' block shapes ({label}: {why}), which only Triton runs")
        return None

    def fallback(self, info: _Function, reason: str, stacklevel: int = 2) -> None:
        """Counts a call that runs on Triton and warns once per function and reason (raises
        with ``strict``). ``stacklevel`` 2 is the line calling this from C (the drop-in's
        launch has no Python frame): the caller's."""
        self.reasons.setdefault(info.qualname, set()).add(reason)
        message = f"kpack: {info.qualname} runs on Triton's JIT, not the pack: {reason}"
        if self.strict:
            raise DropInError(message)
        if (info.qualname, reason) not in self.warned:
            self.warned.add((info.qualname, reason))
            warnings.warn(message, DropInWarning, stacklevel=stacklevel)

    # ---- helpers

    @staticmethod
    def _name(fn) -> str:
        inner = getattr(fn, "fn", fn)
        return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', repr(fn))}"

    @staticmethod
    def _matches(v, constexprs: Dict[str, Any], options: Dict[str, Any]) -> bool:
        if v.constexprs.keys() != constexprs.keys() or \
                not all(_same(v.constexprs[k], c) for k, c in constexprs.items()):
            return False
        return (v.num_warps == options["num_warps"] and v.num_ctas == options["num_ctas"] and
                (v.num_stages in (0, options["num_stages"])) and
                v.launch_pdl == bool(options["launch_pdl"]) and
                v.launch_cooperative_grid == bool(options["launch_cooperative_grid"]))

    @staticmethod
    def _dtype_mismatch(kernel, names: List[str], dtypes: tuple) -> str:
        types = {p.name: p.type for p in kernel.params}
        wrong = []
        for name, code in zip(names, dtypes):
            if code in (0, NONE_DTYPE) or not types[name].startswith("*"):
                continue  # not a tensor read through DLPack (unknown, accepted), or None
            element = _element(types[name])
            if element not in _DLPACK_TYPES.get((code >> 8, code & 0xFF), ()):
                wrong.append(f"{name}: *{element}")
        return ", ".join(wrong)

    def _view(self, kernel, names: List[str], ignore_buckets: bool):
        key = (id(kernel), tuple(names), ignore_buckets)
        view = self.views.get(key)
        if view is None:
            if len(names) == len(kernel.variants) and \
                    (not ignore_buckets or all(not v.bucket for v in kernel.variants)):
                view = kernel  # every variant, the same dispatch
            else:
                try:
                    view = kernel.restrict(names, ignore_buckets=ignore_buckets)
                except _kpack.InvalidArgumentError as e:
                    raise ValueError(str(e)) from None
            self.views[key] = (view, kernel)  # keep `kernel` alive: `key` holds its id
        else:
            view = view[0]
        return view


class Installation:
    """The drop-in while installed: ``stats()``, ``uninstall()``."""

    def __init__(self, packs: Sequence[Any], strict: bool):
        from triton.compiler.compiler import CompiledKernel  # noqa: PLC0415
        from triton.runtime.jit import KernelInterface  # noqa: PLC0415
        self.packs = list(packs)
        self.strict = strict
        self._interface = KernelInterface
        self._original = KernelInterface.__dict__["__getitem__"]
        self._resolver = _Resolver(self.packs, strict)
        self._table = _kpack.DropIn(self._resolver, self._original)
        KernelInterface.__getitem__ = self._table
        # CompiledKernel[grid] (after fn.warmup(...)): through Python, answered once per
        # compiled kernel; its launch counts kept here.
        self._compiled_class = CompiledKernel
        self._compiled_original = CompiledKernel.__dict__["__getitem__"]
        self._compiled: Dict[int, Tuple[Any, Any]] = {}  # id -> (CompiledKernel, answer)
        self._compiled_counts: Dict[str, List[int]] = {}  # qualname -> [kpack, triton]

        def getitem(compiled, grid, _installation=self):
            return _installation._compiled_launch(compiled, grid)
        self._compiled_getitem = getitem
        CompiledKernel.__getitem__ = getitem

    def _compiled_launch(self, compiled, grid):
        """``compiled[grid]``: a launcher through the pack, or Triton's own (warned and
        counted when the pack cannot serve it)."""
        entry = self._compiled.get(id(compiled))
        if entry is None or entry[0] is not compiled:
            entry = (compiled, self._resolver.compiled(compiled))
            self._compiled[id(compiled)] = entry  # holds `compiled`, so its id stays unique
        answer = entry[1]
        if answer is None:
            return self._compiled_original(compiled, grid)
        info = answer[0]
        counts = self._compiled_counts.setdefault(info.qualname, [0, 0])
        if len(answer) == 2:
            reason, original, resolver = answer[1], self._compiled_original, self._resolver

            def fallback(*args, **kwargs):
                resolver.fallback(info, reason, stacklevel=3)  # the caller's line
                counts[1] += 1
                return original(compiled, grid)(*args, **kwargs)
            return fallback
        launch, positions = answer[1][grid], answer[2]

        def runner(*args, stream=None):
            call = [args[i] for i in positions]
            if stream is None:
                launch(*call)
            else:
                launch(*call, stream=stream)
            counts[0] += 1
        return runner

    def stats(self) -> Dict[str, Dict[str, Any]]:
        """``{qualname: {"kpack": launches through the pack, "triton": calls that fell back,
        "reasons": why they fell back}}`` for every Triton function called since install
        (``fn[grid](...)`` and ``CompiledKernel[grid](...)`` alike)."""
        out: Dict[str, Dict[str, Any]] = {}
        rows = [(_Resolver._name(fn), k, t) for fn, k, t in self._table.stats()]
        rows += [(name, k, t) for name, (k, t) in self._compiled_counts.items()]
        for name, kpack_calls, triton_calls in rows:
            row = out.setdefault(name, {"kpack": 0, "triton": 0, "reasons": []})
            row["kpack"] += kpack_calls
            row["triton"] += triton_calls
        for name, reasons in self._resolver.reasons.items():
            out.setdefault(name, {"kpack": 0, "triton": 0, "reasons": []})["reasons"] = \
                sorted(reasons)
        return out

    def uninstall(self) -> None:
        """Give Triton its ``__getitem__`` (and ``CompiledKernel.__getitem__``) back."""
        global _installed
        if self._interface.__dict__.get("__getitem__") is self._table:
            self._interface.__getitem__ = self._original
        if self._compiled_class.__dict__.get("__getitem__") is self._compiled_getitem:
            self._compiled_class.__getitem__ = self._compiled_original
        if _installed is self:
            _installed = None


_installed: Optional[Installation] = None


def install(pack, strict: bool = False) -> Installation:
    """Make existing ``my_kernel[grid](...)`` calls on the ``@triton.jit`` functions (and
    ``triton.autotune`` wrappers) that ``pack`` was built or recorded from, and
    ``compiled[grid](...)`` calls on their ``CompiledKernel`` (``my_kernel.warmup(...)``),
    launch through kpack, with no change to the calling code; see the module documentation for how a call
    is matched, and the README's Python section. Calls the pack cannot serve run on
    Triton's JIT with a ``kpack.DropInWarning`` once per function and reason (``strict``:
    raise ``kpack.DropInError``). Installing another pack adds it to those installed.
    The launch returns None (Triton's returns the compiled kernel)."""
    global _installed
    packs = [pack]
    if _installed is not None:
        packs = [p for p in _installed.packs if p is not pack] + [pack]
        _installed.uninstall()
    _installed = Installation(packs, strict)
    return _installed


def uninstall() -> None:
    """Undo ``install``: every Triton call runs on Triton's JIT again."""
    if _installed is not None:
        _installed.uninstall()


def installed() -> Optional[Installation]:
    """The current installation, or None."""
    return _installed
