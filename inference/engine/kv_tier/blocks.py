"""What the tier stores and gives back, as the engine sees it: a block's layout, a block
to write, and a run of blocks restored from Redis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class BlockLayout:
    """What one block's payload is: [layers, 2 * kv_heads, block_size, head_dim] of dtype,
    `head_dim` a position's row as the pool holds it (kv_codec.row_width: an int8 pool's
    values and their scale)."""

    num_layers: int
    num_kv_heads: int
    block_size: int
    head_dim: int
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        heads = 2 * self.num_kv_heads
        return self.num_layers * heads * self.block_size * self.head_dim * self.dtype.itemsize


class BlockEntry(NamedTuple):
    """A full block to write: its chain digest, its parent's, and its token ids."""

    digest: bytes
    parent: bytes
    token_ids: tuple[int, ...]


@dataclass
class RestoredPrefix:
    """Blocks [first_block, first_block + num_blocks) of a prompt, found in Redis."""

    first_block: int
    kv: list[torch.Tensor]  # per layer [2 * kv_heads, num_blocks, block_size, head_dim]
    seconds: float

    @property
    def num_blocks(self) -> int:
        return int(self.kv[0].shape[1])
