"""What record mode records (``kpack_tools.record``), and how a compile is read.

``CompileRecord`` is one compilation Triton made (signature, constants, specialization,
metadata, the cubin's hash), made from what ``triton.compile`` saw (``compile_record``);
``LaunchRecord`` one real launch with its grid and a summary of every argument
(``arg_summaries``: no device memory is touched); ``Recording`` all of them, merged across
the processes of a program and round-tripped through JSON.  The readings of a compile
that both the recorder and the export need live here too: each parameter's role
(``param_role``: a constexpr, an ``eq1`` int, an integer or another type), its
specialization (``specialization``: ``div16``/``eq1`` assumptions and integer types) and
its configuration (``config_key``), and what an autotuner's configs set
(``tuned_names``, ``TUNED_OPTIONS``) and choose by (``autotune_key_values``).
"""

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from kpack_tools.pack import source_identity
from kpack_tools.param_types import (INTEGER_TYPES, is_tensor_descriptor, is_tensordesc,
                                     parse_tensordesc)


@dataclass
class CompileRecord:
    """One compilation Triton made (``CompiledKernel``), keyed by Triton's
    compile hash.  Everything is JSON-able; the cubin is kept separately."""

    hash: str
    function: str                      # __name__
    module: str
    qualname: str
    source_key: str                    # JITFunction.cache_key: source + dependencies
    arg_names: List[str]
    declared_constexpr: List[bool]
    signature: Dict[str, str]          # param -> Triton type ("constexpr" if compiled in)
    constants: Dict[str, Any]          # param -> value, for every "constexpr" entry
    div16: List[str]                   # params with tt.divisibility = 16
    metadata: Dict[str, Any]
    options: Dict[str, Any]            # compile options (part of the config)
    cubin_sha256: str
    problems: List[str] = field(default_factory=list)
    source_sha256: str = ""            # sha256 of JITFunction.src (the manifest's source)
    # Set for the generic build the recorder compiled itself (item "Generic variants"):
    # the hash of the recorded compile it is the generic build of.
    generated_from: str = ""

    @property
    def function_id(self) -> Tuple[str, str, str]:
        return (self.module, self.qualname, self.source_key)


@dataclass
class LaunchRecord:
    """One launch (outside autotuning benchmarks): which compile, the grid in
    programs, and a summary of every argument by parameter name."""

    seq: int
    hash: str
    grid: List[int]
    args: Dict[str, Any]
    pre_hook: bool
    autotune_key: Optional[Dict[str, Any]] = None  # launched by triton.autotune: its key


@dataclass
class Recording:
    """Everything recorded, by one process or merged from several."""

    triton_version: str
    compiles: Dict[str, CompileRecord] = field(default_factory=dict)
    cubins: Dict[str, bytes] = field(default_factory=dict)        # sha256 -> cubin
    launches: List[LaunchRecord] = field(default_factory=list)
    launch_counts: Dict[str, int] = field(default_factory=dict)   # hash -> real launches
    bench_counts: Dict[str, int] = field(default_factory=dict)    # hash -> benchmark launches
    pre_hooks: Dict[str, int] = field(default_factory=dict)       # hash -> launches with a hook
    # Compilations that cannot be recorded at all (e.g. from IR text).
    unrecordable: List[str] = field(default_factory=list)
    # Per compile launched by a triton.autotune with several configs: the key's parameter
    # names ("keys"), the parameters and options its configs set ("tuned"), and every
    # distinct key value it was launched for with a count ("values": [[{param: value},
    # launches], ...], in first-use order). All launches count, not only summarized ones.
    autotune: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # What the recorder could not do but recorded anyway (e.g. a generic build failed).
    notes: List[str] = field(default_factory=list)

    def merge(self, other: "Recording") -> None:
        """Add another process's recording (compile hashes identify equal kernels)."""
        if other.triton_version != self.triton_version:
            raise ValueError(f"recordings from Triton {self.triton_version} and "
                             f"{other.triton_version} cannot be merged")
        for h, record in other.compiles.items():
            self.compiles.setdefault(h, record)
        self.cubins.update(other.cubins)
        offset = len(self.launches)
        for launch in other.launches:
            self.launches.append(dataclasses.replace(launch, seq=launch.seq + offset))
        for name in ("launch_counts", "bench_counts", "pre_hooks"):
            mine = getattr(self, name)
            for h, n in getattr(other, name).items():
                mine[h] = mine.get(h, 0) + n
        self.unrecordable.extend(other.unrecordable)
        for h, info in other.autotune.items():
            for key, count in info["values"]:
                self.note_autotune_key(h, info["keys"], info["tuned"], key, count)
        self.notes.extend(n for n in other.notes if n not in self.notes)

    def note_autotune_key(self, h: str, keys, tuned, key: Mapping[str, Any],
                          count: int = 1) -> None:
        """Count ``count`` launches of compile ``h`` by an autotuner for ``key``."""
        info = self.autotune.setdefault(h, {"keys": list(keys), "tuned": list(tuned),
                                            "values": []})
        for entry in info["values"]:
            if entry[0] == key:
                entry[1] += count
                return
        info["values"].append([dict(key), count])

    def to_json(self) -> Dict[str, Any]:
        return {"triton_version": self.triton_version,
                "compiles": [dataclasses.asdict(c) for c in self.compiles.values()],
                "launches": [dataclasses.asdict(x) for x in self.launches],
                "launch_counts": self.launch_counts, "bench_counts": self.bench_counts,
                "pre_hooks": self.pre_hooks, "unrecordable": self.unrecordable,
                "autotune": self.autotune, "notes": self.notes}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], cubins: Mapping[str, bytes]) -> "Recording":
        compiles = {c["hash"]: CompileRecord(**c) for c in data["compiles"]}
        return cls(triton_version=data["triton_version"], compiles=compiles,
                   cubins={c.cubin_sha256: cubins[c.cubin_sha256] for c in compiles.values()},
                   launches=[LaunchRecord(**x) for x in data["launches"]],
                   launch_counts=dict(data["launch_counts"]),
                   bench_counts=dict(data["bench_counts"]), pre_hooks=dict(data["pre_hooks"]),
                   unrecordable=list(data["unrecordable"]), autotune=dict(data["autotune"]),
                   notes=list(data["notes"]))


def _json_value(value) -> Any:
    """A JSON-able rendering of a metadata/option/constexpr value."""
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if hasattr(value, "_asdict"):  # GPUTarget and other namedtuples
        return _json_value(value._asdict())
    if dataclasses.is_dataclass(value):
        return _json_value(dataclasses.asdict(value))
    return repr(value)


def _constexpr_value(value) -> Tuple[Any, Optional[str]]:
    """``(value for the manifest, problem)``: JSON scalars as they are, Triton
    dtypes and jitted functions as their names (compiled in, informational)."""
    value = getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
    if isinstance(value, (bool, int, str)) or value is None:
        return value, None
    if isinstance(value, float):
        if math.isfinite(value):
            return value, None
        return None, f"value {value!r} is not finite (JSON cannot hold it)"
    module = type(value).__module__ or ""
    if module.startswith("triton.language"):  # tl.dtype and friends
        return str(value), None
    if hasattr(value, "fn") and hasattr(value, "arg_names"):  # a jitted function
        return f"{value.fn.__module__}.{value.fn.__qualname__}", None
    return None, f"value of type {type(value).__name__} cannot be stored in a kpack/1 manifest"


def flat_params(arg_names, signature) -> List[Tuple[str, Tuple[int, ...], Any]]:
    """``[(name, path, type)]``: the parameters with tuples flattened as Triton passes them,
    an element named ``tuple.i`` (``tuple.i.j`` nested) at Triton's path ``(p, i, ...)``."""
    out = []

    def walk(name, path, ty):
        if isinstance(ty, tuple):
            for i, item in enumerate(ty):
                walk(f"{name}.{i}", path + (i,), item)
        else:
            out.append((name, path, ty))

    for p, name in enumerate(arg_names):
        walk(name, (p,), signature.get(name))
    return out


def compile_record(src, metadata: Mapping[str, Any], cubin: bytes) -> CompileRecord:
    """Turn what ``triton.compile`` saw (an ``ASTSource`` over a ``JITFunction``)
    and produced into a record, noting what the pack format cannot express.  Tuple
    parameters are recorded flattened (``t.0``, ``t.1``: docs/pack-format.md)."""
    from triton.backends.nvidia.compiler import CUDAOptions
    fn = src.fn
    flat = flat_params(list(fn.arg_names), src.signature)
    arg_names = [name for name, _, _ in flat]
    by_path = {path: name for name, path, _ in flat}
    declared = [bool(fn.params[path[0]].is_constexpr) for _, path, _ in flat]
    problems = []
    signature = {}
    for name, path, ty in flat:
        if not isinstance(ty, str):
            problems.append(f"parameter '{name}' has type {ty!r}, which kpack cannot pass")
            ty = repr(ty)
        elif ty == "nvTmaDesc":
            problems.append(f"parameter '{name}' is a caller-encoded CUtensorMap (nvTmaDesc); "
                            f"kpack passes host tensor descriptors (tensordesc<...>) only")
        elif ty.startswith("tensordesc") and len(path) > 1:
            problems.append(f"parameter '{name}' is a tensor descriptor inside a tuple, which "
                            f"Triton 3.6's launcher does not expand")
        signature[name] = ty
    constants = {}
    for path, value in src.constants.items():
        name = by_path.get(tuple(path))
        if name is None:  # a whole tuple passed as a constexpr, or an empty one
            problems.append(f"constant at tuple path {path} is no single parameter")
            continue
        stored, problem = _constexpr_value(value)
        if problem:
            problems.append(f"constexpr '{name}': {problem}")
        constants[name] = stored
    div16 = []
    for path, attrs in src.attrs.items():
        name = by_path.get(tuple(path), repr(path))
        for attr in attrs:
            if name in signature and list(attr) == ["tt.divisibility", 16]:
                div16.append(name)
            else:
                problems.append(f"specialization attribute {list(attr)} on '{name}' has no "
                                f"kpack assumption")
    meta = {k: _json_value(v) for k, v in dict(metadata).items()}
    target = meta.get("target") or {}
    if target.get("backend") != "cuda":
        problems.append(f"target {target!r} is not CUDA")
    option_names = [f.name for f in dataclasses.fields(CUDAOptions)]
    options = {k: meta[k] for k in option_names if k in meta}
    return CompileRecord(
        hash=str(meta.get("hash") or hashlib.sha256(cubin).hexdigest()),
        function=fn.__name__, module=str(fn.fn.__module__), qualname=fn.fn.__qualname__,
        source_key=str(fn.cache_key), arg_names=arg_names, declared_constexpr=declared,
        signature=signature, constants=constants,
        div16=[n for n in arg_names if n in div16], metadata=meta, options=options,
        cubin_sha256=hashlib.sha256(cubin).hexdigest(), problems=problems,
        source_sha256=source_identity(fn)["sha256"])



# Config fields of triton.autotune's Config that are compile options, beside kwargs.
TUNED_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def autotune_key_values(tuner, args, kwargs) -> Optional[Dict[str, Any]]:
    """The key values ``Autotuner.run`` chooses a config by (Triton 3.6: the named key
    arguments); None when the autotuner has one config (then there is no choice)."""
    if len(getattr(tuner, "configs", ())) < 2:
        return None
    named = {**dict(zip(tuner.arg_names, args)), **kwargs}
    key = {}
    for name in tuner.keys:
        if name in named:
            summary = _arg_summary(named[name])
            key[name] = summary.get("value", summary.get("dtype", summary.get("repr")))
    return key


def tuned_names(tuner) -> List[str]:
    """The parameters and options the autotuner's configs set."""
    names = {name for config in tuner.configs for name in config.kwargs}
    return sorted(names) + list(TUNED_OPTIONS)


def compile_options(metadata: Mapping[str, Any]) -> Dict[str, Any]:
    """The compile options of a compile, as ``triton.compile`` takes them back (JSON
    lists from Triton's cache turned into the tuples the options hold)."""
    from triton.backends.nvidia.compiler import CUDAOptions
    options = {}
    for name in (f.name for f in dataclasses.fields(CUDAOptions)):
        if name not in metadata:
            continue
        value = metadata[name]
        if isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        options[name] = value
    return options


def arg_summaries(name, value) -> Dict[str, Any]:
    """``{parameter: summary}`` of one argument; a tuple's elements as ``name.i``."""
    if isinstance(value, tuple):
        out = {}
        for i, item in enumerate(value):
            out.update(arg_summaries(f"{name}.{i}", item))
        return out
    return {name: _arg_summary(value)}


def _arg_summary(value) -> Any:
    """What a launch passed for one parameter, without touching device memory."""
    if is_tensor_descriptor(value):
        base = _arg_summary(value.base)
        return {"tensordesc": {**base, "shape": [int(d) for d in value.shape],
                               "strides": [int(d) for d in value.strides],
                               "block_shape": [int(d) for d in value.block_shape],
                               "padding": str(getattr(value, "padding", "zero"))}}
    if hasattr(value, "data_ptr"):
        ptr = int(value.data_ptr())
        summary = {"ptr": ptr, "align16": ptr % 16 == 0, "dtype": str(value.dtype)}
        if hasattr(value, "shape"):
            summary["shape"] = [int(d) for d in value.shape]
        return summary
    if isinstance(value, (bool, int, str)) or value is None:
        return {"value": value}
    if isinstance(value, float):
        return {"value": value if math.isfinite(value) else repr(value)}
    stored, problem = _constexpr_value(value)
    return {"value": stored} if problem is None else {"repr": repr(value)}


def param_role(record: CompileRecord, i: int, name: str):
    """How parameter ``i`` enters the kernel: ``("constexpr", value)`` (declared
    or passed as None: part of the config), ``("eq1",)`` (an int compiled away
    because it was 1), ``("int", type)`` or ``("type", type)``."""
    ty = record.signature[name]
    if record.declared_constexpr[i]:
        return ("constexpr", record.constants.get(name))
    if ty == "constexpr":
        value = record.constants.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value == 1:
            return ("eq1",)
        return ("constexpr", value)
    if ty in INTEGER_TYPES:
        return ("int", ty)
    return ("type", ty)


def config_key(record: CompileRecord, ignore: Sequence[str] = ()) -> str:
    """What makes a compile's configuration: every parameter's role (constexpr values,
    non-integer types), the compile options and the arch; without the constexprs and
    options named in ``ignore`` (what an autotuner's configs set) and then without the
    block shapes of tensor descriptors, which follow the config (the tutorials' pre_hook
    sets them from it)."""
    roles = []
    for i, name in enumerate(record.arg_names):
        role = param_role(record, i, name)
        if ignore and role[0] == "type" and is_tensordesc(role[1]):
            dtype, block = parse_tensordesc(role[1])
            role = ("tensordesc", dtype, len(block))
        roles.append(("int",) if role[0] in ("int", "eq1") else
                     ("tuned",) if role[0] == "constexpr" and name in ignore else role)
    options = {k: v for k, v in record.options.items() if k not in ignore}
    arch = (record.metadata.get("target") or {}).get("arch")
    return json.dumps([roles, options, arch], sort_keys=True, default=repr)


def specialization(record: CompileRecord):
    """``(assumptions, int types)`` of a compile: its dispatch key."""
    assumptions, types = {}, {}
    for i, name in enumerate(record.arg_names):
        role = param_role(record, i, name)
        if role[0] == "eq1":
            assumptions[name] = ["eq1"]
        elif role[0] == "int":
            types[name] = role[1]
        if name in record.div16:
            assumptions[name] = ["div16"]
    return assumptions, types

