"""Triton parameter types as a pack holds them (``docs/pack-format.md``, "Parameters" and
"Tensor descriptors"): the bytes of each slot a parameter takes in a cubin's parameter
buffer, the integer types dispatch works on, and host tensor descriptors
(``tensordesc<DTYPE[B0, ...]>``): their spelling, the slots Triton 3.6's launcher expands
them into (``desc_parts``) and the ``tensordesc_meta`` a variant carries
(``tensordesc_meta_entry``).  Pure functions of the type strings; the manifest writer
(``kpack_tools.pack``) and the spec builder use them.
"""

import re
from typing import Any, List, Mapping, Optional, Sequence, Tuple

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
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
POINTER_TYPE = re.compile(r"\*[A-Za-z0-9_]+")


def is_int(value) -> bool:
    """An int that is not a bool (JSON and Python agree on that only this way)."""
    return isinstance(value, int) and not isinstance(value, bool)


def slot_size(param_type: str) -> Optional[int]:
    """Bytes a parameter of this Triton type takes; None for ``constexpr``, 0 for a
    ``tensordesc``, which expands into several slots (``desc_parts``)."""
    if param_type == "constexpr":
        return None
    if POINTER_TYPE.fullmatch(param_type):
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


def is_tensor_descriptor(value) -> bool:
    """Whether a launch argument is a tensor descriptor (Triton's
    ``triton.tools.tensor_descriptor.TensorDescriptor``: a ``base`` tensor, its ``shape``
    and ``strides``, and the ``block_shape`` a load or store moves), by its fields, so
    that neither Triton nor torch is imported to ask."""
    return all(hasattr(value, a) for a in ("base", "shape", "strides", "block_shape"))


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
