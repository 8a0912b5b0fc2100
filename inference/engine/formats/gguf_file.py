"""A GGUF file read in place: its metadata and, per tensor, its type and raw blocks.

The file is memory-mapped (copy-on-write, so torch may wrap its pages), so a tensor's blocks
are a view of the file, not a copy; dequantizing is the caller's choice, one tensor at a
time. Every tensor's type is checked at open: a type the registry does not know is refused
there, by name, before any weight is read.

The header is read here (_Header) rather than by gguf.GGUFReader, which makes a numpy view
per part of every field: a vocabulary of 49k tokens and as many merges took it 5-7 s a
file (a tenth of a second here), at every engine start on a GGUF.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inference.engine.formats.ggml_types import GGMLType, ggml_type


def return_freed_memory() -> None:
    """Give the heap's freed pages back to the system. glibc keeps what a load frees (the
    conversions' temporaries, float tensors dropped once in blocks) for reuse, and
    fragmented, so a process that read a 119 MB GGUF went on holding 508 MB; 154 MB after
    this. A no-op where the C library is not glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type: GGMLType
    shape: tuple[int, ...]  # rows first, as torch holds it: [out, in] for a matrix
    raw: torch.Tensor  # uint8 [rows, row bytes], a view of the mapped file
    offset: int = 0  # where its bytes start in the file

    def dequantize(self) -> torch.Tensor:
        """The weights as float32 of `shape` (a new tensor, but for F32's view)."""
        return self.type.dequantize(self.raw, self.shape[-1]).reshape(self.shape)


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._data = np.memmap(self.path, mode="c")
        header = _Header(self._data)
        self._fields = header.fields
        self._infos = header.tensors
        self._types = {
            name: ggml_type(type_id, name, _type_name(type_id))
            for name, (_, type_id, _) in self._infos.items()
        }

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value as Python (str, int, float, bool or a list of them)."""
        return self._fields.get(key, default)

    def keys(self) -> list[str]:
        return list(self._fields)

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture", ""))

    def tensor_names(self) -> list[str]:
        return list(self._infos)

    def tensors(self) -> dict[str, GGUFTensor]:
        out: dict[str, GGUFTensor] = {}
        for name, (dims, _, offset) in self._infos.items():
            kind = self._types[name]
            shape = tuple(reversed(dims))
            rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
            row_bytes = kind.row_bytes(shape[-1])
            data = self._data[offset : offset + rows * row_bytes]
            with warnings.catch_warnings():
                # The mapping is copy-on-write: torch's warning about read-only arrays does
                # not apply, and nothing writes to these views.
                warnings.simplefilter("ignore", UserWarning)
                raw = torch.from_numpy(np.asarray(data).reshape(rows, row_bytes))
            out[name] = GGUFTensor(name, kind, shape, raw, offset)
        return out

    def release(self, tensor: GGUFTensor) -> None:
        """Hand the tensor's mapped pages back to the page cache once it is converted: read
        pages of a mapping count in the process's RSS until then, so a load that reads every
        tensor would otherwise hold the whole file besides what it made of it."""
        mapped = getattr(self._data, "_mmap", None)
        if mapped is None:
            return
        start = tensor.offset - tensor.offset % mmap.PAGESIZE
        end = tensor.offset + tensor.raw.numel()
        end -= end % mmap.PAGESIZE  # a page shared with the next tensor stays
        if end > start:
            mapped.madvise(mmap.MADV_DONTNEED, start, end - start)


def _type_name(type_id: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return ""


# GGUF's value types: id -> (struct format, size) of the scalars; 8 is a string, 9 an array.
_SCALARS = {
    0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
    6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8),
}  # fmt: skip
_STRING, _ARRAY = 8, 9
_MAGIC = b"GGUF"


class _Header:
    """The metadata (key -> Python value) and tensor infos (name -> dims as stored, type
    id, absolute offset of the data) of a little-endian GGUF of version 2 or 3."""

    def __init__(self, data: np.memmap) -> None:
        self.buf = memoryview(data)  # type: ignore[arg-type]
        self.pos = 0
        if bytes(self.buf[:4]) != _MAGIC:
            raise ValueError("GGUF magic invalid")
        self.pos = 4
        version = self._scalar(4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not read here (little-endian 2 or 3)")
        n_tensors, n_fields = self._scalar(10), self._scalar(10)
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self._string()
            self.fields[key] = self._value(self._scalar(4))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = [self._scalar(10) for _ in range(self._scalar(4))]
            infos.append((name, dims, self._scalar(4), self._scalar(10)))
        alignment = self.fields.get("general.alignment", 32)
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError("Invalid alignment: must be a non-zero power of two")
        start = self.pos + (-self.pos % alignment)
        self.tensors = {
            name: (dims, type_id, start + offset) for name, dims, type_id, offset in infos
        }

    def _scalar(self, kind: int) -> Any:
        fmt, size = _SCALARS[kind]
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def _string(self) -> str:
        n = self._scalar(10)
        text = str(self.buf[self.pos : self.pos + n], "utf-8")
        self.pos += n
        return text

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            return self._scalar(kind)
        item, n = self._scalar(4), self._scalar(10)
        if item in _SCALARS:
            fmt, size = _SCALARS[item]
            values = list(struct.unpack_from(f"<{n}{fmt}", self.buf, self.pos))
            self.pos += n * size
            return values
        return [self._value(item) for _ in range(n)]
