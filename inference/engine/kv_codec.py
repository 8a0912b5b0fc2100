"""How a layer's K/V rows go into the paged pool's element type and come out of it.

A pool of float32, float16 or bfloat16 holds each position's head row as head_dim elements.
An int8 pool holds head_dim int8 values and then their float32 scale, 4 bytes (value =
q * scale, the scale the row's largest magnitude / 127, rounded to nearest even): 68 bytes
for a head of 64 where float16 takes 128, so attention over long contexts reads ~half the
bytes. The kernels (simd.h's kv_put / kv_floats) write and read the same bits.
"""

from __future__ import annotations

import torch

INT8_SCALE_BYTES = 4


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of one position's row of a head in a pool of `dtype`."""
    return head_dim + INT8_SCALE_BYTES if dtype == torch.int8 else head_dim


def to_pool(kv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows [..., head_dim] (float) as a pool of `dtype` holds them: [..., row_width]."""
    if dtype != torch.int8:
        return kv.to(dtype)
    x = kv.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = amax / 127.0
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(x * inv).to(torch.int8)
    return torch.cat([q, scale.contiguous().view(torch.int8)], dim=-1)


def from_pool(rows: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """A pool's rows [..., row_width] as values [..., head_dim] of `dtype`."""
    if rows.dtype != torch.int8:
        return rows.to(dtype)
    scale = rows[..., head_dim:].contiguous().view(torch.float32)
    return (rows[..., :head_dim].float() * scale).to(dtype)
