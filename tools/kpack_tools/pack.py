"""Write ``kpack/1`` and ``kpack/2`` pack directories (see ``docs/pack-format.md``): the
``Kernel`` and ``Variant`` a builder describes, the manifest entry of each, and the
directory written atomically (``write_pack``).

The runtime refuses a pack on any inconsistency, so this writer checks what it
can at build time and fails loudly instead of writing a pack that would only
fail at ``Runtime::Open`` on a GPU machine.  In particular every variant's
``layout`` is read back from its cubin (``kpack_tools.cubin``) rather than
derived from the Python signature: ptxas, not Triton, decides the offsets.
The rules live beside it: parameter types and tensor descriptors in
``kpack_tools.param_types``, dispatch fields (buckets, assumptions, ``types``,
the dispatch table's limits) in ``kpack_tools.pack_dispatch``, grid expressions
in ``kpack_tools.grid_expr``; this module owns the kernel-level fields
(``source``, ``readonly``, ``autotune_key``, ``grid_tolerance``), each
variant's metadata and layout, and the file layout of the pack.

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
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Tuple

from kpack_tools.cubin import parse_cubin
from kpack_tools.grid_expr import check_grid_expression, check_grid_shape
from kpack_tools.pack_dispatch import (check_buckets, check_dispatch_fields,
                                       check_dispatch_table)
from kpack_tools.param_types import (HIDDEN_PARAMS, INT64_MAX, POINTER_SIZE, POINTER_TYPE,
                                     desc_parts, is_int, is_tensordesc, parse_tensordesc,
                                     slot_size, tensordesc_meta_entry)

FORMAT = "kpack/1"
FORMAT_2 = "kpack/2"

_KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
# Variant names become file names, so they are kept to a path-safe alphabet.
_VARIANT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
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
    buckets = check_buckets(kernel.buckets, param_types, where)
    grid = check_grid_shape(kernel.grid, where)

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
    check_dispatch_table([(name, bucket, assumptions,
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
            if not is_int(value) or not last_edge[param] < value <= INT64_MAX:
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
        if not POINTER_TYPE.fullmatch(types.get(name, "")):
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
    buckets = check_buckets(kernel.buckets, param_types, where)
    entry, _ = _variant_entry(kernel, variant, f"cubins/{kernel.name}/{variant.name}.cubin",
                              buckets)
    for axis, expr in enumerate(check_grid_shape(kernel.grid, where) or ()):
        check_grid_expression(expr, param_types, entry["constexprs"],
                              f"{where}: variant '{variant.name}': grid[{axis}]")



def _variant_entry(kernel: Kernel, variant: Variant, relpath: str, buckets=None):
    """Return the variant's manifest entry and its dispatch key
    ``(name, bucket, assumptions, effective types)``."""
    where = f"kernel '{kernel.name}': variant '{variant.name}'"
    if not _VARIANT_NAME.fullmatch(variant.name):
        raise ValueError(f"{where}: name must match {_VARIANT_NAME.pattern}")
    (bucket, assumptions, types), effective = check_dispatch_fields(
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

