"""bfloat16 in numpy, by bit manipulation (numpy has no bf16 dtype).

A bf16 value is the upper 16 bits of an IEEE fp32 value. Rounding fp32 to bf16 is to
nearest, ties to even (what torch's ``.to(torch.bfloat16)`` and Triton's ``.to(tl.bfloat16)``
do on the GPU); NaN stays a quiet NaN.
"""

from __future__ import annotations

import numpy as np


def bits_from_f32(x: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns of fp32 values, rounded to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
               >> np.uint32(16)).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        rounded = np.where(nan, ((u >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16),
                           rounded)
    return rounded


def f32_from_bits(bits: np.ndarray) -> np.ndarray:
    """fp32 values of uint16 bf16 bit patterns (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_f32(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 -> fp32: the value a bf16 store keeps."""
    return f32_from_bits(bits_from_f32(x))
