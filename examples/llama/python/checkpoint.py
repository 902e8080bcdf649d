"""Hugging Face Llama checkpoints (config.json + model.safetensors): the seeded random writer
(docs/llama.md; ENGINE_IFACE.md's make_checkpoint.py is its command line) and a numpy
reader that checks every tensor against the config.

Writer: weights ~ N(0, 0.02), norm weights ~ 1 + N(0, 0.1), rounded to bf16. Each tensor
has its own random stream, seeded by (seed, the tensor's index in writing order):

- numpy path (``backend="numpy"``): ``np.random.default_rng([seed, index])``'s
  ``standard_normal`` in fp32, scaled, rounded to bf16 by bits; needs no torch;
- torch path (``backend="torch"``): a ``torch.Generator`` seeded ``seed * 1_000_003 + index``,
  ``torch.randn`` in fp32 (on ``device``), scaled, ``.to(torch.bfloat16)``.

The two paths give different weights for the same seed. ``backend="auto"`` takes numpy for
checkpoints under 64M parameters (the tiny one: so that CI without torch and a developer
with torch write the same file) and torch, when importable, above that (the full size:
seconds instead of minutes). The file's metadata records the path and seed.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np

import bf16
from config import LlamaConfig, load_config, parse_config

AUTO_NUMPY_MAX_PARAMS = 64 << 20
_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2,
                "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8, "BOOL": 1}


class CheckpointError(ValueError):
    """A checkpoint that does not match its config or the safetensors format; the message
    names the file and the tensor."""


# ------------------------------------------------------------------ writing

def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def _numpy_tensor(seed: int, index: int, name: str, shape: tuple) -> np.ndarray:
    rng = np.random.default_rng([seed, index])
    x = rng.standard_normal(math.prod(shape), dtype=np.float32)
    if _is_norm(name):
        x = np.float32(1.0) + x * np.float32(0.1)
    else:
        x *= np.float32(0.02)
    return bf16.bits_from_f32(x).reshape(shape)


def _serialize(specs: Dict[str, tuple], path: Path, metadata: Dict[str, str]) -> None:
    """specs: name -> (safetensors dtype name, e.g. "bfloat16", shape, numpy array holding the raw bytes)."""
    import safetensors  # noqa: PLC0415
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8: pointers, no copy
        flat = {n: safetensors.TensorSpec(dtype=dt, shape=list(shape), data_ptr=a.ctypes.data,
                                          data_len=a.nbytes)
                for n, (dt, shape, a) in specs.items()}
    else:
        flat = {n: {"dtype": dt, "shape": list(shape), "data": a.tobytes()}
                for n, (dt, shape, a) in specs.items()}
    safetensors.serialize_file(flat, str(path), metadata=metadata)


def write_checkpoint(out: str | os.PathLike, config: Dict[str, Any], seed: int,
                     backend: str = "auto", device: str = "cpu") -> LlamaConfig:
    """Write out/config.json (``config``, as given) and out/model.safetensors. Returns the
    parsed config."""
    cfg = parse_config(config, "config")
    if backend == "auto":
        backend = "numpy"
        if cfg.parameter_count() >= AUTO_NUMPY_MAX_PARAMS:
            try:
                import torch  # noqa: F401,PLC0415
                backend = "torch"
            except ImportError:
                pass
    if backend not in ("numpy", "torch"):
        raise ValueError(f"backend must be auto, numpy or torch, got '{backend}'")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    metadata = {"format": "pt", "generator": f"kpack make_checkpoint ({backend})",
                "seed": str(seed)}
    shapes = cfg.tensor_shapes()
    if backend == "numpy":
        specs = {name: ("bfloat16", shape, _numpy_tensor(seed, i, name, shape))
                 for i, (name, shape) in enumerate(shapes.items())}
        _serialize(specs, out / "model.safetensors", metadata)
    else:
        import torch  # noqa: PLC0415
        from safetensors.torch import save_file  # noqa: PLC0415
        tensors = {}
        for i, (name, shape) in enumerate(shapes.items()):
            g = torch.Generator(device=device).manual_seed(seed * 1_000_003 + i)
            x = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
            x = 1.0 + 0.1 * x if _is_norm(name) else 0.02 * x
            tensors[name] = x.to(torch.bfloat16).cpu()
        save_file(tensors, str(out / "model.safetensors"), metadata=metadata)
    return cfg


# ------------------------------------------------------------------ reading

def read_header(path: str | os.PathLike) -> tuple:
    """(header dict without __metadata__, metadata, data start offset, file size)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: truncated (no header length)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CheckpointError(f"{path}: header length {n} runs past the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    return header, metadata, 8 + n, size


def load_bf16(path: str | os.PathLike, cfg: LlamaConfig) -> Dict[str, np.ndarray]:
    """Every tensor the config needs, as uint16 bf16 bits (read-only views of a memory map),
    checked: present, BF16, the config's shape, inside the file."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.safetensors"
    header, _, start, size = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, shape in cfg.tensor_shapes().items():
        entry = header.get(name)
        if entry is None:
            raise CheckpointError(f"{path}: missing tensor '{name}'")
        if entry.get("dtype") != "BF16":
            raise CheckpointError(f"{path}: tensor '{name}' has dtype {entry.get('dtype')}, "
                                  "expected BF16")
        if list(entry.get("shape", [])) != list(shape):
            raise CheckpointError(f"{path}: tensor '{name}' has shape {entry.get('shape')}, "
                                  f"the config needs {list(shape)}")
        begin, end = entry.get("data_offsets", [0, -1])
        if not (0 <= begin <= end and start + end <= size and end - begin == 2 * math.prod(shape)):
            raise CheckpointError(f"{path}: tensor '{name}' has data_offsets [{begin}, {end}] "
                                  f"that do not hold {shape} BF16 inside the file")
        out[name] = data[start + begin:start + end].view(np.uint16).reshape(shape)
    return out


def load(dir: str | os.PathLike) -> tuple:
    """(LlamaConfig, {name: uint16 bf16 bits}) of a checkpoint directory."""
    cfg = load_config(dir)
    return cfg, load_bf16(Path(dir) / "model.safetensors", cfg)


def torch_weights(dir: str | os.PathLike, cfg: Optional[LlamaConfig] = None,
                  device: str = "cpu") -> Dict[str, Any]:
    """The checkpoint's tensors as torch bf16 tensors on ``device`` (checked as load_bf16)."""
    import torch  # noqa: PLC0415
    cfg = cfg or load_config(dir)
    bits = load_bf16(Path(dir) / "model.safetensors", cfg)
    return {n: torch.from_numpy(np.array(a)).view(torch.bfloat16).to(device)
            for n, a in bits.items()}
