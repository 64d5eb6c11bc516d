"""The dtype weights travel in: fp32, or bf16 (half the bytes); the server always averages in fp32 or wider.

numpy (and so Flower's Array) has no bfloat16, so a bf16 tensor travels as the uint16 of its bits.
Both ends read `transfer-dtype` from the run config: the sender encodes, the receiver decodes before
anything else looks at the arrays. Rounding to bf16 is round-to-nearest-even, as torch rounds.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

TRANSFER_DTYPES = ("fp32", "bf16")


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float -> the uint16 bits of the nearest bf16 (ties to even)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """The uint16 bits of bf16 numbers -> those numbers as float32 (exact)."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def encode(arrays: ArrayRecord, dtype: str) -> ArrayRecord:
    """The record as it travels: floating-point arrays in `dtype`, other arrays as they are."""
    if dtype == "fp32":
        return arrays
    if dtype != "bf16":
        raise ValueError(f"transfer-dtype={dtype!r} is not allowed: expected {' | '.join(TRANSFER_DTYPES)}")
    out = ArrayRecord()
    for key in arrays.keys():
        a = arrays[key].numpy()
        out[key] = Array(to_bf16_bits(a) if a.dtype.kind == "f" else np.ascontiguousarray(a))
    return out


def decode(arrays: ArrayRecord, dtype: str, template: ArrayRecord | None = None) -> ArrayRecord:
    """The record as it was meant: bf16 bits back to the template's floating dtype; raises on a misfit.

    Without a template (a client, which casts to its own model's dtypes on load) every uint16 array is
    taken for bf16 bits and becomes float32.
    """
    if dtype == "fp32":
        return arrays
    out = ArrayRecord()
    for key in arrays.keys():
        a = arrays[key].numpy()
        if template is None:
            want = np.dtype(np.float32) if a.dtype == np.uint16 else None
        else:
            want = template[key].numpy().dtype if key in template else None
        if want is not None and want.kind == "f":
            if a.dtype != np.uint16:
                raise ValueError(f"array {key!r} has dtype {a.dtype}; with transfer-dtype=bf16 it must be bf16 bits (uint16)")
            a = from_bf16_bits(a).astype(want)
        out[key] = Array(np.ascontiguousarray(a))
    return out
