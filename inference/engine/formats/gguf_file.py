"""A GGUF file read in place: its metadata and, per tensor, its type and raw blocks.

The file is memory-mapped (gguf.GGUFReader, copy-on-write so torch may wrap its pages), so
a tensor's blocks are a view of the file, not a copy; dequantizing is the caller's choice,
one tensor at a time. Every tensor's type is checked at open: a type the registry does not
know is refused there, by name, before any weight is read.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
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
        from gguf import GGUFReader

        self.path = Path(path)
        self._reader = GGUFReader(self.path, "c")
        self._types = {
            t.name: ggml_type(t.tensor_type, t.name, t.tensor_type.name)
            for t in self._reader.tensors
        }

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value as Python (str, int, float, bool or a list of them)."""
        field = self._reader.fields.get(key)
        return default if field is None else field.contents()

    def keys(self) -> list[str]:
        return list(self._reader.fields)

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture", ""))

    def tensor_names(self) -> list[str]:
        return [t.name for t in self._reader.tensors]

    def tensors(self) -> dict[str, GGUFTensor]:
        out: dict[str, GGUFTensor] = {}
        for t in self._reader.tensors:
            kind = self._types[t.name]
            shape = tuple(int(n) for n in reversed(t.shape.tolist()))
            data = np.asarray(t.data).view(np.uint8)
            rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
            with warnings.catch_warnings():
                # The mapping is copy-on-write: torch's warning about read-only arrays does
                # not apply, and nothing writes to these views.
                warnings.simplefilter("ignore", UserWarning)
                raw = torch.from_numpy(data.reshape(rows, kind.row_bytes(shape[-1])))
            out[t.name] = GGUFTensor(t.name, kind, shape, raw, int(t.data_offset))
        return out

    def release(self, tensor: GGUFTensor) -> None:
        """Hand the tensor's mapped pages back to the page cache once it is converted: read
        pages of a mapping count in the process's RSS until then, so a load that reads every
        tensor would otherwise hold the whole file besides what it made of it."""
        mapped = getattr(self._reader.data, "_mmap", None)
        if mapped is None:
            return
        start = tensor.offset - tensor.offset % mmap.PAGESIZE
        end = tensor.offset + tensor.raw.numel()
        end -= end % mmap.PAGESIZE  # a page shared with the next tensor stays
        if end > start:
            mapped.madvise(mmap.MADV_DONTNEED, start, end - start)
