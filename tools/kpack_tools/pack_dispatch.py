"""The dispatch part of a pack kernel (``docs/pack-format.md``, "Dispatch: buckets,
specializations, grid expressions"), checked by the runtime's rules before a manifest is
written: bucket dims (``check_buckets``), a variant's ``bucket``, ``assumptions`` and
``types`` (``check_dispatch_fields``), and the dispatch table the runtime would build from
all variants (``check_dispatch_table``: its limits, duplicates, unserved buckets).
``describe_bucket_index`` words a bucket for messages.
"""

import itertools
from typing import Mapping, Sequence

from kpack_tools.param_types import (INT64_MAX, INT64_MIN, INTEGER_TYPES, POINTER_TYPE,
                                     is_int, is_tensordesc, parse_tensordesc)

ASSUMPTIONS = ("div16", "eq1")
# The runtime's dispatch limits (src/dispatch/dispatch.h): properties per kernel, buckets,
# and (bucket, variant) pairs, a variant without `bucket` counting once per bucket.
MAX_PROPERTIES = 256
MAX_BUCKETS = 4096
MAX_CANDIDATES = 1 << 20


def check_buckets(buckets, param_types, where):
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
            if not is_int(edge) or not INT64_MIN <= edge <= INT64_MAX:
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



def check_dispatch_fields(kernel, variant, buckets, where):
    """Validate a variant's (``kpack_tools.pack.Variant``) ``bucket``, ``assumptions``
    and ``types`` against its kernel (``kpack_tools.pack.Kernel``).

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
            if not is_int(index) or not 0 <= index <= len(edges):
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
        is_pointer = bool(POINTER_TYPE.fullmatch(param_type))
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


def check_dispatch_table(dispatch, buckets, where):
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
