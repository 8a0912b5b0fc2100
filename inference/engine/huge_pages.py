"""The KV pool and the weights' blocks on 2 MB pages (Linux's transparent huge pages, asked
for by madvise).

A decode step reads every running chat's K/V: blocks of a few KB each, scattered over a
pool of gigabytes. On 4 KB pages nearly every block is a TLB miss and a page walk, and the
hardware prefetchers stop at each page's end; on 2 MB pages the TLB covers the whole
pool. 64 decode rows over 600 scattered positions took ~0.93x the time, float16 and int8
pools alike (python -m inference.bench.attention --rows 64 --context 600 --layouts
scattered, pools from this module against torch.zeros). Zeroing the pool at start faults
512x fewer pages, too.

A decode step of one to a few rows streams every weight once, at the memory's rate: on 4 KB
pages each page costs a walk and a restart of the prefetchers. A model's block tensors are
copied into slabs on huge pages as they are built (Arena), small ones (the bundled model's
are ~0.3-2 MB) side by side: one row over Llama-1B's Q4_K layers took 0.93x the time, over
the bundled model's Q4_1 layers 0.90x (the same tensors in a huge-page slab and an ordinary
one, alternated in one process: a copy of python -m inference.bench.kernels's products).

Where the kernel offers no huge pages (`never`, another OS, a GPU), the pool is the same
zeroed tensor on ordinary pages, and the weights stay where they were built.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import sys
import weakref
from typing import Any

import torch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
# Below this a buffer holds at most a huge page or two past its first 2 MB boundary: not
# worth the advice (the test suite's pools stay on ordinary pages).
MIN_BYTES = 4 * HUGE_PAGE


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.madvise.restype = ctypes.c_int
    return libc


_LIBC = _libc()


def advise(t: torch.Tensor) -> bool:
    """Ask for huge pages under a CPU tensor's whole 2 MB pages (before they are first
    touched: pages already faulted in stay small); whether the kernel took the advice."""
    size = t.numel() * t.element_size()
    if _LIBC is None or t.device.type != "cpu" or size < MIN_BYTES:
        return False
    start = t.data_ptr()
    lo = -(-start // HUGE_PAGE) * HUGE_PAGE
    hi = (start + size) // HUGE_PAGE * HUGE_PAGE
    return hi > lo and _LIBC.madvise(lo, hi - lo, MADV_HUGEPAGE) == 0


def _aligned(size: int) -> torch.Tensor:
    """An uninitialized uint8 buffer of `size` bytes (whole huge pages) from a 2 MB boundary,
    advised: the untouched remainder of its allocation is never resident."""
    raw = torch.empty(size + HUGE_PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    buf = raw[start : start + size]
    advise(buf)
    return buf


# Tensors made on huge pages by empty(): Arena.take leaves them (and views of them) in place.
_PLACED: weakref.WeakSet[torch.Tensor] = weakref.WeakSet()


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.empty on the CPU, on huge pages where it is large enough for them. A matrix
    converted at load straight into such a tensor stays there (Arena.take): a load's peak
    then holds it once, not once more while it is copied into the arena (the largest matrix
    of a small model, its embedding, is a third of its file)."""
    size = math.prod(shape) * dtype.itemsize
    if _LIBC is None or size < MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    t = _aligned(-(-size // HUGE_PAGE) * HUGE_PAGE)[:size].view(dtype).view(shape)
    _PLACED.add(t)
    return t


def placed(t: torch.Tensor) -> bool:
    """Whether t lies within a tensor made by empty()."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    return any(b.data_ptr() <= lo and hi <= b.data_ptr() + b.nbytes for b in list(_PLACED))


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros, on huge pages where a CPU tensor can have them."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    t = torch.empty(shape, dtype=dtype)
    advise(t)
    return t.zero_()


# A slab of the weights' arena: large enough for most matrices, small enough that the last
# one's unused tail (never touched, so never resident) is no concern.
SLAB_BYTES = 64 << 20
ALIGN = 64  # the kernels' vector loads want no more; torch's allocator gives as much


class Arena:
    """Tensors copied one after another into slabs on huge pages, each original freed as its
    copy takes its place (settle): a load's peak grows by one tensor, not by the weights."""

    def __init__(self, device: torch.device) -> None:
        self.on = device.type == "cpu" and _LIBC is not None
        self._slab = torch.empty(0, dtype=torch.uint8)
        self._used = 0

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of contiguous CPU tensor t in the arena (t itself where there is none)."""
        if not self.on or t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
            return t
        if placed(t):
            return t
        size = t.numel() * t.element_size()
        if self._used + size > self._slab.numel():
            self._new_slab(size)
        view = self._slab[self._used : self._used + size].view(t.dtype).view(t.shape)
        view.copy_(t)
        self._used += -(-size // ALIGN) * ALIGN
        return view

    def settle(self, obj: Any) -> None:
        """Every tensor field of dataclass `obj` (a matrix's blocks) moved into the arena."""
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, torch.Tensor):
                setattr(obj, f.name, self.take(value))

    def _new_slab(self, size: int) -> None:
        self._slab = _aligned(-(-max(size, SLAB_BYTES) // HUGE_PAGE) * HUGE_PAGE)
        self._used = 0
