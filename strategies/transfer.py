"""The dtype weights travel in: fp32, or bf16 (half the bytes); the server always averages in fp32 or wider.

numpy (and so Flower's Array) has no bfloat16, so a bf16 tensor travels as the uint16 of its bits.
Both ends read `federation.transfer-dtype` from the run config: the sender encodes, the receiver decodes before
anything else looks at the arrays. Rounding to bf16 is round-to-nearest-even, as torch rounds.

`numpy_array` and `array_view` convert between numpy and Flower's Array (.npy bytes) with one copy of the
data and none: Flower's own `Array(ndarray)` and `Array.numpy()` copy every tensor twice each way (through a
BytesIO and np.load), which for a 0.5B-parameter model in fp32 cost 6 s and 14 s a message on this 2-core
machine, mostly the page faults of freshly allocated gigabytes, and doubled the peak memory of every
process that holds a model's worth of arrays.
"""

from __future__ import annotations

import io
import math

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from fedagent_flwr.config.choices import TRANSFER_DTYPES


def numpy_array(values: np.ndarray) -> Array:
    """A Flower Array (.npy bytes, as Array(ndarray) makes) built with one copy of the data instead of two."""
    values = np.require(values, requirements="C")  # (ascontiguousarray would make a 0-d array 1-d)
    header, fields = io.BytesIO(), np.lib.format.header_data_from_array_1_0(values)
    try:
        np.lib.format.write_array_header_1_0(header, fields)  # what np.save writes for any tensor here
    except ValueError:  # a header over 64 KiB (a shape of thousands of dimensions)
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, fields)
    data = b"".join((header.getvalue(), memoryview(values.reshape(-1)).cast("B") if values.size else b""))
    return Array(dtype=str(values.dtype), shape=tuple(int(n) for n in values.shape), stype="numpy.ndarray", data=data)


def array_view(array: Array) -> np.ndarray:
    """A read-only numpy view of an Array's .npy bytes: the header parsed, the data not copied."""
    stream = io.BytesIO(array.data[:65536])  # a .npy header is at most 64 KiB
    version = np.lib.format.read_magic(stream)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran_order, dtype = read_header(stream)
    if fortran_order or dtype.hasobject:  # never written here; Flower's own reader handles it
        return array.numpy()
    return np.frombuffer(array.data, dtype=dtype, count=math.prod(shape), offset=stream.tell()).reshape(shape)


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float -> the uint16 bits of the nearest bf16 (ties to even: torch's own rounding, on all cores; a numpy
    version of the same arithmetic took 8 s for a 0.5B-parameter model here, torch about 1 s)."""
    x = torch.from_numpy(np.require(values, dtype=np.float32, requirements=["C", "W"]))
    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """The uint16 bits of bf16 numbers -> those numbers as float32 (exact)."""
    b = torch.from_numpy(np.require(bits, dtype=np.uint16, requirements=["C", "W"]).view(np.int16))
    return b.view(torch.bfloat16).float().numpy()


def encode(arrays: ArrayRecord, dtype: str) -> ArrayRecord:
    """The record as it travels: floating-point arrays in `dtype`, other arrays as they are."""
    if dtype == "fp32":
        return arrays
    if dtype != "bf16":
        raise ValueError(f"federation.transfer-dtype={dtype!r} is not allowed: expected {' | '.join(TRANSFER_DTYPES)}")
    out = ArrayRecord()
    for key in arrays.keys():
        a = array_view(arrays[key])
        out[key] = numpy_array(to_bf16_bits(a)) if a.dtype.kind == "f" else arrays[key]
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
        a = array_view(arrays[key])
        if template is None:
            want = np.dtype(np.float32) if a.dtype == np.uint16 else None
        else:
            want = np.dtype(template[key].dtype) if key in template else None
        if want is not None and want.kind == "f":
            if a.dtype != np.uint16:
                raise ValueError(f"array {key!r} has dtype {a.dtype}; with federation.transfer-dtype=bf16 it must be bf16 bits (uint16)")
            out[key] = numpy_array(from_bf16_bits(a).astype(want, copy=False))
        else:
            out[key] = arrays[key]  # as it came: nothing to convert, nothing to copy
    return out
