"""The KV pool on 2 MB pages (Linux's transparent huge pages, asked for by madvise).

A decode step reads every running chat's K/V: blocks of a few KB each, scattered over a
pool of gigabytes. On 4 KB pages nearly every block is a TLB miss and a page walk, and the
hardware prefetchers stop at each page's end; on 2 MB pages the TLB covers the whole
pool. 64 decode rows over 600 scattered positions took ~0.93x the time, float16 and int8
pools alike (python -m inference.bench.attention --rows 64 --context 600 --layouts
scattered, pools from this module against torch.zeros). Zeroing the pool at start faults
512x fewer pages, too.

Where the kernel offers no huge pages (`never`, another OS, a GPU), the pool is the same
zeroed tensor on ordinary pages.
"""

from __future__ import annotations

import ctypes
import sys

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


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros, on huge pages where a CPU tensor can have them."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    t = torch.empty(shape, dtype=dtype)
    advise(t)
    return t.zero_()
