"""A test-side validator for ``kpack/1``/``kpack/2`` manifests, and a reference variant chooser.

Both re-implement docs/pack-format.md independently of ``kpack_tools.pack``
(grid expressions are checked with Python's ``ast`` module, not the writer's
parser), so a writer bug cannot hide behind itself.
"""

import ast
import hashlib
import itertools
import os
import re
import subprocess
from pathlib import Path

import triton

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"

SLOT_SIZES = {
    "i1": 1, "u1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "fp16": 2, "bf16": 2,
    "i32": 4, "u32": 4, "fp32": 4, "i64": 8, "u64": 8, "fp64": 8,
}
# (low, high) inclusive ranges of the integer types dispatch knows.
INT_RANGES = {
    "i8": (-2**7, 2**7 - 1), "i16": (-2**15, 2**15 - 1), "i32": (-2**31, 2**31 - 1),
    "i64": (-2**63, 2**63 - 1), "u8": (0, 2**8 - 1), "u16": (0, 2**16 - 1),
    "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1),
}
HIDDEN = ("$global_scratch", "$profile_scratch")
KERNEL_REQUIRED = {"name", "params", "variants"}
KERNEL_OPTIONAL = {"buckets", "grid"}
KERNEL_OPTIONAL_V2 = {"source", "autotune_key", "grid_tolerance"}
VARIANT_REQUIRED = {
    "name", "cubin", "sha256", "entry", "arch", "constexprs", "num_warps", "num_ctas",
    "shared", "global_scratch_size", "global_scratch_align", "profile_scratch_size",
    "profile_scratch_align", "launch_pdl", "launch_cooperative_grid", "layout",
}
VARIANT_OPTIONAL = {"num_stages", "triton_version", "bucket", "assumptions", "types"}
VARIANT_OPTIONAL_V2 = {"tensordesc_meta"}
# kpack/2 tensor descriptors, re-derived here from Triton 3.6's launcher (driver.py).
TENSORDESC = re.compile(r"tensordesc<(fp8e4nv|fp8e5|fp8e4b15|fp8e4b8|fp8e5b16|[iu](?:1|8|16|32|64)"
                        r"|fp16|bf16|fp32|fp64)\[(\d+(?:, \d+){0,4})\]>")
DESC_META_KEYS = {"data_type", "elem_size", "swizzle", "block_size", "fp4_padded"}
DESC_META_OPTIONAL = {"element_strides", "interleave", "l2_promotion"}


def _is_int(value):
    return type(value) is int  # bool is an int subclass, and not an integer field


def _is_pointer(param_type):
    return bool(re.fullmatch(r"\*[A-Za-z0-9_]+", param_type))


def _type_size(param_type):
    if _is_pointer(param_type):
        return 8
    return SLOT_SIZES.get(param_type)


def _desc(param_type):
    """``(dtype, rank)`` of a tensordesc type, else None."""
    match = TENSORDESC.fullmatch(param_type)
    return (match.group(1), match.group(2).count(",") + 1) if match else None


def _desc_slots(name, rank, tma):
    """``[(param, part, size)]``: Triton's expansion of a descriptor argument."""
    if tma:
        head = [(name, "tma", 128)]
    else:
        head = [(name, "base", 8)] + [(name, f"base_shape[{i}]", 8) for i in range(rank)] + \
            [(name, f"base_strides[{i}]", 8) for i in range(rank)] + [(name, "padding", 1)]
    return head + [(name, f"shape[{i}]", 4) for i in range(rank)] + \
        [(name, f"strides[{i}]", 8) for i in range(rank)]


def validate_manifest(manifest, pack_dir):
    """Return the list of docs/pack-format.md rule violations (empty if valid)."""
    errors = []
    pack_dir = Path(pack_dir).resolve()
    unknown = set(manifest) - {"format", "generator", "kernels"}
    if unknown:
        errors.append(f"unknown top-level fields {sorted(unknown)}")
    if manifest.get("format") not in ("kpack/1", "kpack/2"):
        errors.append("format is neither kpack/1 nor kpack/2")
    version_2 = manifest.get("format") == "kpack/2"
    if "generator" in manifest and not isinstance(manifest["generator"], str):
        errors.append("generator is not a string")
    kernels = manifest.get("kernels")
    if not isinstance(kernels, list) or not kernels:
        return errors + ["kernels must be a non-empty array"]
    names = [k.get("name") for k in kernels]
    if len(set(names)) != len(names):
        errors.append(f"duplicate kernel names {names}")
    for kernel in kernels:
        errors += _validate_kernel(kernel, pack_dir, version_2)
    return errors


def _validate_kernel(kernel, pack_dir, version_2=False):
    where = f"kernel {kernel.get('name')!r}"
    optional = KERNEL_OPTIONAL | (KERNEL_OPTIONAL_V2 if version_2 else set())
    if not KERNEL_REQUIRED <= set(kernel) or set(kernel) - KERNEL_REQUIRED - optional:
        return [f"{where}: fields {sorted(kernel)}"]
    errors = []
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", kernel["name"]):
        errors.append(f"{where}: bad name")
    params = kernel["params"]
    for param in params:
        allowed = {"name", "type", "readonly"} if version_2 else {"name", "type"}
        if not {"name", "type"} <= set(param) or set(param) - allowed:
            errors.append(f"{where}: param fields {sorted(param)}")
        elif "." in param["name"] and not (version_2 and re.fullmatch(
                r"[A-Za-z_][A-Za-z0-9_]*(\.\d+)+", param["name"])):
            errors.append(f"{where}: param name {param['name']!r}")
        elif param["type"] != "constexpr" and _type_size(param["type"]) is None \
                and not (version_2 and _desc(param["type"])):
            errors.append(f"{where}: param {param['name']!r} has bad type {param['type']!r}")
        elif "readonly" in param and (not isinstance(param["readonly"], bool)
                                      or (param["readonly"] and not _is_pointer(param["type"]))):
            errors.append(f"{where}: param {param['name']!r}: bad readonly")
    param_names = [p.get("name") for p in params]
    if len(set(param_names)) != len(param_names):
        errors.append(f"{where}: duplicate param names")
    source = kernel.get("source")
    if source is not None and (not isinstance(source, dict)
                               or set(source) != {"qualname", "sha256"}
                               or not isinstance(source["qualname"], str)
                               or not source["qualname"]
                               or not re.fullmatch(r"[0-9a-f]{64}", str(source["sha256"]))):
        errors.append(f"{where}: bad source {source!r}")
    key = kernel.get("autotune_key")
    if key is not None and (not isinstance(key, list) or not key
                            or len(set(key)) != len(key) or not set(key) <= set(param_names)):
        errors.append(f"{where}: bad autotune_key {key!r}")
    if errors:
        return errors
    types = {p["name"]: p["type"] for p in params}
    dims = kernel.get("buckets")
    if dims is not None:
        errors += _validate_buckets(dims, types, where)
    tolerance = kernel.get("grid_tolerance")
    if tolerance is not None:
        last = {d.get("param"): (d.get("edges") or [None])[-1] for d in dims or []}
        if not isinstance(tolerance, dict) or tolerance.get("proof") not in ("gpu", "asserted") \
                or set(tolerance) - {"proof", "max"} \
                or not isinstance(tolerance.get("max", {}), dict) \
                or any(p not in last or not _is_int(v) or not _is_int(last[p]) or v <= last[p]
                       for p, v in tolerance.get("max", {}).items()):
            errors.append(f"{where}: bad grid_tolerance {tolerance!r}")
    grid = kernel.get("grid")
    if grid is not None and (not isinstance(grid, list) or not 1 <= len(grid) <= 3
                             or not all(isinstance(e, str) for e in grid)):
        errors.append(f"{where}: grid must be 1-3 strings")
        grid = None
    variants = kernel["variants"]
    if not isinstance(variants, list) or not variants:
        return errors + [f"{where}: variants must be a non-empty array"]
    variant_names = [v.get("name") for v in variants]
    if len(set(variant_names)) != len(variant_names):
        errors.append(f"{where}: duplicate variant names {variant_names}")
    if errors:
        return errors
    if dims is not None and not errors and all("bucket" in v for v in variants):
        served = {tuple(v["bucket"]) for v in variants}
        for index in itertools.product(*[range(len(d["edges"]) + 1) for d in dims]):
            if index not in served:
                errors.append(f"{where}: no variant serves bucket {list(index)}")
    for variant in variants:
        vwhere = f"{where}: variant {variant.get('name')!r}"
        errors += _validate_variant(variant, params, pack_dir, vwhere, version_2)
        errors += _validate_dispatch(variant, types, dims, vwhere)
        for axis, expr in enumerate(grid or ()):
            errors += _validate_grid(expr, types, variant.get("constexprs", {}),
                                     f"{vwhere}: grid[{axis}]")
    return errors


def _validate_buckets(dims, types, where):
    if not isinstance(dims, list) or not dims:
        return [f"{where}: buckets must be a non-empty array"]
    errors = []
    for i, dim in enumerate(dims):
        if not isinstance(dim, dict) or set(dim) != {"param", "edges"}:
            errors.append(f"{where}: buckets[{i}] fields")
            continue
        if types.get(dim["param"]) not in INT_RANGES:
            errors.append(f"{where}: buckets[{i}] param {dim['param']!r} is not an integer")
        edges = dim["edges"]
        if not isinstance(edges, list) or not edges or not all(_is_int(e) for e in edges):
            errors.append(f"{where}: buckets[{i}].edges must be a non-empty integer array")
        elif any(a >= b for a, b in zip(edges, edges[1:])):
            errors.append(f"{where}: buckets[{i}].edges not strictly increasing")
    return errors


def _validate_dispatch(variant, types, dims, where):
    errors = []
    bucket = variant.get("bucket")
    if bucket is not None:
        if dims is None:
            errors.append(f"{where}: bucket without kernel buckets")
        elif not isinstance(bucket, list) or len(bucket) != len(dims):
            errors.append(f"{where}: bucket {bucket!r} has the wrong length")
        else:
            for index, dim in zip(bucket, dims):
                if not _is_int(index) or not 0 <= index <= len(dim["edges"]):
                    errors.append(f"{where}: bucket index {index!r} out of range")
    effective = effective_types(variant, types)
    for name, new_type in variant.get("types", {}).items():
        declared = _desc(types.get(name, ""))
        if declared is not None and _desc(new_type) == declared:
            continue  # another block shape of the same element type and rank
        if types.get(name) not in INT_RANGES or new_type not in INT_RANGES:
            errors.append(f"{where}: types {name!r}: {types.get(name)} -> {new_type}")
    for name, kinds in variant.get("assumptions", {}).items():
        param_type = effective.get(name)
        if param_type is None or not isinstance(kinds, list) or not kinds \
                or len(set(kinds)) != len(kinds) or not set(kinds) <= {"div16", "eq1"}:
            errors.append(f"{where}: assumptions {name!r}: {kinds!r}")
            continue
        if "div16" in kinds and not (_is_pointer(param_type) or param_type in INT_RANGES):
            errors.append(f"{where}: div16 on {param_type} {name!r}")
        if "eq1" in kinds and param_type not in INT_RANGES:
            errors.append(f"{where}: eq1 on {param_type} {name!r}")
        if "div16" in kinds and "eq1" in kinds:
            errors.append(f"{where}: both div16 and eq1 on {name!r}")
    return errors


def _validate_grid(expr, types, constexprs, where):
    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError as err:
        return [f"{where}: {expr!r}: {err}"]
    errors = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
                errors.append(f"{where}: operator {type(node.op).__name__}")
            if isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant) \
                    and node.right.value == 0:
                errors.append(f"{where}: division by literal zero")
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in ("cdiv", "min", "max") \
                    or len(node.args) != 2 or node.keywords:
                errors.append(f"{where}: bad call")
            elif node.func.id == "cdiv" and isinstance(node.args[1], ast.Constant) \
                    and node.args[1].value == 0:
                errors.append(f"{where}: cdiv by literal zero")
        elif isinstance(node, ast.Name):
            if node.id in ("cdiv", "min", "max"):
                continue
            if node.id in constexprs:
                if not _is_int(constexprs[node.id]):
                    errors.append(f"{where}: constexpr {node.id!r} is not an integer")
            elif types.get(node.id) not in INT_RANGES:
                errors.append(f"{where}: name {node.id!r} is not an integer call parameter")
        elif isinstance(node, ast.Constant):
            if not _is_int(node.value):
                errors.append(f"{where}: literal {node.value!r}")
        elif not isinstance(node, (ast.Load, ast.operator)):
            errors.append(f"{where}: {type(node).__name__} not allowed")
    return errors


def effective_types(variant, types):
    """A variant's type of every call parameter, ``types`` overrides applied."""
    effective = {name: t for name, t in types.items() if t != "constexpr"}
    effective.update({k: v for k, v in variant.get("types", {}).items() if k in effective})
    return effective


def eq1_params(variant):
    return [name for name, kinds in variant.get("assumptions", {}).items() if "eq1" in kinds]


def _validate_variant(variant, params, pack_dir, where, version_2=False):
    fields = set(variant)
    optional = VARIANT_OPTIONAL | (VARIANT_OPTIONAL_V2 if version_2 else set())
    if not VARIANT_REQUIRED <= fields or fields - VARIANT_REQUIRED - optional:
        return [f"{where}: fields {sorted(fields)}"]
    errors = []
    cubin = variant["cubin"]
    if os.path.isabs(cubin) or ".." in Path(cubin).parts:
        errors.append(f"{where}: cubin path {cubin!r} not relative inside the pack")
    path = (pack_dir / cubin).resolve()
    if pack_dir not in path.parents or not path.is_file():
        errors.append(f"{where}: cubin {cubin!r} missing or outside the pack")
    elif hashlib.sha256(path.read_bytes()).hexdigest() != variant["sha256"]:
        errors.append(f"{where}: sha256 mismatch")
    if not re.fullmatch(r"[0-9a-f]{64}", variant["sha256"]):
        errors.append(f"{where}: sha256 is not 64 lowercase hex digits")
    for field in ("name", "entry"):
        if not isinstance(variant[field], str):
            errors.append(f"{where}: {field} is not a string")
    ranges = {"arch": (0, None), "num_warps": (1, 32), "num_ctas": (1, 16),
              "shared": (0, 1 << 20), "global_scratch_size": (0, None),
              "profile_scratch_size": (0, None), "global_scratch_align": (1, 4096),
              "profile_scratch_align": (1, 4096)}
    for field, (low, high) in ranges.items():
        value = variant[field]
        if not _is_int(value) or value < low or (high is not None and value > high):
            errors.append(f"{where}: {field} = {value!r} out of range")
    for field in ("global_scratch_align", "profile_scratch_align"):
        if _is_int(variant[field]) and variant[field] & (variant[field] - 1):
            errors.append(f"{where}: {field} is not a power of two")
    for field in ("launch_pdl", "launch_cooperative_grid"):
        if not isinstance(variant[field], bool):
            errors.append(f"{where}: {field} is not a bool")
    if "num_stages" in variant and not _is_int(variant["num_stages"]):
        errors.append(f"{where}: num_stages is not an integer")
    if "triton_version" in variant and not isinstance(variant["triton_version"], str):
        errors.append(f"{where}: triton_version is not a string")
    for field in ("assumptions", "types"):
        if field in variant and not isinstance(variant[field], dict):
            return errors + [f"{where}: {field} is not an object"]
    constexpr_names = {p["name"] for p in params if p["type"] == "constexpr"}
    constexprs = variant["constexprs"]
    if not isinstance(constexprs, dict) or set(constexprs) != constexpr_names:
        errors.append(f"{where}: constexprs do not match the constexpr params")
    elif not all(isinstance(v, (bool, int, float, str, type(None))) for v in constexprs.values()):
        errors.append(f"{where}: constexpr values must be scalars")
    return errors + _validate_layout(variant, params, where)


def _desc_meta(variant, descs, where, errors):
    """{descriptor: its tensordesc_meta entry or None}, checking the entries' fields;
    ``descs`` maps each descriptor to the variant's type of it."""
    meta = variant.get("tensordesc_meta")
    if meta is None:
        return {name: None for name in descs}
    if not isinstance(meta, list) or len(meta) != len(descs):
        errors.append(f"{where}: tensordesc_meta needs {len(descs)} entries")
        return {name: None for name in descs}
    for name, entry in zip(descs, meta):
        if entry is None:
            continue
        rank = _desc(descs[name])[1]
        if not isinstance(entry, dict) or not DESC_META_KEYS <= set(entry) \
                or set(entry) - DESC_META_KEYS - DESC_META_OPTIONAL:
            errors.append(f"{where}: tensordesc_meta entry of {name!r}: fields {entry!r}")
        elif not (_is_int(entry["data_type"]) and 0 <= entry["data_type"] <= 15
                  and entry["elem_size"] in (1, 2, 4, 8) and entry["swizzle"] in (0, 1, 2, 3)
                  and isinstance(entry["fp4_padded"], bool)
                  and isinstance(entry["block_size"], list) and len(entry["block_size"]) == rank
                  and all(_is_int(b) and 1 <= b <= 256 for b in entry["block_size"])):
            errors.append(f"{where}: tensordesc_meta entry of {name!r}: values {entry!r}")
    return dict(zip(descs, meta))


def _validate_layout(variant, params, where):
    types = {p["name"]: p["type"] for p in params}
    effective = effective_types(variant, types)
    dropped = set(eq1_params(variant))
    errors = []
    descs = {name: t for name, t in effective.items() if _desc(t)}
    meta = _desc_meta(variant, descs, where, errors)
    # The slots every call parameter should have, in order (a descriptor: its parts).
    want = []
    for name, t in effective.items():
        if name in dropped:
            continue
        if name in descs:
            want += _desc_slots(name, _desc(t)[1], meta[name] is not None)
        else:
            want.append((name, None, _type_size(t)))
    want += [(name, None, 8) for name in HIDDEN]
    got = [(s.get("param"), s.get("part"), s.get("size")) for s in variant["layout"]]
    if got != want:
        errors.append(f"{where}: layout (param, part, size) {got} != {want}")
    tma = [s["offset"] for s in variant["layout"] if s.get("part") == "tma"]
    if any(o % 16 for o in tma) or len({o % 64 for o in tma}) > 1:
        errors.append(f"{where}: CUtensorMap slots at {tma}: not 16-aligned with one "
                      f"offset modulo 64")
    sizes = {name: _type_size(t) for name, t in effective.items()}
    sizes.update({name: 8 for name in HIDDEN})
    end = 0
    seen = []
    for i, slot in enumerate(variant["layout"]):
        if slot.get("part") is not None:
            if slot["offset"] < end:
                errors.append(f"{where}: layout[{i}] overlaps or is out of order")
            end = slot["offset"] + slot["size"]
            if slot["part"] == "tma":
                seen.append(slot["param"])
            elif slot["part"] == "base" or slot["offset"] % slot["size"]:
                seen += [slot["param"]] if slot["part"] == "base" else []
                if slot["offset"] % slot["size"]:
                    errors.append(f"{where}: layout[{i}] offset not aligned")
            continue
        if set(slot) != {"param", "offset", "size"}:
            errors.append(f"{where}: layout[{i}] fields {sorted(slot)}")
            continue
        name, offset, size = slot["param"], slot["offset"], slot["size"]
        if name not in sizes:
            errors.append(f"{where}: layout[{i}] names unknown param {name!r}")
            continue
        seen.append(name)
        if not _is_int(offset) or not _is_int(size) or size != sizes[name]:
            errors.append(f"{where}: layout[{i}].size {size!r} != {sizes[name]} for {name!r}")
            continue
        if offset < end:
            errors.append(f"{where}: layout[{i}] overlaps or is out of order")
        if offset % size:
            errors.append(f"{where}: layout[{i}] offset {offset} not aligned to {size}")
        end = offset + size
    if end > 4096:
        errors.append(f"{where}: parameter buffer ends at {end} > 4096")
    call_params = [n for n in effective if n not in dropped]
    if sorted(n for n in seen if n not in HIDDEN) != sorted(call_params):
        errors.append(f"{where}: call params in layout {seen} != {call_params} "
                      f"(eq1: {sorted(dropped)})")
    for name in HIDDEN:
        if seen.count(name) > 1:
            errors.append(f"{where}: {name} appears {seen.count(name)} times")
    return errors


def cuobjdump_slots(path, entry):
    """``[(ordinal, offset, size)]`` of ``entry``'s KPARAM_INFO as cuobjdump prints them."""
    dump = subprocess.run([str(CUOBJDUMP), "-elf", str(path)], check=True,
                          capture_output=True, text=True).stdout
    assert "sm=90a" in dump.splitlines()[1]
    section = dump.split(f".nv.info.{entry}", 1)[1]
    records = re.findall(r"Ordinal\s*:\s*(0x[0-9a-f]+)\s+Offset\s*:\s*(0x[0-9a-f]+)\s+"
                         r"Size\s*:\s*(0x[0-9a-f]+)", section)
    return sorted(tuple(int(v, 16) for v in record) for record in records)


# ---------------------------------------------------------------------------
# Reference variant choice (docs/pack-format.md, "Choosing a variant")
# ---------------------------------------------------------------------------

_TYPE_RANK = {"i8": 0, "u8": 1, "i16": 2, "u16": 3, "i32": 4, "u32": 5, "i64": 6, "u64": 7}


def bucket_of(kernel, args):
    """The bucket tuple of ``args`` ({param: value}); () without buckets."""
    return tuple(sum(1 for edge in dim["edges"] if args[dim["param"]] > edge)
                 for dim in kernel.get("buckets", ()))


def holds(variant, types, args):
    """Whether ``variant``'s assumptions and integer types hold for ``args``
    (pointers given as integer addresses)."""
    effective = effective_types(variant, types)
    for name, param_type in effective.items():
        if param_type in INT_RANGES:
            low, high = INT_RANGES[param_type]
            if not low <= args[name] <= high:
                return False
    for name, kinds in variant.get("assumptions", {}).items():
        if "div16" in kinds and args[name] % 16:
            return False
        if "eq1" in kinds and args[name] != 1:
            return False
    return True


def choose_variant(kernel, args):
    """The variant the runtime must pick for ``args``, or None."""
    types = {p["name"]: p["type"] for p in kernel["params"]}
    bucket = bucket_of(kernel, args)
    valid = []
    for index, variant in enumerate(kernel["variants"]):
        if "bucket" in variant and tuple(variant["bucket"]) != bucket:
            continue
        if not holds(variant, types, args):
            continue
        effective = effective_types(variant, types)
        assumptions = sum(len(k) for k in variant.get("assumptions", {}).values())
        width = sorted((_TYPE_RANK[t] for t in effective.values() if t in _TYPE_RANK),
                       reverse=True)
        valid.append((-assumptions, width, index, variant))
    return min(valid, key=lambda v: v[:3])[3] if valid else None
