"""Record mode: run an unmodified Triton program and export what it compiled.

Two ways in (``docs/record.md`` has the whole contract)::

    python -m kpack_tools.record --out PACK [--force] -- python my_model.py args...

    with kpack_tools.record.Recorder(out="PACK"):
        model(x)

Every kernel Triton 3.6 compiles while recording is captured with its exact
signature, constexprs, specialization (``tt.divisibility`` 16 -> ``div16``,
ints equal to 1 compiled away -> ``eq1``, i32/i64/u64 int typing -> per-variant
``types``) and launch metadata, and every launch with its grid and a summary of
its arguments.  At export, one Python function + one configuration (constexpr
values, ``None`` arguments, non-integer argument types, compile options) is one
pack kernel, and the specializations seen are its variants, plus the generic
build the recorder compiles when recording stops.  A function under
``triton.autotune`` is one kernel whose buckets over the key reproduce the
autotuner's choices (``record_autotune``).  What the pack writer refuses is
refused per variant or kernel, never for the whole export.

Hook points (all of Triton 3.6, checked against its source):

- ``triton.knobs.compilation.listener``: called by ``triton.compile`` for every
  compilation, cache hits included, with the ``ASTSource`` (signature,
  constants, attrs), the metadata and the paths of the cached files (cubin).
- ``CompiledKernel.launch_metadata(grid, stream, *args)``: called by the JIT
  (and by ``CompiledKernel[grid]``) right before each launch with the
  evaluated grid and every argument; wrapped to count and summarize launches
  (``knobs.runtime.launch_enter_hook`` receives neither the grid nor the
  arguments in 3.6).
- ``Autotuner._bench`` and ``Autotuner.run``: wrapped to tell autotuning
  benchmark launches from real ones, to note each real launch's key values and
  to notice ``Config.pre_hook``.

Anything that depends on these is refused on another Triton version.
"""

import argparse
import atexit
import dataclasses
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from kpack_tools import SUPPORTED_TRITON_VERSIONS
from kpack_tools import record_autotune
from kpack_tools.pack import (INTEGER_TYPES, MAX_BUCKETS, Kernel, Variant, build_manifest,
                              check_variant, is_tensordesc, parse_tensordesc, source_identity,
                              write_pack)

RECORD_FILE = "record.json"
RECORD_FORMAT = "kpack-record/1"
DEFAULT_MAX_LAUNCHES = 64
# Environment of a recorded child process (set by the command line).
ENV_DIR = "KPACK_RECORD_DIR"
ENV_TOOLS = "KPACK_RECORD_TOOLS"
ENV_MAX_LAUNCHES = "KPACK_RECORD_MAX_LAUNCHES"
BOOT_DIR = Path(__file__).resolve().parent / "_record_boot"
# i32 before i64 before u64: the order the runtime prefers and Triton's JIT
# assigns (the narrowest type that holds the value).
_INT_ORDER = {"i32": 0, "i64": 1, "u64": 2}
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.]")
_MAX_VARIANT_NAME = 120


class UnsupportedTritonVersion(RuntimeError):
    """Triton is not a version whose hook points and ABI this module knows."""


def check_triton_version(version: str) -> None:
    """Raise ``UnsupportedTritonVersion`` unless ``version`` is supported."""
    if version not in SUPPORTED_TRITON_VERSIONS:
        raise UnsupportedTritonVersion(
            f"kpack record: found Triton {version}, supported: "
            f"{', '.join(SUPPORTED_TRITON_VERSIONS)}; the recorder reads Triton's compile "
            f"and launch internals, which change between versions, so it refuses to record")


# ---------------------------------------------------------------------------
# What is recorded
# ---------------------------------------------------------------------------


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
_TUNED_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _autotune_key(tuner, args, kwargs) -> Optional[Dict[str, Any]]:
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


def _tuned_names(tuner) -> List[str]:
    """The parameters and options the autotuner's configs set."""
    names = {name for config in tuner.configs for name in config.kwargs}
    return sorted(names) + list(_TUNED_OPTIONS)


def _compile_options(metadata: Mapping[str, Any]) -> Dict[str, Any]:
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


def _arg_summaries(name, value) -> Dict[str, Any]:
    """``{parameter: summary}`` of one argument; a tuple's elements as ``name.i``."""
    if isinstance(value, tuple):
        out = {}
        for i, item in enumerate(value):
            out.update(_arg_summaries(f"{name}.{i}", item))
        return out
    return {name: _arg_summary(value)}


def _arg_summary(value) -> Any:
    """What a launch passed for one parameter, without touching device memory."""
    if all(hasattr(value, a) for a in ("base", "shape", "strides", "block_shape")):
        # A triton.tools.tensor_descriptor.TensorDescriptor.
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


# ---------------------------------------------------------------------------
# The recorder: installs and removes the hooks
# ---------------------------------------------------------------------------

_active_lock = threading.Lock()
_active: Optional["Recorder"] = None


class Recorder:
    """Records Triton compilations and launches while active.

    As a context manager it writes the pack to ``out`` when the block exits
    (also when the block raised: then an export error is logged, not raised,
    so the block's exception is what propagates).  ``out`` may be None to
    record only; call ``export`` yourself.  One recorder is active at a time.
    ``max_launches`` caps the launches summarized per compiled kernel (all are
    counted).  ``dump_dir`` (used by the command line) makes the recorder
    write its recording there at every compilation and at exit.
    ``grid_tolerant`` names functions (or exported kernels) whose programs
    tolerate a larger grid; their kernels get the manifest's ``grid_tolerance``
    as *asserted* (``export``).
    """

    def __init__(self, out=None, force: bool = False,
                 max_launches: int = DEFAULT_MAX_LAUNCHES, dump_dir=None,
                 log: Optional[Callable[[str], None]] = print,
                 grid_tolerant: Sequence[str] = ()):
        self.out = out
        self.force = force
        self.grid_tolerant = tuple(grid_tolerant)
        self.max_launches = max_launches
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.log = log or (lambda line: None)
        self.recording: Optional[Recording] = None
        self._lock = threading.RLock()
        self._local = threading.local()
        self._saved = {}
        self._seq = 0
        self._unrecordable = set()
        # hash -> (ASTSource, compile options): what the generic build of it needs.
        self._sources: Dict[str, Tuple[Any, Dict[str, Any]]] = {}

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> "Recorder":
        global _active
        import triton
        check_triton_version(triton.__version__)
        from triton import knobs
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.autotuner import Autotuner
        with _active_lock:
            if _active is not None:
                raise RuntimeError("kpack record: another Recorder is already active")
            if self.out is not None:
                _check_out(Path(self.out), self.force)
            self.recording = Recording(triton_version=triton.__version__)
            previous_listener = knobs.compilation.listener
            recorder = self

            def listener(*, src, metadata, metadata_group, times, cache_hit):
                recorder._on_compile(src, metadata, metadata_group)
                if previous_listener is not None:
                    previous_listener(src=src, metadata=metadata, metadata_group=metadata_group,
                                      times=times, cache_hit=cache_hit)

            original_launch_metadata = CompiledKernel.launch_metadata
            original_bench = Autotuner._bench
            original_run = Autotuner.run

            def launch_metadata(kernel, grid, stream, *args):
                recorder._on_launch(kernel, grid, args)
                return original_launch_metadata(kernel, grid, stream, *args)

            def bench(tuner, *args, **kwargs):
                recorder._local.bench = getattr(recorder._local, "bench", 0) + 1
                try:
                    return original_bench(tuner, *args, **kwargs)
                finally:
                    recorder._local.bench -= 1

            def run(tuner, *args, **kwargs):
                stack = recorder._local.__dict__.setdefault("tuners", [])
                stack.append((tuner, _autotune_key(tuner, args, kwargs)))
                try:
                    return original_run(tuner, *args, **kwargs)
                finally:
                    stack.pop()

            self._saved = {"listener": previous_listener,
                           "launch_metadata": original_launch_metadata,
                           "bench": original_bench, "run": original_run}
            knobs.compilation.listener = listener
            CompiledKernel.launch_metadata = launch_metadata
            Autotuner._bench = bench
            Autotuner.run = run
            _active = self
        return self

    def stop(self) -> Recording:
        global _active
        from triton import knobs
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.autotuner import Autotuner
        with _active_lock:
            if _active is self:
                self._compile_generics()
                knobs.compilation.listener = self._saved["listener"]
                CompiledKernel.launch_metadata = self._saved["launch_metadata"]
                Autotuner._bench = self._saved["bench"]
                Autotuner.run = self._saved["run"]
                _active = None
        self.dump()
        return self.recording

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        recording = self.stop()
        if self.out is None:
            return
        if exc_type is None:
            export(recording, self.out, force=self.force, log=self.log,
                   grid_tolerant=self.grid_tolerant)
            return
        try:
            export(recording, self.out, force=self.force, log=self.log,
                   grid_tolerant=self.grid_tolerant)
        except Exception as err:  # the block's exception must win
            self.log(f"kpack record: could not export after the recorded block failed: {err}")

    # -- hooks -------------------------------------------------------------

    def _capture(self, src, metadata, read_cubin) -> Optional[str]:
        """Record a compilation once; return its hash (None if unrecordable)."""
        h = str(metadata.get("hash", ""))
        with self._lock:
            if h and h in self.recording.compiles:
                return h
            if h in self._unrecordable:
                return None
            if not hasattr(src, "fn") or not hasattr(src.fn, "arg_names"):
                self._unrecordable.add(h)
                self.recording.unrecordable.append(
                    f"{getattr(src, 'name', src)!r} (hash {h[:12]}): compiled from IR, not "
                    f"from a @triton.jit function, so its signature is unknown")
                return None
            cubin = read_cubin()
            record = compile_record(src, metadata, cubin)
            record.generated_from = getattr(self._local, "generic_of", "")
            self.recording.compiles[record.hash] = record
            self.recording.cubins[record.cubin_sha256] = cubin
            self._sources[record.hash] = (src, _compile_options(metadata))
        self.dump()
        return record.hash

    def _on_compile(self, src, metadata, metadata_group) -> None:
        def read_cubin():
            paths = [p for name, p in metadata_group.items() if name.endswith(".cubin")]
            if len(paths) != 1:
                raise RuntimeError(f"kpack record: compile of {src.name}: expected one cubin "
                                   f"in Triton's cache group, found {paths}")
            return Path(paths[0]).read_bytes()
        self._capture(src, metadata, read_cubin)

    def _on_launch(self, kernel, grid, args) -> None:
        h = kernel.hash
        if h not in self.recording.compiles:  # compiled before the recorder started
            h = self._capture(kernel.src, {**kernel.metadata._asdict(), "hash": kernel.hash},
                              lambda: bytes(kernel.asm["cubin"]))
            if h is None:
                return
        rec = self.recording
        with self._lock:
            if getattr(self._local, "bench", 0):
                rec.bench_counts[h] = rec.bench_counts.get(h, 0) + 1
                return
            tuners = getattr(self._local, "tuners", [])
            tuner, key = tuners[-1] if tuners else (None, None)
            config = getattr(tuner, "best_config", None)
            fn = getattr(kernel.src, "fn", None)
            pre_hook = bool((config is not None and config.pre_hook is not None)
                            or getattr(fn, "pre_run_hooks", None))
            count = rec.launch_counts.get(h, 0)
            rec.launch_counts[h] = count + 1
            if pre_hook:
                rec.pre_hooks[h] = rec.pre_hooks.get(h, 0) + 1
            if key is not None:
                rec.note_autotune_key(h, tuner.keys, _tuned_names(tuner), key)
            if count >= self.max_launches:
                return
            grid = list(grid) + [1] * (3 - len(grid))
            names = kernel.src.fn.arg_names
            summaries = {}
            for name, value in zip(names, args):
                summaries.update(_arg_summaries(name, value))
            rec.launches.append(LaunchRecord(
                seq=self._seq, hash=h, grid=[int(g) for g in grid[:3]],
                args=summaries,
                pre_hook=pre_hook, autotune_key=key))
            self._seq += 1

    def _compile_generics(self) -> None:
        """Compile the generic build (no ``div16``, no ``eq1``) of every recorded kernel
        and configuration that lacks one, as Triton's JIT would for arguments with no
        alignment and no value 1, so the pack serves any call the JIT would.  Runs while
        the hooks are installed: the listener records each build like any compile,
        marked ``generated_from``.  Autotuning candidates that were never chosen get none
        (they are not exported)."""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        rec = self.recording
        have, wanted = set(), {}
        for h, record in list(rec.compiles.items()):
            if record.problems or (not rec.launch_counts.get(h) and rec.bench_counts.get(h)):
                continue
            assumptions, types = _spec(record)
            generic_types = {n: t for n, t in types.items()}
            generic_types.update({n: "i32" for n, kinds in assumptions.items() if "eq1" in kinds})
            key = (record.function_id, _config_key(record),
                   json.dumps(generic_types, sort_keys=True))
            if not assumptions:
                have.add(key)
            elif h in self._sources:
                wanted.setdefault(key, (h, generic_types))
        for key, (h, generic_types) in wanted.items():
            if key in have:
                continue
            src, options = self._sources[h]
            record = rec.compiles[h]
            # The recorded compile's signature and constants with the generic integer types
            # at the (flattened) parameters' paths.
            paths = {name: path for name, path, _ in
                     flat_params(list(src.fn.arg_names), src.signature)}
            signature = dict(src.signature)
            for name, ty in generic_types.items():
                path = paths[name]
                signature[src.fn.arg_names[path[0]]] = _with_type_at(
                    signature[src.fn.arg_names[path[0]]], path[1:], ty)
            generic_paths = {paths[name] for name in generic_types}
            constexprs = {path: value for path, value in src.constants.items()
                          if tuple(path) not in generic_paths}
            target = record.metadata.get("target") or {}
            self._local.generic_of = h
            try:
                triton.compile(ASTSource(src.fn, signature, constexprs, attrs={}),
                               target=GPUTarget("cuda", target.get("arch"),
                                                target.get("warp_size", 32)),
                               options=options)
            except Exception as err:  # noqa: BLE001 - recorded, and said at export
                rec.notes.append(f"{record.module}.{record.qualname} (compile {h[:12]}): its "
                                 f"generic build failed: {type(err).__name__}: "
                                 f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}")
            finally:
                self._local.generic_of = ""

    def dump(self) -> None:
        """Write the recording to ``dump_dir`` (command-line mode only)."""
        if self.dump_dir is None or self.recording is None:
            return
        with self._lock:
            cubin_dir = self.dump_dir / "cubins"
            cubin_dir.mkdir(parents=True, exist_ok=True)
            for sha, data in self.recording.cubins.items():
                path = cubin_dir / f"{sha}.cubin"
                if not path.exists():
                    path.write_bytes(data)
            target = self.dump_dir / f"{os.getpid()}.json"
            tmp = target.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.recording.to_json()), encoding="utf-8")
            tmp.replace(target)


def _with_type_at(ty, path, new):
    """``ty`` (a type or a tuple of them) with the element at ``path`` replaced by ``new``."""
    if not path:
        return new
    items = list(ty)
    items[path[0]] = _with_type_at(items[path[0]], path[1:], new)
    return tuple(items)


def load_dumps(dump_dir) -> Tuple[Optional[Recording], List[str]]:
    """Merge the recordings the processes of a recorded program dumped, and
    return ``(recording or None, errors the processes reported)``."""
    dump_dir = Path(dump_dir)
    errors = [p.read_text(encoding="utf-8").strip() for p in sorted(dump_dir.glob("*.error"))]
    cubins = {p.stem: p.read_bytes() for p in (dump_dir / "cubins").glob("*.cubin")} \
        if (dump_dir / "cubins").is_dir() else {}
    merged = None
    for path in sorted(dump_dir.glob("*.json"), key=lambda p: int(p.stem)):
        recording = Recording.from_json(json.loads(path.read_text(encoding="utf-8")), cubins)
        if merged is None:
            merged = recording
        else:
            merged.merge(recording)
    return merged, errors


# ---------------------------------------------------------------------------
# Export: recording -> pack
# ---------------------------------------------------------------------------


@dataclass
class ExportReport:
    """What ``export`` did, as lines for the user and data for tests."""

    manifest: Optional[Mapping[str, Any]]
    record: Mapping[str, Any]
    lines: List[str]


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise FileExistsError(f"kpack record: {out} exists and is not empty; pass --force "
                              f"(force=True) to replace it")


def _int_rank(ty: str) -> int:
    return _INT_ORDER.get(ty, len(_INT_ORDER))


def _param_role(record: CompileRecord, i: int, name: str):
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


def _config_key(record: CompileRecord, ignore: Sequence[str] = ()) -> str:
    """What makes a compile's configuration: every parameter's role (constexpr values,
    non-integer types), the compile options and the arch; without the constexprs and
    options named in ``ignore`` (what an autotuner's configs set) and then without the
    block shapes of tensor descriptors, which follow the config (the tutorials' pre_hook
    sets them from it)."""
    roles = []
    for i, name in enumerate(record.arg_names):
        role = _param_role(record, i, name)
        if ignore and role[0] == "type" and is_tensordesc(role[1]):
            dtype, block = parse_tensordesc(role[1])
            role = ("tensordesc", dtype, len(block))
        roles.append(("int",) if role[0] in ("int", "eq1") else
                     ("tuned",) if role[0] == "constexpr" and name in ignore else role)
    options = {k: v for k, v in record.options.items() if k not in ignore}
    arch = (record.metadata.get("target") or {}).get("arch")
    return json.dumps([roles, options, arch], sort_keys=True, default=repr)


def _spec(record: CompileRecord):
    """``(assumptions, int types)`` of a compile: its dispatch key."""
    assumptions, types = {}, {}
    for i, name in enumerate(record.arg_names):
        role = _param_role(record, i, name)
        if role[0] == "eq1":
            assumptions[name] = ["eq1"]
        elif role[0] == "int":
            types[name] = role[1]
        if name in record.div16:
            assumptions[name] = ["div16"]
    return assumptions, types


def _variant_name(arg_names, assumptions, retyped) -> str:
    parts = []
    for name in arg_names:
        for kind in assumptions.get(name, ()):
            parts.append(f"{name}.{'d16' if kind == 'div16' else kind}")
        if name in retyped:
            parts.append(f"{name}.{retyped[name]}")
    return "-".join(parts) or "generic"


def _summarize_spec(assumptions, types) -> str:
    parts = [f"{kind}({','.join(p for p, k in assumptions.items() if kind in k)})"
             for kind in ("div16", "eq1") if any(kind in k for k in assumptions.values())]
    parts += [f"{p}:{t}" for p, t in types.items()]
    return " ".join(parts) or "no assumptions"


def _function_names(functions: Sequence[Tuple[str, str, str]], records) -> Dict[Tuple, str]:
    """Pack kernel base name per function: ``__name__`` when unique, else the
    module-qualified name, else that plus ``__src<k>`` (same name, different
    source: a redefinition)."""
    by_name: Dict[str, List[Tuple]] = {}
    for fid in functions:
        by_name.setdefault(records[fid].function, []).append(fid)
    names = {}
    for short, fids in by_name.items():
        if len(fids) == 1:
            names[fids[0]] = _NAME_UNSAFE.sub("_", short)
            continue
        by_qual: Dict[str, List[Tuple]] = {}
        for fid in fids:
            by_qual.setdefault(_NAME_UNSAFE.sub("_", f"{fid[0]}.{fid[1]}"), []).append(fid)
        for qual, same in by_qual.items():
            for k, fid in enumerate(same, start=1):
                names[fid] = qual if len(same) == 1 else f"{qual}__src{k}"
    return {fid: (n if re.match(r"[A-Za-z_]", n) else f"k_{n}") for fid, n in names.items()}


def export(recording: Recording, out, force: bool = False,
           log: Optional[Callable[[str], None]] = print,
           grid_tolerant: Sequence[str] = ()) -> ExportReport:
    """Write ``recording`` as a pack (plus ``record.json``) to ``out``.

    Policy (docs/record.md): compiles only benchmarked by the autotuner are not
    exported; one kernel per (function, config), except that an autotuned
    function is one kernel bucketed on its key; several configs of a function
    that no autotuner chose between become ``<name>__cfg<k>``; compiles the
    format cannot express, and variants or kernels the pack writer refuses,
    are refused by name while the rest is written.  Every decision is logged.
    ``grid_tolerant``: function names (``__name__`` or ``module.qualname``) or
    exported kernel names whose kernels get ``grid_tolerance`` ``{"proof":
    "asserted"}`` -- the caller's word, which recording cannot check; a name
    that matches nothing is an error.  Raises ValueError when nothing is
    exportable.
    """
    import triton
    log = log or (lambda line: None)
    lines: List[str] = []

    def say(line: str) -> None:
        lines.append(line)
        log(line)

    out = Path(out)
    _check_out(out, force)
    not_exported = []
    for text in recording.unrecordable:
        say(f"not exported: {text}")
        not_exported.append({"what": text, "reason": "compiled from IR"})

    first_use = {}
    for launch in recording.launches:
        first_use.setdefault(launch.hash, launch.seq)
    position = {h: i for i, h in enumerate(recording.compiles)}
    order = sorted(recording.compiles.values(),
                   key=lambda c: (first_use.get(c.hash, math.inf), position[c.hash]))
    exportable = []
    for record in order:
        where = f"{record.module}.{record.qualname} (compile {record.hash[:12]})"
        if record.problems:
            for problem in record.problems:
                say(f"REFUSED {where}: {problem}")
            not_exported.append({"function": f"{record.module}.{record.qualname}",
                                 "hash": record.hash, "reason": "; ".join(record.problems)})
            continue
        if not recording.launch_counts.get(record.hash) and recording.bench_counts.get(record.hash):
            say(f"not exported: {where}: an autotuning candidate ({_config_summary(record)}) "
                f"only launched by the autotuner's benchmark, never chosen")
            not_exported.append({"function": f"{record.module}.{record.qualname}",
                                 "hash": record.hash, "reason": "autotuning candidate, not chosen"})
            continue
        exportable.append(record)
    if not exportable:
        raise ValueError("kpack record: nothing to export: no Triton kernel compiled by the "
                         "program could be exported" + (" (see the lines above)" if lines else ""))

    functions: Dict[Tuple, List[CompileRecord]] = {}
    for record in exportable:
        functions.setdefault(record.function_id, []).append(record)
    first = {fid: records[0] for fid, records in functions.items()}
    base_names = _function_names(list(functions), first)
    for short in {r.function for r in first.values()}:
        clashing = [fid for fid in functions if first[fid].function == short]
        if len(clashing) > 1:
            say(f"name collision: {len(clashing)} different functions are called '{short}'; "
                f"exported as " + ", ".join(f"'{base_names[f]}' ({f[0]}.{f[1]})" for f in clashing))

    exports: List[_Exported] = []
    for fid, records in functions.items():
        said: set = set()
        groups = [(group, _known_key(tuner, records[0], say, said))
                  for group, tuner in _kernel_groups(records, recording)]
        if len(groups) > 1:
            say(f"'{base_names[fid]}': {len(groups)} configurations compiled for the same "
                f"function that no autotuner chose between; kpack cannot choose between "
                f"configurations by argument values, so each becomes its own kernel:")
        for k, (group, tuner) in enumerate(groups, start=1):
            name = base_names[fid] if len(groups) == 1 else f"{base_names[fid]}__cfg{k}"
            if len(groups) > 1:
                say(f"  '{name}': {_config_summary(group[0])}")
            exports.extend(_export_group(name, group, tuner, recording, say, not_exported))
    for note in recording.notes:
        say(f"note: {note}")
    if not exports:
        raise ValueError("kpack record: nothing to export: every kernel the program compiled "
                         "was refused (see the lines above)")

    tolerant = _mark_grid_tolerant(exports, grid_tolerant, say)
    generator = f"kpack_tools.record (triton {triton.__version__})"
    manifest = write_pack(out, [e.kernel for e in exports], generator=generator)
    launch_kernel = {h: e for e in exports for h in e.launch_variant}
    launches = []
    for x in sorted(recording.launches, key=lambda x: x.seq):
        exported = launch_kernel.get(x.hash)
        if exported is None:
            continue
        variant = exported.launch_variant[x.hash]
        if isinstance(variant, Mapping):  # autotuned: the exact bucket of its key
            variant = variant.get(_key_text(exported.key_params, x.autotune_key))
            if variant is None:  # that variant was refused
                continue
        launches.append({"kernel": exported.kernel.name, "variant": variant, "grid": x.grid,
                         "args": x.args, "pre_hook": x.pre_hook,
                         **({"autotune_key": x.autotune_key} if x.autotune_key else {})})
    record_json = {
        "format": RECORD_FORMAT, "generator": generator,
        "triton_version": recording.triton_version,
        "kernels": [entry for e in exports for entry in e.entries],
        "autotuned": [e.autotune for e in exports if e.autotune is not None],
        "launches": launches,
        "not_exported": not_exported,
        "grid_tolerant": tolerant,
    }
    (out / RECORD_FILE).write_text(json.dumps(record_json, indent=1) + "\n", encoding="utf-8")
    variants = sum(len(e.kernel.variants) for e in exports)
    say(f"wrote {out}: {len(exports)} kernels, {variants} variants, "
        f"{len(record_json['launches'])} launches in {RECORD_FILE}"
        + (f"; {len(not_exported)} not exported (listed in {RECORD_FILE})"
           if not_exported else ""))
    return ExportReport(manifest=manifest, record=record_json, lines=lines)


def _mark_grid_tolerant(exports, names: Sequence[str], say) -> List[str]:
    """Gives the kernels ``names`` designate (by kernel name, function ``__name__`` or
    ``module.qualname``) ``grid_tolerance`` {"proof": "asserted"}; returns their names."""
    marked = []
    for name in names:
        hits = [e for e in exports if name == e.kernel.name or (
            e.kernel.source is not None
            and name in (e.kernel.source["qualname"], e.kernel.source["qualname"].rsplit(".")[-1]))]
        if not hits:
            raise ValueError(f"kpack record: --grid-tolerant {name!r} matches no exported "
                             f"kernel (kernels: {', '.join(e.kernel.name for e in exports)})")
        for e in hits:
            if e.kernel.name in marked:
                continue
            e.kernel = dataclasses.replace(e.kernel, grid_tolerance={"proof": "asserted"})
            marked.append(e.kernel.name)
            say(f"grid tolerance asserted for kernel '{e.kernel.name}' (unproven: recording "
                f"cannot check it; a CUDA graph may launch it with a larger grid)")
    return marked


@dataclass
class _Exported:
    """One pack kernel from a recording, and what record.json says about it."""

    kernel: Kernel
    entries: List[Dict[str, Any]]        # record.json "kernels", one per variant
    # compile hash -> the variant its launches selected; for an autotuned kernel
    # {key text: variant}, the exact bucket of the launch's key.
    launch_variant: Dict[str, Any]
    key_params: Sequence[str] = ()       # autotuned: the bucketed key parameters
    autotune: Optional[Dict[str, Any]] = None


def _autotune_info(record: CompileRecord, recording: Recording) -> Optional[Dict[str, Any]]:
    """What the autotuner recorded for a compile (for a recorder-compiled generic
    build, for the compile it is the generic build of)."""
    return recording.autotune.get(record.generated_from or record.hash)


def _kernel_groups(records, recording):
    """The pack kernels of one function: ``[(records, tuner)]``.  Compiles launched by an
    autotuner are grouped by their configuration minus what the autotuner's configs set
    (``tuner`` = ``{"keys", "tuned"}``): one kernel whose buckets reproduce its choices.
    Other compiles are grouped by their whole configuration (``tuner`` None)."""
    groups: Dict[str, Tuple[List[CompileRecord], Optional[Dict[str, Any]]]] = {}
    for record in records:
        info = _autotune_info(record, recording)
        if info is None:
            groups.setdefault("plain" + _config_key(record), ([], None))[0].append(record)
        else:
            tuner = {"keys": info["keys"], "tuned": info["tuned"]}
            groups.setdefault("tuned" + _config_key(record, ignore=info["tuned"]),
                              ([], tuner))[0].append(record)
    return list(groups.values())


def _known_key(tuner, record: CompileRecord, say, said: set) -> Optional[Dict[str, Any]]:
    """``tuner`` with its key names restricted to the kernel's parameters, as Triton's
    autotuner uses them (it ignores a name that is no parameter of the function; a typo in
    a tutorial's key does that): each name left out is said once (``said``: the lines
    already said for this function)."""
    if tuner is None:
        return None
    keys = []
    for name in tuner["keys"]:
        if name in record.arg_names:
            keys.append(name)
            continue
        function = f"{record.module}.{record.qualname}"
        if any(n.startswith(name + ".") for n in record.arg_names):
            line = (f"WARNING: {function}: triton.autotune key '{name}' is a tuple "
                    f"parameter, which a pack's autotune_key cannot name (its elements are "
                    f"parameters of their own); it is left out of the kernel's key")
        else:
            line = (f"WARNING: {function}: triton.autotune key '{name}' names no parameter "
                    f"of the function; Triton's autotuner ignores it, and so does kpack")
        if line not in said:
            said.add(line)
            say(line)
    return dict(tuner, keys=keys)


def _export_group(name, group, tuner, recording, say, not_exported) -> List[_Exported]:
    """The pack kernel(s) of one group of compiles (``_kernel_groups``)."""
    configs: Dict[str, List[CompileRecord]] = {}
    for record in group:
        configs.setdefault(_config_key(record), []).append(record)
    if tuner is None or len(configs) == 1:
        exported = _plain_kernel(name, group, recording, say, not_exported,
                                 tuner["keys"] if tuner else None)
        return [exported] if exported else []
    exported, why_not = _autotuned_kernel(name, list(configs.values()), tuner["keys"],
                                          recording, say, not_exported)
    if exported is not None:
        return [exported]
    if why_not is None:  # refused (said and listed)
        return []
    say(f"'{name}': {len(configs)} configurations chosen by the autotuner over key "
        f"{tuner['keys']}, but {why_not}; each configuration becomes its own kernel:")
    out = []
    for k, records in enumerate(configs.values(), start=1):
        say(f"  '{name}__cfg{k}': {_config_summary(records[0])}")
        exported = _plain_kernel(f"{name}__cfg{k}", records, recording, say, not_exported,
                                 tuner["keys"])
        if exported:
            out.append(exported)
    return out


def _specializations(name, records, say, not_exported):
    """``[(record, assumptions, int types)]`` of distinct specializations (a compile that
    repeats another's is reported and dropped) and the kernel's declared integer type
    of each integer parameter: the narrowest seen."""
    specs = []
    seen = {}
    for record in records:
        assumptions, types = _spec(record)
        key = (_config_key(record), json.dumps(assumptions, sort_keys=True),
               json.dumps(types, sort_keys=True))
        if key in seen:
            say(f"not exported: '{name}' compile {record.hash[:12]}: same specialization and "
                f"configuration as compile {seen[key].hash[:12]} (they differ only in "
                f"environment-dependent compile settings); the earlier one is kept")
            not_exported.append({"function": f"{record.module}.{record.qualname}",
                                 "hash": record.hash, "reason": "duplicate specialization"})
            continue
        seen[key] = record
        specs.append((record, assumptions, types))
    base_types = {}
    for pname in records[0].arg_names:
        observed = [types[pname] for _, _, types in specs if pname in types]
        if observed:
            base_types[pname] = min(observed, key=_int_rank)
    return specs, base_types


def _kernel_params(rep: CompileRecord, base_types) -> List[Tuple[str, str]]:
    params = []
    for i, pname in enumerate(rep.arg_names):
        role = _param_role(rep, i, pname)
        if role[0] == "constexpr":
            params.append((pname, "constexpr"))
        elif role[0] in ("int", "eq1"):
            # An int that was 1 in every compile has no observed type: i32, the type
            # Triton's JIT gives small ints.
            params.append((pname, base_types.get(pname, "i32")))
        else:
            params.append((pname, role[1]))
    return params


def _variant_of(record, assumptions, types, base_types, params, recording, vname, bucket=None):
    retyped = {p: t for p, t in types.items() if t != base_types[p]}
    # A descriptor whose block shape differs from the kernel's (another autotuning config).
    retyped.update({p: record.signature[p] for p, t in params
                    if is_tensordesc(t) and record.signature[p] != t})
    constexpr_names = [p for p, t in params if t == "constexpr"]
    return Variant(
        name=vname, cubin=recording.cubins[record.cubin_sha256], metadata=record.metadata,
        constexprs={p: record.constants.get(p) for p in constexpr_names},
        bucket=bucket, assumptions=assumptions or None, types=retyped or None), retyped


def _spec_name(record, assumptions, retyped, taken) -> str:
    vname = _variant_name(record.arg_names, assumptions, retyped)
    return f"v{len(taken)}" if len(vname) > _MAX_VARIANT_NAME else vname


def _say_variant(say, name, vname, record, assumptions, retyped, recording, what=""):
    origin = ("; the generic build, compiled by the recorder" if record.generated_from
              else f"; {recording.launch_counts.get(record.hash, 0)} launches")
    say(f"kernel '{name}' variant '{vname}'{what}: {_summarize_spec(assumptions, retyped)}; "
        f"num_warps {record.metadata.get('num_warps')}, shared {record.metadata.get('shared')}"
        f"{origin}")
    if recording.pre_hooks.get(record.hash):
        say(f"WARNING: kernel '{name}' variant '{vname}': "
            f"{recording.pre_hooks[record.hash]} launches ran Python pre-hooks "
            f"(Config.pre_hook or add_pre_run_hook) that kpack does not run; a C++ caller "
            f"must do what they did (e.g. zero an output) before launching")


def _entry(name, vname, record, recording, launches=None) -> Dict[str, Any]:
    return {"kernel": name, "variant": vname, "hash": record.hash,
            "function": f"{record.module}.{record.qualname}",
            "launches": recording.launch_counts.get(record.hash, 0) if launches is None
            else launches,
            "launches_summarized": sum(1 for x in recording.launches if x.hash == record.hash),
            "benchmark_launches": recording.bench_counts.get(record.hash, 0),
            "launches_with_pre_hooks": recording.pre_hooks.get(record.hash, 0),
            **({"generated": "generic build compiled by the recorder"}
               if record.generated_from else {})}


def _source(record: CompileRecord) -> Optional[Dict[str, str]]:
    return {"qualname": f"{record.module}.{record.qualname}",
            "sha256": record.source_sha256} if record.source_sha256 else None


def _plain_kernel(name, records, recording, say, not_exported, autotune_key=None):
    """One pack kernel of one configuration: its specializations are the variants."""
    specs, base_types = _specializations(name, records, say, not_exported)
    params = _kernel_params(specs[0][0], base_types)
    variants, entries, launch_variant = [], [], {}
    for record, assumptions, types in specs:
        retyped = {p: t for p, t in types.items() if t != base_types[p]}
        vname = _spec_name(record, assumptions, retyped, variants)
        variant, _ = _variant_of(record, assumptions, types, base_types, params, recording,
                                 vname)
        variants.append(variant)
        entries.append(_entry(name, vname, record, recording))
        launch_variant[record.hash] = vname
        _say_variant(say, name, vname, record, assumptions, retyped, recording)
    kernel = Kernel(name=name, params=params, variants=variants, source=_source(records[0]),
                    autotune_key=list(autotune_key) if autotune_key else None)
    kernel = _validated(kernel, records, say, not_exported)
    if kernel is None:
        return None
    if not any(not v.assumptions for v in kernel.variants):
        say(f"note: kernel '{name}' has no generic variant (its generic build could not be "
            f"compiled): C++ calls that satisfy none of its variants' assumptions are "
            f"refused with INVALID_ARGUMENT")
    kept = {v.name for v in kernel.variants}
    return _Exported(kernel, [e for e in entries if e["variant"] in kept],
                     {h: v for h, v in launch_variant.items() if v in kept})


def _key_text(params, key) -> str:
    return json.dumps([(key or {}).get(p) for p in params])


def _autotuned_kernel(name, configs, keys, recording, say, not_exported):
    """One pack kernel for an autotuned function whose autotuner chose ``configs`` (lists
    of compiles, one list per configuration): buckets over the key's integer call
    parameters (``record_autotune``).  Returns ``(exported, None)``, ``(None, why)`` when
    the recording cannot be reproduced by buckets, or ``(None, None)`` when refused."""
    everything = [r for records in configs for r in records]
    specs, base_types = _specializations(name, everything, say, not_exported)
    params = _kernel_params(specs[0][0], base_types)
    integer = {p for p, t in params if t in INTEGER_TYPES}
    # Every key value the autotuner was launched for, and the configuration it chose.
    chosen: Dict[str, Tuple[Dict[str, Any], int]] = {}  # key text (all names) -> (key, cfg)
    for c, records in enumerate(configs):
        for record in records:
            info = recording.autotune.get(record.hash)
            for key, _ in (info["values"] if info else ()):
                text = json.dumps(key, sort_keys=True)
                if text in chosen and chosen[text][1] != c:
                    return None, f"key {key} was run with two configurations"
                chosen.setdefault(text, (key, c))
    dims = [k for k in keys if k in integer and all(
        isinstance(key.get(k), int) and not isinstance(key.get(k), bool)
        for key, _ in chosen.values())]
    if not dims:
        return None, (f"no key parameter is an integer call parameter to bucket on "
                      f"(key {keys})")
    recorded: List[Tuple[int, ...]] = []
    config_of: List[int] = []
    for key, c in chosen.values():
        point = tuple(key[d] for d in dims)
        if point in recorded:
            if config_of[recorded.index(point)] != c:
                return None, (f"keys that differ only in {[k for k in keys if k not in dims]} "
                              f"(not integer call parameters) were run with different "
                              f"configurations")
            continue
        recorded.append(point)
        config_of.append(c)
    plan = record_autotune.plan(dims, recorded, MAX_BUCKETS)
    if plan is None:
        return None, f"its {len(recorded)} recorded keys would need more than {MAX_BUCKETS} buckets"

    by_config: List[List[Tuple[CompileRecord, Dict, Dict]]] = [[] for _ in configs]
    index_of = {id(r): c for c, records in enumerate(configs) for r in records}
    for spec in specs:
        by_config[index_of[id(spec[0])]].append(spec)
    say(f"kernel '{name}': autotuned over key {keys}; {len(configs)} configurations chosen "
        f"for {len(recorded)} recorded key values, dispatched by buckets on {dims} "
        f"({len(plan.buckets)} buckets; unseen values use the nearest recorded key's "
        f"configuration, in variants named '..._near<k>_...'):")
    for n, point in enumerate(recorded):
        say(f"  key{n} {dict(zip(dims, point))}: {_config_summary(configs[config_of[n]][0])}")
    variants, entries = [], []
    launch_variant: Dict[str, Dict[str, str]] = {}
    names: Dict[int, str] = {}  # id(record) -> specialization part of the variant name
    for bucket in plan.buckets:
        prefix = "b" + "_".join(str(i) for i in bucket.index) + \
            (f"_key{bucket.key}_" if bucket.exact else f"_near{bucket.key}_")
        for record, assumptions, types in by_config[config_of[bucket.key]]:
            retyped = {p: t for p, t in types.items() if t != base_types[p]}
            part = names.setdefault(id(record), _spec_name(record, assumptions, retyped,
                                                           names))
            vname = prefix + part
            variant, _ = _variant_of(record, assumptions, types, base_types, params,
                                     recording, vname, bucket=list(bucket.index))
            variants.append(variant)
            if not bucket.exact:
                continue
            key = dict(zip(dims, recorded[bucket.key]))
            launches = sum(n for k, n in (recording.autotune.get(record.hash) or
                                          {"values": []})["values"]
                           if all(k.get(d) == key[d] for d in dims))
            entries.append(_entry(name, vname, record, recording, launches))
            launch_variant.setdefault(record.hash, {})[_key_text(dims, key)] = vname
    for c, specs_c in enumerate(by_config):
        for record, assumptions, types in specs_c:
            retyped = {p: t for p, t in types.items() if t != base_types[p]}
            _say_variant(say, name, f"*_{names[id(record)]}", record, assumptions, retyped,
                         recording, f" (configuration of key{config_of.index(c)})"
                         if c in config_of else "")
    kernel = Kernel(name=name, params=params, variants=variants,
                    buckets=[{"param": p, "edges": e} for p, e in plan.dims],
                    source=_source(everything[0]), autotune_key=list(keys))
    kernel = _validated(kernel, everything, say, not_exported)
    if kernel is None:
        return None, None
    kept = {v.name for v in kernel.variants}
    autotune = {
        "kernel": name, "key": list(keys), "bucketed": dims,
        "policy": "a key value the program used selects the configuration the autotuner "
                  "chose for it (variants b<i>_key<k>_*); any other selects the nearest "
                  "recorded key's (b<i>_near<k>_*): per parameter the nearest recorded "
                  "value (a tie goes to the smaller), then the recorded key with the least "
                  "total rank distance (a tie goes to the one used first)",
        "recorded_keys": [{"key": f"key{n}", "values": dict(zip(dims, point)),
                           "constexprs": {p: configs[config_of[n]][0].constants.get(p)
                                          for p, t in params if t == "constexpr"},
                           "options": {o: configs[config_of[n]][0].options.get(o)
                                       for o in _TUNED_OPTIONS}}
                          for n, point in enumerate(recorded)],
        "buckets": [{"bucket": list(b.index), "range": plan.describe(b),
                     "key": f"key{b.key}", "exact": b.exact} for b in plan.buckets],
    }
    return _Exported(kernel, [e for e in entries if e["variant"] in kept],
                     {h: {k: v for k, v in m.items() if v in kept}
                      for h, m in launch_variant.items()}, dims, autotune), None


def _validated(kernel: Kernel, records, say, not_exported) -> Optional[Kernel]:
    """``kernel`` if the pack writer accepts it; else without the variants it refuses
    alone; else None.  Every refusal is said and listed by name: one kernel the pack
    format cannot hold never costs the others."""
    try:
        build_manifest([kernel])
        return kernel
    except ValueError as err:
        problem = str(err)
    bad = {}
    for variant in kernel.variants:
        try:
            check_variant(kernel, variant)
        except ValueError as err:
            bad[variant.name] = str(err)
    kept = [v for v in kernel.variants if v.name not in bad]
    for vname, why in bad.items():
        say(f"REFUSED kernel '{kernel.name}' variant '{vname}': {why}")
        not_exported.append({"kernel": kernel.name, "variant": vname, "reason": why})
    if bad and kept:
        try:
            smaller = dataclasses.replace(kernel, variants=kept)
            build_manifest([smaller])
            return smaller
        except ValueError as err:
            problem = str(err)
    functions = sorted({f"{r.module}.{r.qualname}" for r in records})
    say(f"REFUSED kernel '{kernel.name}' ({', '.join(functions)}): {problem}")
    not_exported.append({"kernel": kernel.name, "function": ", ".join(functions),
                         "hashes": [r.hash for r in records], "reason": problem})
    return None


def _config_summary(record: CompileRecord) -> str:
    constexprs = {n: record.constants.get(n) for i, n in enumerate(record.arg_names)
                  if _param_role(record, i, n)[0] == "constexpr"}
    opts = {k: record.options[k] for k in ("num_warps", "num_stages", "num_ctas", "maxnreg")
            if record.options.get(k) is not None}
    types = {n: record.signature[n] for i, n in enumerate(record.arg_names)
             if _param_role(record, i, n)[0] == "type"}
    return f"constexprs {constexprs}, options {opts}, types {types}"


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _exit_status(returncode: int) -> int:
    """A child's status as a shell reports it (128 + signal for a signal)."""
    return 128 - returncode if returncode < 0 else returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kpack_tools.record",
        description="Run a Triton program unmodified and export every kernel it compiled "
                    "into a kpack pack (docs/record.md).",
        usage="%(prog)s --out PACK [--force] [--max-launches N] [--grid-tolerant NAME] "
              "-- COMMAND [ARGS...]")
    parser.add_argument("--out", required=True, help="pack directory to write")
    parser.add_argument("--force", action="store_true", help="replace an existing --out")
    parser.add_argument("--max-launches", type=int, default=DEFAULT_MAX_LAUNCHES,
                        help=f"launches summarized in {RECORD_FILE} per compiled kernel "
                             f"(default {DEFAULT_MAX_LAUNCHES}; all are counted)")
    parser.add_argument("--grid-tolerant", action="append", default=[], metavar="NAME",
                        help="a function (name or module.qualname) or exported kernel whose "
                             "programs tolerate a larger grid: its kernels get grid_tolerance "
                             "as asserted (repeatable; docs/record.md)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: put the program after --")
    try:
        _check_out(Path(args.out), args.force)
    except FileExistsError as err:
        print(err, file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="kpack-record-") as dump_dir:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(BOOT_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env[ENV_DIR] = dump_dir
        env[ENV_TOOLS] = str(Path(__file__).resolve().parents[1])
        env[ENV_MAX_LAUNCHES] = str(args.max_launches)
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as err:
            print(f"kpack record: cannot run {command[0]!r}: {err}", file=sys.stderr)
            return 127
        # Ctrl-C reaches the program (same process group); we wait for it and export.
        # (Ignored only after the start: an ignored SIGINT would be inherited.)
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            returncode = child.wait()
        finally:
            signal.signal(signal.SIGINT, old)
        status = _exit_status(returncode)
        recording, errors = load_dumps(dump_dir)
        for error in errors:
            print(error, file=sys.stderr)
        if errors:
            print("kpack record: the recorder failed in the program (above); no pack written",
                  file=sys.stderr)
            return status or 1
        if status != 0:
            print(f"kpack record: the program exited with status {status}; exporting what "
                  f"was recorded before that", file=sys.stderr)
        if recording is None or not recording.compiles:
            print("kpack record: nothing recorded: the program compiled no Triton kernel "
                  "(or ran no Python with Triton); no pack written", file=sys.stderr)
            return status or 1
        try:
            export(recording, args.out, force=args.force, grid_tolerant=args.grid_tolerant)
        except (ValueError, FileExistsError) as err:
            print(err, file=sys.stderr)
            return status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
