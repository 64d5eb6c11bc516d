"""The files a client and its ranks hand weights through: safetensors written one tensor at a time, read mapped.

A client's round sends its ranks the server's weights and gets rank 0's trained weights back, each a whole model. The
safetensors library writes a file from a dict of whole arrays and builds the file's bytes in memory first, so a reply
written with it held the model three times on rank 0 (the gathered arrays, those bytes, the file on a tmpfs). Here the
header is written first from the tensors' names, dtypes and shapes, which are known before any is gathered, and then
each tensor as it comes (`Streamed`): rank 0 holds one gathered tensor at a time, and the file is the only whole copy.
Readers are the safetensors library's (`mapped`); tests/agent/test_tensor_files.py reads what this writes with it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# numpy's dtypes by the names safetensors gives them in a header (bf16 never reaches numpy here: it travels as fp32)
SAFETENSORS_DTYPES = {np.dtype(k): v for k, v in {
    "float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL"}.items()}
GIB = 1024**3


@dataclass
class Streamed:
    """Tensors known by name, dtype and shape before their values exist, then produced one at a time in that order:
    `layout` [(name, dtype, shape)], `arrays` yielding each array (None where this process keeps none: a rank other
    than 0 gathers each tensor with rank 0, which writes them, and drops it). Entries are ordered widest dtype first,
    as safetensors orders them, so that every tensor in the file starts on a multiple of its item size."""

    layout: list[tuple[str, np.dtype, tuple[int, ...]]]
    arrays: Iterable[np.ndarray | None]
    order: list[str] | None = None  # the names in the order their source had them, where that differs

    def names(self) -> list[str]:
        return self.order or [name for name, _, _ in self.layout]

    @classmethod
    def of(cls, arrays: Mapping[str, np.ndarray]) -> Streamed:
        """Arrays that already exist, streamed as they are."""
        names = _widest_first({k: np.asarray(v).dtype for k, v in arrays.items()})
        return cls([(k, np.asarray(arrays[k]).dtype, tuple(np.shape(arrays[k]))) for k in names],
                   (np.asarray(arrays[k]) for k in names), list(arrays))

    @classmethod
    def computed(cls, layout: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
                 produce: Callable[[str], np.ndarray | None]) -> Streamed:
        """Tensors of `layout` (name -> (dtype, shape)) produced by `produce(name)`, called once each, in the stream's
        order (the same order on every rank, as gathering collectively needs)."""
        names = _widest_first({k: np.dtype(d) for k, (d, _) in layout.items()})
        return cls([(k, np.dtype(layout[k][0]), tuple(layout[k][1])) for k in names], (produce(k) for k in names),
                   list(layout))

    def __add__(self, other: Streamed) -> Streamed:
        """Both streams, one after the other, each in its own order (its tensors may be gathered in it): the one whose
        narrowest dtype is at least the other's widest first, so the file stays widest first."""
        if {n for n, _, _ in self.layout} & {n for n, _, _ in other.layout}:
            raise ValueError("two streams with a tensor name in common")
        first, second = (self, other) if _narrowest(self) >= _widest(other) else (other, self)
        if _narrowest(first) < _widest(second):
            raise ValueError("two streams whose dtypes interleave in width cannot be joined widest first")
        return Streamed(first.layout + second.layout, (a for part in (first, second) for a in part.arrays),
                        self.names() + other.names())

    def prefixed(self, prefix: str) -> Streamed:
        return Streamed([(prefix + n, d, s) for n, d, s in self.layout], self.arrays, [prefix + n for n in self.names()])

    def nbytes(self) -> int:
        return sum(math.prod(shape) * dtype.itemsize for _, dtype, shape in self.layout)

    def drain(self) -> None:
        """Every tensor produced and dropped (a rank that writes nothing still gathers each with rank 0)."""
        for _ in self.arrays:
            pass


def _narrowest(streamed: Streamed) -> int:
    return min((dtype.itemsize for _, dtype, _ in streamed.layout), default=16)


def _widest(streamed: Streamed) -> int:
    return max((dtype.itemsize for _, dtype, _ in streamed.layout), default=0)


def _widest_first(dtypes: Mapping[str, np.dtype]) -> list[str]:
    return sorted(dtypes, key=lambda k: -dtypes[k].itemsize)  # stable: names keep their order within a width


def write_streamed(path: str | Path, streamed: Streamed) -> int:
    """`streamed` written to `path` as a safetensors file, one tensor at a time, under a temporary name renamed into
    place when whole; the free space checked first. Returns the bytes written."""
    path = Path(path)
    header, offset = {}, 0
    for name, dtype, shape in streamed.layout:
        if dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"{name}: dtype {dtype} has no safetensors name (one of {sorted(map(str, SAFETENSORS_DTYPES))})")
        size = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts on a multiple of 8 bytes, as safetensors writes it
    total = 8 + len(head) + offset
    check_free_space(path.parent, total)
    partial = path.with_name("." + path.name + ".partial")
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for (name, dtype, shape), array in zip(streamed.layout, streamed.arrays, strict=True):
            if array is None or array.dtype != dtype or tuple(array.shape) != shape:
                got = None if array is None else (array.dtype, tuple(array.shape))
                raise ValueError(f"{name}: expected {dtype} {shape} as its layout said, got {got}")
            if array.size:
                f.write(memoryview(np.ascontiguousarray(array).reshape(-1)).cast("B"))
    os.replace(partial, path)
    return total


def check_free_space(folder: str | Path, needed: int) -> None:
    """Raises, in one line naming the folder and both sizes, where `folder`'s file system has less than `needed` bytes
    free: a round's weights would otherwise fail half written, or fill the disk other processes need."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(f"the folder {folder} has {free / GIB:.2f} GiB free and this round's weights need "
                      f"{needed / GIB:.2f} GiB: give the client's rank folders more room (TMPDIR names where they go)")


def mapped(path: str | Path) -> dict[str, np.ndarray]:
    """A safetensors file's tensors as numpy arrays mapped from the file, not read into memory: every rank of a client
    reads the round's weights from one file without a private copy each (on a tmpfs the file is the memory), and
    writing to one changes this process's pages only. A removed file stays readable while its arrays live."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:  # torch's reader maps; the numpy one copies
        return {k: f.get_tensor(k).numpy() for k in f.keys()}

