"""Write ``kpack/1`` pack directories (see ``docs/pack-format.md``).

The runtime refuses a pack on any inconsistency, so this writer checks what it
can at build time and fails loudly instead of writing a pack that would only
fail at ``Runtime::Open`` on a GPU machine.  In particular every variant's
``layout`` is read back from its cubin (``kpack_tools.cubin``) rather than
derived from the Python signature: ptxas, not Triton, decides the offsets.
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

FORMAT = "kpack/1"
POINTER_SIZE = 8
SCALAR_SIZES = {
    "i1": 1, "u1": 1, "i8": 1, "u8": 1,
    "i16": 2, "u16": 2, "fp16": 2, "bf16": 2,
    "i32": 4, "u32": 4, "fp32": 4,
    "i64": 8, "u64": 8, "fp64": 8,
}
HIDDEN_PARAMS = ("$global_scratch", "$profile_scratch")

_KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
# Variant names become file names, so they are kept to a path-safe alphabet.
_VARIANT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_POINTER_TYPE = re.compile(r"\*[A-Za-z0-9_]+")
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
    values the variant was compiled with, one per ``constexpr`` parameter.
    """

    name: str
    cubin: bytes
    metadata: Mapping[str, Any]
    constexprs: Mapping[str, Any]

    @classmethod
    def from_compiled(cls, name: str, kernel, constexprs: Mapping[str, Any]) -> "Variant":
        """Wrap a Triton ``CompiledKernel``."""
        return cls(name=name, cubin=kernel.asm["cubin"],
                   metadata=kernel.metadata._asdict(), constexprs=constexprs)


@dataclass(frozen=True)
class Kernel:
    """A kernel: its Python parameters in declaration order and its variants."""

    name: str
    params: Sequence[Tuple[str, str]]
    variants: Sequence[Variant]


def slot_size(param_type: str) -> Optional[int]:
    """Bytes a parameter of this Triton type takes; None for ``constexpr``."""
    if param_type == "constexpr":
        return None
    if _POINTER_TYPE.fullmatch(param_type):
        return POINTER_SIZE
    if param_type in SCALAR_SIZES:
        return SCALAR_SIZES[param_type]
    if param_type == "nvTmaDesc":
        raise ValueError("parameter type 'nvTmaDesc' is not supported by kpack/1")
    raise ValueError(f"unknown parameter type '{param_type}'")


def write_pack(out_dir, kernels: Sequence[Kernel],
               generator: Optional[str] = None) -> Mapping[str, Any]:
    """Write a pack to ``out_dir`` and return its manifest.

    The pack is assembled in a temporary sibling directory and then moved into
    place, so a failure never leaves a half-written pack.  An existing
    ``out_dir`` is replaced only if it is empty or a pack (has a
    ``manifest.json``); anything else is refused rather than deleted.
    """
    out_dir = Path(out_dir)
    manifest, files = build_manifest(kernels, generator)
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
    manifest = {"format": FORMAT}
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
    # docs/pack-format.md: until dispatch lands, a kernel has exactly one variant.
    if len(kernel.variants) != 1:
        raise ValueError(f"{where}: kpack/1 needs exactly one variant, got {len(kernel.variants)}")
    variants = []
    for variant in kernel.variants:
        relpath = f"cubins/{kernel.name}/{variant.name}.cubin"
        variants.append(_variant_entry(kernel, variant, relpath))
        files[relpath] = bytes(variant.cubin)
    return {
        "name": kernel.name,
        "params": [{"name": name, "type": param_type} for name, param_type in kernel.params],
        "variants": variants,
    }


def _variant_entry(kernel: Kernel, variant: Variant, relpath: str) -> Mapping[str, Any]:
    where = f"kernel '{kernel.name}': variant '{variant.name}'"
    if not _VARIANT_NAME.fullmatch(variant.name):
        raise ValueError(f"{where}: name must match {_VARIANT_NAME.pattern}")
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

    entry_fields = {
        "name": variant.name,
        "cubin": relpath,
        "sha256": hashlib.sha256(variant.cubin).hexdigest(),
        "entry": entry,
        "arch": arch,
        "constexprs": {name: variant.constexprs[name] for name in constexpr_names},
        "num_warps": int(meta["num_warps"]),
        "num_ctas": int(meta["num_ctas"]),
    }
    if "num_stages" in meta:
        entry_fields["num_stages"] = int(meta["num_stages"])
    entry_fields.update({
        field: int(meta[field]) for field in (
            "shared", "global_scratch_size", "global_scratch_align",
            "profile_scratch_size", "profile_scratch_align")
    })
    entry_fields["launch_pdl"] = bool(meta["launch_pdl"])
    entry_fields["launch_cooperative_grid"] = bool(meta["launch_cooperative_grid"])
    entry_fields["layout"] = _layout(kernel, cubin.layouts[entry], where)
    if "triton_version" in meta:
        entry_fields["triton_version"] = str(meta["triton_version"])
    return entry_fields


def _layout(kernel: Kernel, slots, where: str):
    """Map the cubin's parameter slots to call parameters, then the hidden ones.

    Triton 3.6 passes the non-constexpr parameters in order followed by the
    global and profile scratch pointers, so anything else means the pack's
    parameter list does not describe this cubin.
    """
    expected = [(name, slot_size(t)) for name, t in kernel.params if t != "constexpr"]
    expected += [(name, POINTER_SIZE) for name in HIDDEN_PARAMS]
    if len(slots) != len(expected):
        raise ValueError(
            f"{where}: cubin has {len(slots)} parameters, expected {len(expected) - 2} call "
            f"parameters + 2 hidden scratch pointers = {len(expected)}")
    layout = []
    for slot, (name, size) in zip(slots, expected):
        if slot.size != size:
            raise ValueError(f"{where}: cubin parameter {slot.ordinal} ('{name}') is "
                             f"{slot.size} bytes, its type needs {size}")
        layout.append({"param": name, "offset": slot.offset, "size": slot.size})
    return layout
