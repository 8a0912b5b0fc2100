"""Attention over the paged KV pool in one native call per layer, for the torch path's steps.

The torch path gathered each decode group's blocks into a contiguous tensor and ran SDPA
with a padding mask over it; at 64 rows the gather cost as much as the attention itself
(`python -m inference.bench.step_ab`). The kernels' `paged_attention`
(kernels/quant_gemm.c) writes the step's new K/V first, then reads each row's blocks where
they lie with the native path's own decode attention, in the kernels' pool, so decodes,
guesses and prefill chunks of a few rows all take it. Float32 models on a CPU where the
kernels build (AVX2/FMA/F16C), over float32 or float16 pools; anything else keeps the
gather + SDPA path.
"""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from inference.engine import kernels
from inference.engine.kernels import LayerShape


@cache
def load() -> ctypes.CDLL | None:
    """The kernels' library with paged_attention declared; None where it cannot run here."""
    lib = kernels.load()
    if lib is None:
        return None
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.paged_attention.argtypes = [ctypes.POINTER(LayerShape), p, i, p, p, p, i, i, p, p, i]
    lib.paged_attention.restype = i
    return lib


class PagedAttention:
    """One model's attention over its pools: `__call__` per layer and step."""

    def __init__(
        self, lib: ctypes.CDLL, heads: int, kv_heads: int, head_dim: int, scale: float
    ) -> None:
        self.lib = lib
        self.heads, self.kv_heads, self.head_dim, self.scale = heads, kv_heads, head_dim, scale
        self._shape: LayerShape | None = None
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
        block table), tables [sequences, width] int64; `threads` of the kernels' pool."""
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
        if rc == -2:
            raise MemoryError("paged_attention: out of memory for its block tables or scores")
        if rc:
            raise RuntimeError("paged_attention: a row's position or block table is out of range")
        return out

    def _shape_for(self, pool: torch.Tensor) -> LayerShape:
        key = (*pool.shape, pool.dtype)
        if self._shape is None or key != self._pool_shape:
            if pool.dtype not in kernels.KV_DTYPES or not pool.is_contiguous():
                raise ValueError(
                    "paged attention needs a contiguous float32, float16 or int8 KV pool"
                )
            self._pool_shape = key
            # The attention's fields; the layer's others (hidden, inter, eps) go unread.
            self._shape = LayerShape(
                hidden=self.heads * self.head_dim, heads=self.heads, kv_heads=self.kv_heads,
                head_dim=self.head_dim, scale=self.scale, block_size=pool.shape[2],
                num_blocks=pool.shape[1], kv_type=kernels.kv_type(pool),
            )  # fmt: skip
        return self._shape
