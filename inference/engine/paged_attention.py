"""Attention over the paged KV pool in one native call per layer (kernels/paged_attention.c).

The torch path gathered each decode group's blocks into a contiguous tensor and ran SDPA
with a padding mask over it; at 64 rows the gather cost as much as the attention itself
(docs/performance.md). The kernel reads each row's blocks where they lie and writes the
step's new K/V first, so decodes, guesses and prefill chunks all take it. Float32 models
on a CPU with AVX2/FMA/F16C, over float32 or float16 pools; anything else keeps the gather
+ SDPA path.

The C file is built once with the system's gcc into the cache folder, as quant_gemm.c is
(kernels/__init__.py), and called through ctypes, which releases the GIL.
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache
from pathlib import Path

import torch

from inference.engine import kernels
from inference.engine.kernels import PagedShape
from inference.engine.kernels.build import compiled_library

log = logging.getLogger(__name__)

SOURCE = Path(kernels.__file__).with_name("paged_attention.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-pthread", "-shared", "-fPIC"]
_REQUIRED_CPU_FLAGS = {"avx2", "fma", "f16c"}


@cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot run here."""
    if not kernels._cpu_flags() >= _REQUIRED_CPU_FLAGS:
        return None
    try:
        lib = compiled_library("paged_attention", [SOURCE], FLAGS, [SOURCE.with_name("simd.h")])
    except (OSError, RuntimeError) as exc:
        log.warning("native paged attention unavailable, gathering blocks for SDPA: %s", exc)
        return None
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.paged_attention.argtypes = [ctypes.POINTER(PagedShape), p, i, p, p, p, i, i, p, p, i]
    lib.paged_attention.restype = i
    return lib


class PagedAttention:
    """One model's attention over its pools: `__call__` per layer and step."""

    def __init__(
        self, lib: ctypes.CDLL, heads: int, kv_heads: int, head_dim: int, scale: float
    ) -> None:
        self.lib = lib
        self.heads, self.kv_heads, self.head_dim, self.scale = heads, kv_heads, head_dim, scale
        self._shape: PagedShape | None = None
        self._pool_shape: tuple[object, ...] = ()

    @staticmethod
    def usable(device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and dtype == torch.float32 and load() is not None

    def __call__(
        self,
        qkv: torch.Tensor,
        pool: torch.Tensor,
        positions: torch.Tensor,
        row_seq: torch.Tensor,
        tables: torch.Tensor,
        threads: int,
    ) -> torch.Tensor:
        """qkv [rows, heads + 2 * kv_heads, head_dim] (rope applied, contiguous) -> the
        attention output [rows, heads, head_dim]; the rows' K/V are written into `pool`.

        positions [rows] int64, row_seq [rows] int32 (which row of `tables` is the row's
        block table), tables [sequences, width] int64."""
        rows = qkv.shape[0]
        out = qkv.new_empty(rows, self.heads, self.head_dim)
        if rows == 0:
            return out
        shape = self._shape_for(pool)
        rc = self.lib.paged_attention(
            ctypes.byref(shape), qkv.data_ptr(), rows, positions.data_ptr(),
            row_seq.data_ptr(), tables.data_ptr(), tables.shape[0], tables.shape[1],
            pool.data_ptr(), out.data_ptr(), threads,
        )  # fmt: skip
        if rc:
            raise RuntimeError("paged_attention: a row's position or block table is out of range")
        return out

    def _shape_for(self, pool: torch.Tensor) -> PagedShape:
        key = (*pool.shape, pool.dtype)
        if self._shape is None or key != self._pool_shape:
            if pool.dtype not in kernels.KV_DTYPES or not pool.is_contiguous():
                raise ValueError("paged attention needs a contiguous float32 or float16 KV pool")
            self._pool_shape = key
            self._shape = PagedShape(
                self.heads, self.kv_heads, self.head_dim, pool.shape[2], pool.shape[1],
                self.scale, kernels.kv_half(pool),
            )  # fmt: skip
        return self._shape
