"""Write ``kpack/1`` and ``kpack/2`` pack directories (see ``docs/pack-format.md``).

The runtime refuses a pack on any inconsistency, so this writer checks what it
can at build time and fails loudly instead of writing a pack that would only
fail at ``Runtime::Open`` on a GPU machine.  In particular every variant's
``layout`` is read back from its cubin (``kpack_tools.cubin``) rather than
derived from the Python signature: ptxas, not Triton, decides the offsets.

Dispatch (several variants per kernel; kernel ``buckets`` and ``grid``;
per-variant ``bucket``, ``assumptions`` and ``types``) is checked against the
rules of the dispatch section of the format: edges strictly increasing, bucket
indices in range, ``div16`` only on pointer/integer parameters, ``eq1`` only on
integer parameters and absent from the cubin, ``types`` overrides only between
integer types, grid expressions parsed and constant-folded per variant, every
bucket served by a variant, and the dispatch table's limits.

A manifest is written as ``kpack/2`` when a kernel uses a field that format
added (``source``, ``autotune_key``, ``grid_tolerance``, a parameter's
``readonly``, a ``tensordesc`` parameter, a flattened tuple element ``name.i``), else as
``kpack/1``, so packs that need none of them stay readable by older runtimes.

Tensor descriptors (``tensordesc<DTYPE[B0, ...]>`` parameters) expand, in the
cubin and in the layout, into the slots Triton 3.6's launcher passes for them
(``desc_parts``); each variant's ``tensordesc_meta`` is Triton's compiled
metadata of that name with the TMA element type turned into the driver's
``CUtensorMapDataType`` (``tensordesc_meta_entry``).
"""

import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from kpack_tools.cubin import parse_cubin

FORMAT = "kpack/1"
FORMAT_2 = "kpack/2"
POINTER_SIZE = 8
SCALAR_SIZES = {
    "i1": 1, "u1": 1, "i8": 1, "u8": 1,
    "i16": 2, "u16": 2, "fp16": 2, "bf16": 2,
    "i32": 4, "u32": 4, "fp32": 4,
    "i64": 8, "u64": 8, "fp64": 8,
}
HIDDEN_PARAMS = ("$global_scratch", "$profile_scratch")
# Integer types for dispatch: bucket dims, div16/eq1 assumptions and `types`
# overrides.  i1/u1 are booleans (Triton never specializes them) and are not
# integers here.
INTEGER_TYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
ASSUMPTIONS = ("div16", "eq1")
GRID_FUNCTIONS = ("cdiv", "min", "max")
MAX_GRID_AXES = 3
# The runtime's dispatch limits (src/dispatch/dispatch.h): properties per kernel, buckets,
# and (bucket, variant) pairs, a variant without `bucket` counting once per bucket.
MAX_PROPERTIES = 256
MAX_BUCKETS = 4096
MAX_CANDIDATES = 1 << 20
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

_KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
# Variant names become file names, so they are kept to a path-safe alphabet.
_VARIANT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_POINTER_TYPE = re.compile(r"\*[A-Za-z0-9_]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REQUIRED_METADATA = (
    "name", "target", "num_warps", "num_ctas", "shared",
    "global_scratch_size", "global_scratch_align",
    "profile_scratch_size", "profile_scratch_align",
    "launch_pdl", "launch_cooperative_grid",
)


@dataclass(frozen=True)
class Variant:
    """One compiled variant of a kernel.

    ``metadata`` holds Triton's metadata fields (``CompiledKernel.metadata``
    as a dict, or the ``<name>.json`` of Triton's cache); ``constexprs`` the
    values the variant was compiled with, one per ``constexpr`` parameter of
    the kernel (an ``eq1`` parameter, compiled as a constexpr 1, is a call
    parameter of the pack and not listed here).

    Dispatch fields, all optional (``None``/empty: absent from the manifest):
    ``bucket`` the bucket indices this variant serves (one per kernel bucket
    dim); ``assumptions`` ``{param: ["div16"] | ["eq1"]}`` the specialization
    it was compiled with; ``types`` ``{param: integer type}`` overriding a
    parameter's declared integer type (e.g. ``{"n": "i64"}``).
    """

    name: str
    cubin: bytes
    metadata: Mapping[str, Any]
    constexprs: Mapping[str, Any]
    bucket: Optional[Sequence[int]] = None
    assumptions: Optional[Mapping[str, Sequence[str]]] = None
    types: Optional[Mapping[str, str]] = None

    @classmethod
    def from_compiled(cls, name: str, kernel, constexprs: Mapping[str, Any],
                      **dispatch) -> "Variant":
        """Wrap a Triton ``CompiledKernel``; ``dispatch`` may hold
        ``bucket``, ``assumptions`` and ``types``."""
        return cls(name=name, cubin=kernel.asm["cubin"],
                   metadata=kernel.metadata._asdict(), constexprs=constexprs, **dispatch)


@dataclass(frozen=True)
class Kernel:
    """A kernel: its Python parameters in declaration order and its variants.

    ``buckets`` (optional) is a list of ``{"param": name, "edges": [...]}``
    bucket dims; ``grid`` (optional) 1-3 grid expression strings (x, y, z).

    ``kpack/2`` fields, all optional: ``source`` ``{"qualname", "sha256"}``
    identifies the ``@triton.jit`` function (``source_identity``);
    ``readonly`` names pointer parameters the kernel never writes through;
    ``autotune_key`` the parameter names of the ``triton.autotune`` key whose
    recorded choices the buckets reproduce; ``grid_tolerance``
    ``{"proof": "gpu" | "asserted", "max": {bucket param: value}}`` (``max``
    optional) says the kernel's programs tolerate a larger grid (a CUDA graph
    pads its grid to the bucket's upper edge; docs/pack-format.md).
    """

    name: str
    params: Sequence[Tuple[str, str]]
    variants: Sequence[Variant]
    buckets: Optional[Sequence[Mapping[str, Any]]] = None
    grid: Optional[Sequence[str]] = None
    source: Optional[Mapping[str, str]] = None
    readonly: Sequence[str] = ()
    autotune_key: Optional[Sequence[str]] = None
    grid_tolerance: Optional[Mapping[str, Any]] = None


GRID_PROOFS = ("gpu", "asserted")


def source_identity(fn, qualname: Optional[str] = None) -> Mapping[str, str]:
    """``{"qualname", "sha256"}`` of a ``@triton.jit`` function (a ``JITFunction``):
    ``module.qualname`` (or ``qualname`` when given) and the sha256 of its source
    text as Triton holds it (``JITFunction.src``: the ``def`` without decorators,
    dedented), which is what ``kpack.install`` matches a Python function by."""
    if qualname is None:
        qualname = f"{fn.fn.__module__}.{fn.fn.__qualname__}"
    return {"qualname": qualname, "sha256": hashlib.sha256(fn.src.encode("utf-8")).hexdigest()}


def slot_size(param_type: str) -> Optional[int]:
    """Bytes a parameter of this Triton type takes; None for ``constexpr``, 0 for a
    ``tensordesc``, which expands into several slots (``desc_parts``)."""
    if param_type == "constexpr":
        return None
    if _POINTER_TYPE.fullmatch(param_type):
        return POINTER_SIZE
    if param_type in SCALAR_SIZES:
        return SCALAR_SIZES[param_type]
    if param_type == "nvTmaDesc":
        raise ValueError("parameter type 'nvTmaDesc' (a caller-encoded CUtensorMap) is not "
                         "supported; pass a host tensor descriptor (tensordesc<...>)")
    if param_type.startswith("tensordesc"):
        parse_tensordesc(param_type)
        return 0
    raise ValueError(f"unknown parameter type '{param_type}'")


# ---------------------------------------------------------------------------
# Tensor descriptors
# ---------------------------------------------------------------------------

_TENSORDESC = re.compile(r"tensordesc<([A-Za-z0-9_]+)\[([0-9, ]*)\]>")
# Bytes per element of the element types a descriptor may have (the runtime's table).
ELEMENT_BYTES = {
    "i1": 1, "u1": 1, "i8": 1, "u8": 1, "fp8e4nv": 1, "fp8e5": 1, "fp8e4b15": 1,
    "fp8e4b8": 1, "fp8e5b16": 1, "i16": 2, "u16": 2, "fp16": 2, "bf16": 2,
    "i32": 4, "u32": 4, "fp32": 4, "i64": 8, "u64": 8, "fp64": 8,
}
MAX_DESC_RANK = 5
# Triton's metadata holds the TMA element type as the device code numbers it; its
# launcher maps it to the driver's CUtensorMapDataType (driver.py,
# TMA_DTYPE_DEVICE_TO_HOST): identical but for 8, 9 and 10. The manifest holds the
# driver's value.
_TMA_DTYPE_DEVICE_TO_HOST = {8: 10, 9: 8, 10: 9}


def is_tensordesc(param_type) -> bool:
    return isinstance(param_type, str) and param_type.startswith("tensordesc")


def parse_tensordesc(param_type: str) -> Tuple[str, Tuple[int, ...]]:
    """``(element type, block shape)`` of ``tensordesc<DTYPE[B0, ...]>``; ValueError for
    anything else (a Gluon descriptor with a layout included)."""
    match = _TENSORDESC.fullmatch(param_type)
    if match is None:
        gluon = "]," in param_type
        raise ValueError(f"'{param_type}' is not a tensordesc<DTYPE[B0, ...]> type"
                         + (" (a Gluon descriptor with a layout is not supported)"
                            if gluon else ""))
    dtype = match.group(1)
    if dtype not in ELEMENT_BYTES:
        raise ValueError(f"'{param_type}': unknown element type '{dtype}'")
    block = tuple(int(d) for d in match.group(2).split(",") if d.strip())
    if not 1 <= len(block) <= MAX_DESC_RANK or any(d < 1 for d in block):
        raise ValueError(f"'{param_type}': the block shape needs 1 to {MAX_DESC_RANK} "
                         f"positive dimensions")
    return dtype, block


def tensordesc_type(dtype: str, block: Sequence[int]) -> str:
    """Triton's spelling: ``tensordesc<fp16[64, 128]>`` (its JIT writes ``str(list)``)."""
    return f"tensordesc<{dtype}{list(block)}>"


def desc_parts(rank: int, tma: bool) -> List[Tuple[str, int]]:
    """``[(part, slot size)]`` a descriptor of ``rank`` expands into, in Triton 3.6's
    order (driver.py, make_launcher): with TMA metadata the CUtensorMap then the shape as
    i32 and the strides as i64; without, the base pointer, shape and strides as i64, the
    padding flag, then the shape and strides again."""
    head = [("tma", 128)] if tma else (
        [("base", 8)] + [(f"base_shape[{i}]", 8) for i in range(rank)]
        + [(f"base_strides[{i}]", 8) for i in range(rank)] + [("padding", 1)])
    return head + [(f"shape[{i}]", 4) for i in range(rank)] + \
        [(f"strides[{i}]", 8) for i in range(rank)]


def tensordesc_meta_entry(meta) -> Optional[Mapping[str, Any]]:
    """The manifest's ``tensordesc_meta`` entry for one entry of Triton's metadata (None
    for a descriptor the variant did not lower to TMA)."""
    if meta is None:
        return None
    if not isinstance(meta, Mapping) or not {"swizzle", "elem_size", "elem_type",
                                             "block_size", "fp4_padded"} <= set(meta):
        raise ValueError(f"tensordesc_meta entry {meta!r} lacks Triton 3.6's fields")
    elem_type = int(meta["elem_type"])
    return {"data_type": _TMA_DTYPE_DEVICE_TO_HOST.get(elem_type, elem_type),
            "elem_size": int(meta["elem_size"]), "swizzle": int(meta["swizzle"]),
            "block_size": [int(b) for b in meta["block_size"]],
            "fp4_padded": bool(meta["fp4_padded"])}


def pack_bytes(out_dir) -> int:
    """Total size in bytes of the files of the pack in ``out_dir`` (for build logs)."""
    return sum(p.stat().st_size for p in Path(out_dir).rglob("*") if p.is_file())


def write_pack(out_dir, kernels: Sequence[Kernel],
               generator: Optional[str] = None,
               extra_files: Optional[Mapping[str, bytes]] = None) -> Mapping[str, Any]:
    """Write a pack to ``out_dir`` and return its manifest.

    The pack is assembled in a temporary sibling directory and then moved into
    place, so a failure never leaves a half-written pack.  An existing
    ``out_dir`` is replaced only if it is empty or a pack (has a
    ``manifest.json``); anything else is refused rather than deleted.

    ``extra_files`` (``{relative path: bytes}``) are side files the runtime
    ignores (e.g. the builder's ``tuning.json``); they may not be
    ``manifest.json``, lie under ``cubins/`` or leave the pack.
    """
    out_dir = Path(out_dir)
    manifest, files = build_manifest(kernels, generator)
    for relpath, data in dict(extra_files or {}).items():
        parts = Path(relpath).parts
        if not parts or Path(relpath).is_absolute() or ".." in parts \
                or parts[0] in ("manifest.json", "cubins"):
            raise ValueError(f"extra file '{relpath}': must be a relative path inside the "
                             f"pack, not manifest.json and not under cubins/")
        files[relpath] = bytes(data)
    if out_dir.exists() and any(out_dir.iterdir()) \
            and not (out_dir / "manifest.json").is_file():
        raise ValueError(
            f"{out_dir}: exists, is not empty and is not a pack; refusing to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for relpath, data in files.items():
            path = staging / relpath
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        (staging / "manifest.json").write_text(
            json.dumps(manifest, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        os.chmod(staging, 0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return manifest


def build_manifest(kernels: Sequence[Kernel], generator: Optional[str] = None):
    """Return ``(manifest, {relative cubin path: bytes})`` for ``kernels``."""
    if not kernels:
        raise ValueError("a pack needs at least one kernel")
    version_2 = any(k.source is not None or k.readonly or k.autotune_key is not None
                    or k.grid_tolerance is not None
                    or any(is_tensordesc(t) or "." in name for name, t in k.params)
                    for k in kernels)
    manifest = {"format": FORMAT_2 if version_2 else FORMAT}
    if generator is not None:
        manifest["generator"] = generator
    manifest["kernels"] = []
    files = {}
    seen = set()
    for kernel in kernels:
        if not _KERNEL_NAME.fullmatch(kernel.name):
            raise ValueError(f"kernel '{kernel.name}': name must match {_KERNEL_NAME.pattern}")
        if kernel.name in seen:
            raise ValueError(f"kernel '{kernel.name}': duplicate kernel name")
        seen.add(kernel.name)
        manifest["kernels"].append(_kernel_entry(kernel, files))
    return manifest, files


def _kernel_entry(kernel: Kernel, files) -> Mapping[str, Any]:
    where = f"kernel '{kernel.name}'"
    names = [name for name, _ in kernel.params]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: duplicate parameter names {names}")
    for name, param_type in kernel.params:
        try:
            slot_size(param_type)
        except ValueError as err:
            raise ValueError(f"{where}: parameter '{name}': {err}") from None
    if not kernel.variants:
        raise ValueError(f"{where}: needs at least one variant")
    variant_names = [variant.name for variant in kernel.variants]
    for name in variant_names:
        if variant_names.count(name) > 1:
            raise ValueError(f"{where}: duplicate variant name '{name}'")
    param_types = dict(kernel.params)
    buckets = _check_buckets(kernel.buckets, param_types, where)
    grid = _check_grid_shape(kernel.grid, where)

    variants = []
    dispatch = []  # (variant name, bucket, assumptions, effective types) per variant
    # Variants with the same cubin (one config serving several buckets) share its file.
    cubin_paths = {}
    for variant in kernel.variants:
        relpath = cubin_paths.setdefault(hashlib.sha256(variant.cubin).digest(),
                                         f"cubins/{kernel.name}/{variant.name}.cubin")
        entry, spec = _variant_entry(kernel, variant, relpath, buckets)
        if grid is not None:
            for axis, expr in enumerate(grid):
                check_grid_expression(expr, param_types, entry["constexprs"],
                                      f"{where}: variant '{variant.name}': grid[{axis}]")
        variants.append(entry)
        dispatch.append(spec)
        files[relpath] = bytes(variant.cubin)
    # A descriptor's block shape (its `types` override) is no dispatch property: the
    # runtime never chooses by it.
    _check_dispatch_table([(name, bucket, assumptions,
                            {p: t for p, t in effective.items() if not is_tensordesc(t)})
                           for name, bucket, assumptions, effective in dispatch], buckets, where)

    readonly = _check_readonly(kernel, where)
    result = {"name": kernel.name}
    if kernel.source is not None:
        result["source"] = _check_source(kernel.source, where)
    result["params"] = [{"name": name, "type": param_type, **({"readonly": True}
                                                               if name in readonly else {})}
                        for name, param_type in kernel.params]
    if kernel.autotune_key is not None:
        result["autotune_key"] = _check_autotune_key(kernel.autotune_key, names, where)
    if buckets is not None:
        result["buckets"] = [{"param": param, "edges": list(edges)} for param, edges in buckets]
    if grid is not None:
        result["grid"] = list(grid)
    if kernel.grid_tolerance is not None:
        result["grid_tolerance"] = _check_grid_tolerance(kernel.grid_tolerance, buckets, where)
    result["variants"] = variants
    return result


def _check_grid_tolerance(tolerance, buckets, where):
    """``{"proof", "max"?}``: the proof one of GRID_PROOFS; each ``max`` key a bucket
    parameter, its value an integer above that dim's last edge."""
    if not isinstance(tolerance, Mapping) or "proof" not in tolerance \
            or set(tolerance) - {"proof", "max"}:
        raise ValueError(f"{where}: grid_tolerance must be {{'proof': ..., 'max': {{...}}}} "
                         f"('max' optional), got {tolerance!r}")
    if tolerance["proof"] not in GRID_PROOFS:
        raise ValueError(f"{where}: grid_tolerance.proof must be one of {GRID_PROOFS}, got "
                         f"{tolerance['proof']!r}")
    result = {"proof": tolerance["proof"]}
    if "max" in tolerance:
        last_edge = {param: edges[-1] for param, edges in buckets or ()}
        maximum = tolerance["max"]
        if not isinstance(maximum, Mapping):
            raise ValueError(f"{where}: grid_tolerance.max must be {{bucket parameter: value}}, "
                             f"got {maximum!r}")
        for param, value in maximum.items():
            if param not in last_edge:
                raise ValueError(f"{where}: grid_tolerance.max: '{param}' is not a bucket "
                                 f"parameter ({sorted(last_edge)})")
            if not _is_int(value) or not last_edge[param] < value <= INT64_MAX:
                raise ValueError(f"{where}: grid_tolerance.max['{param}'] = {value!r} must be an "
                                 f"integer above the last edge {last_edge[param]}")
        result["max"] = dict(maximum)
    return result


def _check_source(source, where):
    if not isinstance(source, Mapping) or set(source) != {"qualname", "sha256"}:
        raise ValueError(f"{where}: source must be {{'qualname', 'sha256'}}, got {source!r}")
    if not isinstance(source["qualname"], str) or not source["qualname"]:
        raise ValueError(f"{where}: source.qualname must be a non-empty string")
    if not isinstance(source["sha256"], str) or not _SHA256.fullmatch(source["sha256"]):
        raise ValueError(f"{where}: source.sha256 must be 64 lowercase hex digits, got "
                         f"{source['sha256']!r}")
    return {"qualname": source["qualname"], "sha256": source["sha256"]}


def _check_readonly(kernel: Kernel, where):
    types = dict(kernel.params)
    readonly = list(kernel.readonly)
    for name in readonly:
        if not _POINTER_TYPE.fullmatch(types.get(name, "")):
            raise ValueError(f"{where}: readonly: '{name}' is not a pointer parameter")
        if readonly.count(name) > 1:
            raise ValueError(f"{where}: readonly: '{name}' listed twice")
    return set(readonly)


def _check_autotune_key(key, names, where):
    if isinstance(key, (str, bytes)) or not isinstance(key, Sequence) or not key:
        raise ValueError(f"{where}: autotune_key must be a non-empty list of parameter names")
    for name in key:
        if name not in names:
            raise ValueError(f"{where}: autotune_key: unknown parameter {name!r}")
        if list(key).count(name) > 1:
            raise ValueError(f"{where}: autotune_key: '{name}' listed twice")
    return list(key)


def check_variant(kernel: Kernel, variant: Variant) -> None:
    """Validate one variant of ``kernel`` the way ``build_manifest`` does (metadata,
    cubin, layout, dispatch fields, grid); raises ValueError naming what is wrong."""
    where = f"kernel '{kernel.name}'"
    param_types = dict(kernel.params)
    buckets = _check_buckets(kernel.buckets, param_types, where)
    entry, _ = _variant_entry(kernel, variant, f"cubins/{kernel.name}/{variant.name}.cubin",
                              buckets)
    for axis, expr in enumerate(_check_grid_shape(kernel.grid, where) or ()):
        check_grid_expression(expr, param_types, entry["constexprs"],
                              f"{where}: variant '{variant.name}': grid[{axis}]")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_buckets(buckets, param_types, where):
    """Validate kernel ``buckets``; return ``[(param, edges), ...]`` or None."""
    if buckets is None:
        return None
    if isinstance(buckets, (str, bytes, Mapping)) or not isinstance(buckets, Sequence) \
            or not buckets:
        raise ValueError(f"{where}: buckets must be a non-empty list of "
                         f"{{'param', 'edges'}} dims, got {buckets!r}")
    result = []
    for i, dim in enumerate(buckets):
        field = f"{where}: buckets[{i}]"
        if not isinstance(dim, Mapping) or set(dim) != {"param", "edges"}:
            raise ValueError(f"{field}: must be {{'param': NAME, 'edges': [...]}}, got {dim!r}")
        param, edges = dim["param"], dim["edges"]
        if param not in param_types:
            raise ValueError(f"{field}: unknown parameter {param!r}")
        if param_types[param] not in INTEGER_TYPES:
            raise ValueError(f"{field}: parameter '{param}' is {param_types[param]}, "
                             f"a bucket dim needs an integer call parameter {INTEGER_TYPES}")
        if any(param == other for other, _ in result):
            raise ValueError(f"{field}: parameter '{param}' is already a bucket dim")
        if isinstance(edges, (str, bytes)) or not isinstance(edges, Sequence) or not edges:
            raise ValueError(f"{field}: edges must be a non-empty list of integers")
        for edge in edges:
            if not _is_int(edge) or not INT64_MIN <= edge <= INT64_MAX:
                raise ValueError(f"{field}: edge {edge!r} is not a 64-bit integer")
        for lo, hi in zip(edges, edges[1:]):
            if not lo < hi:
                raise ValueError(f"{field}: edges {list(edges)} are not strictly increasing "
                                 f"({lo} then {hi})")
        result.append((param, tuple(edges)))
    count = 1
    for _, edges in result:
        count *= len(edges) + 1
    if count > MAX_BUCKETS:
        raise ValueError(f"{where}: buckets make {count} buckets, at most {MAX_BUCKETS} allowed")
    return result


def _check_grid_shape(grid, where):
    if grid is None:
        return None
    if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) \
            or not 1 <= len(grid) <= MAX_GRID_AXES:
        raise ValueError(f"{where}: grid must be a list of 1-{MAX_GRID_AXES} expression "
                         f"strings, got {grid!r}")
    for axis, expr in enumerate(grid):
        if not isinstance(expr, str):
            raise ValueError(f"{where}: grid[{axis}] is not a string: {expr!r}")
    return tuple(grid)


def _check_dispatch_fields(kernel: Kernel, variant: Variant, buckets, where):
    """Validate a variant's ``bucket``, ``assumptions`` and ``types``.

    Returns ``(bucket, assumptions, types)`` normalized for the manifest (in
    parameter declaration order; None where absent) and the variant's
    effective type of every call parameter.
    """
    param_types = dict(kernel.params)
    call_params = [name for name, t in kernel.params if t != "constexpr"]

    bucket = variant.bucket
    if bucket is not None:
        if buckets is None:
            raise ValueError(f"{where}: field 'bucket' {list(bucket)!r} but the kernel "
                             f"has no buckets")
        if isinstance(bucket, (str, bytes)) or not isinstance(bucket, Sequence) \
                or len(bucket) != len(buckets):
            raise ValueError(f"{where}: bucket {bucket!r} must list one index per bucket "
                             f"dim ({len(buckets)})")
        for dim, (index, (param, edges)) in enumerate(zip(bucket, buckets)):
            if not _is_int(index) or not 0 <= index <= len(edges):
                raise ValueError(f"{where}: bucket[{dim}] = {index!r} is out of range for "
                                 f"'{param}' ({len(edges)} edges: indices 0..{len(edges)})")
        bucket = [int(index) for index in bucket]

    for field in ("assumptions", "types"):
        value = getattr(variant, field)
        if value is not None and not isinstance(value, Mapping):
            raise ValueError(f"{where}: {field} must be a {{param: ...}} mapping, got {value!r}")
    types = {}
    for param, new_type in dict(variant.types or {}).items():
        if param not in param_types or param_types[param] == "constexpr":
            raise ValueError(f"{where}: types: '{param}' is not a call parameter")
        if is_tensordesc(param_types[param]):
            declared = parse_tensordesc(param_types[param])
            if not is_tensordesc(new_type) or parse_tensordesc(new_type)[0] != declared[0] \
                    or len(parse_tensordesc(new_type)[1]) != len(declared[1]):
                raise ValueError(f"{where}: types: '{param}' -> {new_type!r} must be a "
                                 f"tensordesc type of the element type and rank of "
                                 f"{param_types[param]}")
            types[param] = new_type
            continue
        if param_types[param] not in INTEGER_TYPES:
            raise ValueError(f"{where}: types: parameter '{param}' is "
                             f"{param_types[param]}; only integer parameters may be retyped")
        if new_type not in INTEGER_TYPES:
            raise ValueError(f"{where}: types: '{param}' -> {new_type!r} is not an integer "
                             f"type {INTEGER_TYPES}")
        types[param] = new_type
    effective = {name: types.get(name, param_types[name]) for name in call_params}

    assumptions = {}
    for param, kinds in dict(variant.assumptions or {}).items():
        if param not in param_types or param_types[param] == "constexpr":
            raise ValueError(f"{where}: assumptions: '{param}' is not a call parameter")
        if isinstance(kinds, (str, bytes)) or not isinstance(kinds, Sequence) or not kinds:
            raise ValueError(f"{where}: assumptions: '{param}' needs a non-empty list of "
                             f"{ASSUMPTIONS}, got {kinds!r}")
        kinds = list(kinds)
        for kind in kinds:
            if kind not in ASSUMPTIONS:
                raise ValueError(f"{where}: assumptions: '{param}': unknown assumption "
                                 f"{kind!r} (known: {ASSUMPTIONS})")
            if kinds.count(kind) > 1:
                raise ValueError(f"{where}: assumptions: '{param}': '{kind}' listed twice")
        param_type = effective[param]
        is_pointer = bool(_POINTER_TYPE.fullmatch(param_type))
        if "div16" in kinds and not (is_pointer or param_type in INTEGER_TYPES):
            raise ValueError(f"{where}: assumptions: div16 on '{param}' of type {param_type}; "
                             f"div16 needs a pointer or integer parameter")
        if "eq1" in kinds and param_type not in INTEGER_TYPES:
            raise ValueError(f"{where}: assumptions: eq1 on '{param}' of type {param_type}; "
                             f"eq1 needs an integer parameter")
        if "div16" in kinds and "eq1" in kinds:
            raise ValueError(f"{where}: assumptions: '{param}' cannot be both div16 and eq1 "
                             f"(1 is not a multiple of 16)")
        assumptions[param] = [kind for kind in ASSUMPTIONS if kind in kinds]
    assumptions = {name: assumptions[name] for name in call_params if name in assumptions}
    types = {name: types[name] for name in call_params if name in types}
    return (bucket, assumptions or None, types or None), effective


def _variant_entry(kernel: Kernel, variant: Variant, relpath: str, buckets=None):
    """Return the variant's manifest entry and its dispatch key
    ``(name, bucket, assumptions, effective types)``."""
    where = f"kernel '{kernel.name}': variant '{variant.name}'"
    if not _VARIANT_NAME.fullmatch(variant.name):
        raise ValueError(f"{where}: name must match {_VARIANT_NAME.pattern}")
    (bucket, assumptions, types), effective = _check_dispatch_fields(
        kernel, variant, buckets, where)
    meta = variant.metadata
    missing = [field for field in _REQUIRED_METADATA if field not in meta]
    if missing:
        raise ValueError(f"{where}: metadata lacks {missing}")
    target = meta["target"]
    arch = target["arch"] if isinstance(target, Mapping) else target.arch
    if not isinstance(arch, int):
        raise ValueError(f"{where}: metadata target arch {arch!r} is not a CUDA compute capability")

    constexpr_names = [name for name, t in kernel.params if t == "constexpr"]
    if set(variant.constexprs) != set(constexpr_names):
        raise ValueError(f"{where}: constexprs {sorted(variant.constexprs)} do not match "
                         f"the constexpr parameters {constexpr_names}")
    for name, value in variant.constexprs.items():
        if not isinstance(value, (bool, int, float, str, type(None))):
            raise ValueError(f"{where}: constexpr '{name}' value {value!r} is not a JSON scalar")

    try:
        cubin = parse_cubin(variant.cubin)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    entry = meta["name"]
    if entry not in cubin.layouts:
        raise ValueError(f"{where}: entry '{entry}' not in cubin entries {list(cubin.entries)}")
    if cubin.arch != arch:
        raise ValueError(f"{where}: cubin is for sm_{cubin.arch}, metadata target is {arch}")

    entry_fields = {"name": variant.name}
    if bucket is not None:
        entry_fields["bucket"] = bucket
    if assumptions is not None:
        entry_fields["assumptions"] = assumptions
    if types is not None:
        entry_fields["types"] = types
    entry_fields.update({
        "cubin": relpath,
        "sha256": hashlib.sha256(variant.cubin).hexdigest(),
        "entry": entry,
        "arch": arch,
        "constexprs": {name: variant.constexprs[name] for name in constexpr_names},
        "num_warps": int(meta["num_warps"]),
        "num_ctas": int(meta["num_ctas"]),
    })
    if "num_stages" in meta:
        entry_fields["num_stages"] = int(meta["num_stages"])
    entry_fields.update({
        field: int(meta[field]) for field in (
            "shared", "global_scratch_size", "global_scratch_align",
            "profile_scratch_size", "profile_scratch_align")
    })
    entry_fields["launch_pdl"] = bool(meta["launch_pdl"])
    entry_fields["launch_cooperative_grid"] = bool(meta["launch_cooperative_grid"])
    eq1 = [name for name, kinds in (assumptions or {}).items() if "eq1" in kinds]
    descs = [name for name, t in kernel.params if is_tensordesc(t)]
    raw_meta = list(meta.get("tensordesc_meta") or [])
    if raw_meta and len(raw_meta) != len(descs):
        raise ValueError(f"{where}: metadata tensordesc_meta has {len(raw_meta)} entries for "
                         f"{len(descs)} tensordesc parameters {descs}")
    desc_meta = [tensordesc_meta_entry(m) for m in raw_meta] or [None] * len(descs)
    if any(m is not None for m in desc_meta):
        entry_fields["tensordesc_meta"] = desc_meta
    entry_fields["layout"] = _layout(kernel, cubin.layouts[entry], where, effective,
                                     eq1, types or {}, dict(zip(descs, desc_meta)))
    if "triton_version" in meta:
        entry_fields["triton_version"] = str(meta["triton_version"])
    return entry_fields, (variant.name, bucket, assumptions or {}, effective)


def _layout(kernel: Kernel, slots, where: str, effective=None, eq1=(), retyped=None,
            desc_meta=None):
    """Map the cubin's parameter slots to call parameters, then the hidden ones.

    Triton 3.6 passes the non-constexpr parameters in order followed by the
    global and profile scratch pointers, so anything else means the pack's
    parameter list does not describe this cubin.  ``effective`` maps call
    parameters to the variant's types (``types`` overrides applied); ``eq1``
    parameters were compiled away (Triton makes an integer equal to 1 a
    constexpr) and must have no slot; a tensordesc parameter has the slots of
    its parts (``desc_parts``), the TMA form where ``desc_meta`` has an entry.
    """
    if effective is None:
        effective = {name: t for name, t in kernel.params if t != "constexpr"}
    retyped = retyped or {}
    desc_meta = desc_meta or {}
    expected = []  # (name, size, part)
    for name, t in kernel.params:
        if t == "constexpr" or name in eq1:
            continue
        if is_tensordesc(t):
            rank = len(parse_tensordesc(effective[name])[1])
            expected += [(name, size, part) for part, size
                         in desc_parts(rank, desc_meta.get(name) is not None)]
        else:
            expected.append((name, slot_size(effective[name]), None))
    expected += [(name, POINTER_SIZE, None) for name in HIDDEN_PARAMS]
    if len(slots) != len(expected):
        if eq1 and len(slots) == len(expected) + len(eq1):
            raise ValueError(
                f"{where}: parameter(s) {list(eq1)} have an eq1 assumption but the cubin "
                f"still has a slot for them ({len(slots)} parameters): compile an eq1 "
                f"parameter as a constexpr 1 so that Triton drops it")
        dropped = f" - {len(eq1)} eq1" if eq1 else ""
        expanded = " (tensordesc parameters counted by their parts)" \
            if any(part for _, _, part in expected) else ""
        raise ValueError(
            f"{where}: cubin has {len(slots)} parameters, expected {len(expected) - 2} call "
            f"parameters{dropped}{expanded} + 2 hidden scratch pointers = {len(expected)}")
    layout = []
    for slot, (name, size, part) in zip(slots, expected):
        if slot.size != size:
            what = f"'{name}' part '{part}'" if part else f"'{name}'"
            how = (f"its type {effective[name]} (types override) needs" if name in retyped
                   else "its type needs")
            raise ValueError(f"{where}: cubin parameter {slot.ordinal} ({what}) is "
                             f"{slot.size} bytes, {how} {size}")
        layout.append({"param": name, "offset": slot.offset, "size": slot.size,
                       **({"part": part} if part else {})})
    return layout


def _check_dispatch_table(dispatch, buckets, where):
    """Check the table limits, that no variant is a duplicate of another and that
    every bucket has a variant.

    Properties (docs/pack-format.md): one per (parameter, div16) and
    (parameter, eq1) used by any variant, plus one per integer type of a
    parameter whose type differs between variants.
    """
    properties = set()
    for _, _, assumptions, _ in dispatch:
        for param, kinds in assumptions.items():
            properties.update((kind, param) for kind in kinds)
    for param in dispatch[0][3]:
        seen_types = {effective[param] for _, _, _, effective in dispatch}
        if len(seen_types) > 1:
            properties.update(("type", param, t) for t in seen_types)
    count = 1
    for _, edges in buckets or ():
        count *= len(edges) + 1
    if len(properties) > MAX_PROPERTIES:
        raise ValueError(f"{where}: depends on {len(properties)} argument properties, at most "
                         f"{MAX_PROPERTIES} allowed: {sorted(map(str, properties))}")
    pairs = sum(count if bucket is None else 1 for _, bucket, _, _ in dispatch)
    if pairs > MAX_CANDIDATES:
        raise ValueError(f"{where}: {len(dispatch)} variants over {count} buckets make {pairs} "
                         f"(bucket, variant) pairs, more than the {MAX_CANDIDATES} allowed")
    seen = {}
    for name, bucket, assumptions, effective in dispatch:
        key = (None if bucket is None else tuple(bucket),
               tuple(sorted((p, tuple(k)) for p, k in assumptions.items())),
               tuple(sorted(effective.items())))
        if key in seen:
            raise ValueError(f"{where}: variant '{name}' has the same bucket, assumptions and "
                             f"types as variant '{seen[key]}', so it would never be chosen")
        seen[key] = name
    served = {tuple(bucket) for _, bucket, _, _ in dispatch if bucket is not None}
    if buckets is not None and not any(bucket is None for _, bucket, _, _ in dispatch):
        for index in itertools.product(*[range(len(edges) + 1) for _, edges in buckets]):
            if index not in served:
                raise ValueError(f"{where}: no variant serves bucket {list(index)} "
                                 f"({describe_bucket_index(buckets, index)}); every bucket "
                                 f"needs a variant")


def describe_bucket_index(buckets, index) -> str:
    """``17 <= M <= 64, N >= 4097`` style text for a bucket of ``[(param, edges)]`` dims
    (inclusive upper edges, docs/pack-format.md), one index per dim.

    The rule is the runtime's, kpack::DescribeBucket (include/kpack/pack.h), called
    through the extension where the kpack package is installed (pip install, as the
    kpack-build and kpack-record commands are). The tools also run from a checkout without
    it (``PYTHONPATH=tools``, the GPU checks): there this copy of the rule answers, and
    tools/tests/test_bucket_text.py holds it to the extension's."""
    dims = [(param, list(edges)) for param, edges in buckets]
    native = _native_describe_bucket()
    if native is not None:
        return native(dims, list(index))
    if not dims:
        return "no buckets"
    if not list(index):
        return "every bucket"
    parts = []
    for (param, edges), i in zip(dims, index):
        lo = None if i == 0 or i > len(edges) else min(edges[i - 1] + 1, 2**63 - 1)
        hi = edges[i] if i < len(edges) else None
        parts.append(f"{param} in no bucket (index {i} of {len(edges) + 1})" if i > len(edges)
                     else f"{param} <= {hi}" if lo is None else
                     f"{param} >= {lo}" if hi is None else f"{lo} <= {param} <= {hi}")
    return ", ".join(parts)


def _native_describe_bucket():
    """kpack._kpack.describe_bucket, or None where the extension is not installed."""
    try:
        from kpack._kpack import describe_bucket  # noqa: PLC0415 (optional dependency)
    except ImportError:
        return None
    return describe_bucket


# ---------------------------------------------------------------------------
# Grid expressions
# ---------------------------------------------------------------------------

_GRID_TOKEN = re.compile(r"\s*(?:([0-9]+)|([A-Za-z_][A-Za-z0-9_]*)|(\S))")


def parse_grid_expression(text: str):
    """Parse a grid expression into a tree of tuples.

    Grammar (docs/pack-format.md): ``expr := term (('+'|'-') term)*``,
    ``term := factor (('*'|'/') factor)*``, ``factor := INT | NAME | '(' expr ')'
    | ('cdiv'|'min'|'max') '(' expr ',' expr ')'``.  No unary minus.  Nodes:
    ``("int", v)``, ``("name", s)``, ``(op, lhs, rhs)`` for ``+ - * /`` and
    ``("cdiv"|"min"|"max", a, b)``.  Raises ValueError on a syntax error.
    """
    if not isinstance(text, str):
        raise ValueError(f"not a string: {text!r}")
    tokens = []
    pos = 0
    while True:
        match = _GRID_TOKEN.match(text, pos)
        if match is None:
            break
        number, name, other = match.groups()
        if other is not None and other not in "+-*/(),":
            raise ValueError(f"unexpected character {other!r} at column {match.start(3)}")
        tokens.append(("int", int(number)) if number is not None else
                      ("name", name) if name is not None else (other, None))
        pos = match.end()
    if text[pos:].strip():
        raise ValueError(f"unexpected character {text[pos:].strip()[0]!r}")
    tokens.append(("end", None))
    index = 0

    def peek():
        return tokens[index][0]

    def take(kind):
        nonlocal index
        token = tokens[index]
        if token[0] != kind:
            found = "end of expression" if token[0] == "end" else repr(token[1] or token[0])
            raise ValueError(f"expected {kind!r}, found {found}")
        index += 1
        return token

    def expr():
        node = term()
        while peek() in ("+", "-"):
            op = take(peek())[0]
            node = (op, node, term())
        return node

    def term():
        node = factor()
        while peek() in ("*", "/"):
            op = take(peek())[0]
            node = (op, node, factor())
        return node

    def factor():
        kind, value = tokens[index]
        if kind == "int":
            take("int")
            if value > INT64_MAX:
                raise ValueError(f"integer literal {value} does not fit in 64 bits")
            return ("int", value)
        if kind == "name":
            take("name")
            if peek() == "(":
                if value not in GRID_FUNCTIONS:
                    raise ValueError(f"unknown function '{value}' (known: {GRID_FUNCTIONS})")
                take("(")
                a = expr()
                take(",")
                b = expr()
                take(")")
                return (value, a, b)
            return ("name", value)
        if kind == "(":
            take("(")
            node = expr()
            take(")")
            return node
        found = "end of expression" if kind == "end" else repr(value if value is not None else kind)
        raise ValueError(f"expected a number, a name or '(', found {found}")

    if peek() == "end":
        raise ValueError("empty expression")
    tree = expr()
    if peek() != "end":
        kind, value = tokens[index]
        raise ValueError(f"unexpected {value if value is not None else kind!r} after a "
                         f"complete expression")
    return tree


def _checked(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise OverflowError("64-bit overflow")
    return value


def _truncating_div(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero")
    quotient = abs(a) // abs(b)
    return _checked(-quotient if (a < 0) != (b < 0) else quotient)


def _apply(op: str, a: int, b: int) -> int:
    if op == "+":
        return _checked(a + b)
    if op == "-":
        return _checked(a - b)
    if op == "*":
        return _checked(a * b)
    if op == "/":
        return _truncating_div(a, b)
    if op == "cdiv":  # Triton's cdiv: (a + b - 1) / b
        if b == 0:
            raise ZeroDivisionError("division by zero")
        return _truncating_div(_checked(_checked(a + b) - 1), b)
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    raise AssertionError(op)


def evaluate_grid_expression(tree, values: Mapping[str, int]):
    """Evaluate a parsed expression in 64-bit arithmetic, the way the runtime
    does per launch; a name missing from ``values`` makes the result None
    (used for constant folding).  Raises OverflowError / ZeroDivisionError."""
    kind = tree[0]
    if kind == "int":
        return tree[1]
    if kind == "name":
        return values.get(tree[1])
    a = evaluate_grid_expression(tree[1], values)
    b = evaluate_grid_expression(tree[2], values)
    if b == 0 and kind in ("/", "cdiv"):
        raise ZeroDivisionError("division by zero")
    if a is None or b is None:
        return None
    return _apply(kind, a, b)


def grid_names(tree):
    """The names an expression uses, in order of first use."""
    if tree[0] == "int":
        return []
    if tree[0] == "name":
        return [tree[1]]
    names = grid_names(tree[1])
    return names + [n for n in grid_names(tree[2]) if n not in names]


def check_grid_expression(text: str, param_types: Mapping[str, str],
                          constexprs: Mapping[str, Any], where: str):
    """Check one grid expression for one variant, as ``Runtime::Open`` does:
    syntax, names (integer call parameters or the variant's integer
    constexprs), and constant folding (every sub-expression that depends
    only on literals and constexprs must not overflow or divide by zero).
    Returns the parsed tree."""
    try:
        tree = parse_grid_expression(text)
    except ValueError as err:
        raise ValueError(f"{where}: {text!r}: syntax error: {err}") from None
    for name in grid_names(tree):
        if name in constexprs:
            value = constexprs[name]
            if not _is_int(value):
                raise ValueError(f"{where}: {text!r}: constexpr '{name}' = {value!r} is not "
                                 f"an integer")
        elif name in param_types:
            if param_types[name] not in INTEGER_TYPES:
                raise ValueError(f"{where}: {text!r}: parameter '{name}' is "
                                 f"{param_types[name]}, not an integer call parameter")
        else:
            raise ValueError(f"{where}: {text!r}: unknown name '{name}'")
    folding = {name: value for name, value in constexprs.items() if _is_int(value)}

    def fold(node):
        if node[0] in ("int", "name"):
            return
        fold(node[1])
        fold(node[2])
        try:
            evaluate_grid_expression(node, folding)
        except (OverflowError, ZeroDivisionError) as err:
            raise ValueError(f"{where}: {text!r}: {err} while folding constants") from None

    fold(tree)
    return tree
