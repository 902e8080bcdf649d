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
  (``matmul_fp16`` and ``matmul_bf16``).

Anything else -- an unknown constexpr value or option, a function whose source changed or
that no pack kernel was compiled from, other dtypes, ``triton.heuristics`` wrappers,
pre-run hooks -- goes to Triton's JIT with a ``kpack.DropInWarning`` once per function and
reason, and is counted; ``strict=True`` raises ``kpack.DropInError`` instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

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


@dataclasses.dataclass
class _Function:
    """What the resolver knows about one Triton kernel object."""
    fn: Any
    qualname: str
    base: Any = None    # the JITFunction
    tuner: Any = None   # the Autotuner, if fn is one
    candidates: List[Tuple[Any, Any]] = dataclasses.field(default_factory=list)  # (pack, Kernel)
    tuned: frozenset = frozenset()  # names the autotuner's configs set


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
            if [p.name for p in kernel.params] == names and \
                    [p.constexpr for p in kernel.params] == constexpr:
                info.candidates.append((pack, kernel))
        if not info.candidates:
            return info, f"its parameters differ from pack kernel '{found[0][1]}'", hooks
        if getattr(base, "debug", None):
            return info, "it was jitted with debug=True, which the pack was not compiled with", \
                hooks
        if tuner is not None:
            if any(getattr(c, "pre_hook", None) for c in tuner.configs):
                return info, "an autotuner config has a pre_hook, which only Triton runs", hooks
            info.tuned = frozenset(k for c in tuner.configs for k in c.all_kwargs())
        return info, None, hooks

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
        kernel = info.candidates[0][1]
        pointers = {p.name for p in kernel.params if p.type.startswith("*")}
        dtype_params = [i for i, n in enumerate(call_names) if n in pointers]
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
        effective = {k: options.get(k, self.option_defaults[k]) for k in _RECORDED_OPTIONS}
        misses = []
        for pack, kernel in info.candidates:
            wrong = self._dtype_mismatch(kernel, shape.dtype_params, dtypes)
            if wrong:
                misses.append(f"'{kernel.name}' takes {wrong}")
                continue
            if info.tuner is not None:
                names = [v.name for v in kernel.variants
                         if all(_same(v.constexprs.get(k), c) for k, c in constexprs.items())]
                if not names:
                    misses.append(f"'{kernel.name}' has no variant with {_describe(constexprs)}")
                    continue
                try:
                    return _Target(self._view(kernel, names, False), pack, kernel, names, False)
                except ValueError as e:  # a bucket none of them serves
                    misses.append(str(e))
                    continue
            names = [v.name for v in kernel.variants if self._matches(v, constexprs, effective)]
            if names:
                return _Target(self._view(kernel, names, True), pack, kernel, names, True)
            have = sorted({f"{_describe(v.constexprs)}, num_warps={v.num_warps}"
                           for v in kernel.variants})
            misses.append(f"'{kernel.name}' has no variant with {_describe(constexprs)}, "
                          f"num_warps={effective['num_warps']}, num_stages="
                          f"{effective['num_stages']}, num_ctas={effective['num_ctas']} (it has "
                          f"{'; '.join(have[:4])}{'; ...' if len(have) > 4 else ''})")
        return "; ".join(misses)

    def fallback(self, info: _Function, reason: str) -> None:
        self.reasons.setdefault(info.qualname, set()).add(reason)
        message = f"kpack: {info.qualname} runs on Triton's JIT, not the pack: {reason}"
        if self.strict:
            raise DropInError(message)
        if (info.qualname, reason) not in self.warned:
            self.warned.add((info.qualname, reason))
            warnings.warn(message, DropInWarning, stacklevel=2)  # the caller's line

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
            if code == 0:
                continue  # not a tensor read through DLPack: unknown, accepted
            element = types[name][1:]
            if element.startswith("k") and len(element) > 1:
                element = element[1:]
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
        from triton.runtime.jit import KernelInterface  # noqa: PLC0415
        self.packs = list(packs)
        self.strict = strict
        self._interface = KernelInterface
        self._original = KernelInterface.__dict__["__getitem__"]
        self._resolver = _Resolver(self.packs, strict)
        self._table = _kpack.DropIn(self._resolver, self._original)
        KernelInterface.__getitem__ = self._table

    def stats(self) -> Dict[str, Dict[str, Any]]:
        """``{qualname: {"kpack": launches through the pack, "triton": calls that fell back,
        "reasons": why they fell back}}`` for every Triton function called since install."""
        out: Dict[str, Dict[str, Any]] = {}
        for fn, kpack_calls, triton_calls in self._table.stats():
            name = _Resolver._name(fn)
            row = out.setdefault(name, {"kpack": 0, "triton": 0, "reasons": []})
            row["kpack"] += kpack_calls
            row["triton"] += triton_calls
        for name, reasons in self._resolver.reasons.items():
            out.setdefault(name, {"kpack": 0, "triton": 0, "reasons": []})["reasons"] = \
                sorted(reasons)
        return out

    def uninstall(self) -> None:
        """Give Triton its ``__getitem__`` back."""
        global _installed
        if self._interface.__dict__.get("__getitem__") is self._table:
            self._interface.__getitem__ = self._original
        if _installed is self:
            _installed = None


_installed: Optional[Installation] = None


def install(pack, strict: bool = False) -> Installation:
    """Make existing ``my_kernel[grid](...)`` calls on the ``@triton.jit`` functions (and
    ``triton.autotune`` wrappers) that ``pack`` was built or recorded from launch through
    kpack, with no change to the calling code; see the module documentation for how a call
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
