"""Attention over the paged KV pool for a flat batch of rows from many sequences.

Each layer first writes the step's K/V into its pool, then decodes attend together over
their gathered blocks and each prefill chunk attends causally over its own context. The
fast paths (the native paged kernel, the chunk kernel, SDPA) do plain softmax attention;
a layer with a sliding window or soft-capped scores takes `_exact`, torch ops that say
the maths once, rather than a fast path that would be wrong for it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from inference.engine import kernels
from inference.engine.kv_codec import from_pool, row_width, to_pool
from inference.engine.paged_attention import PagedAttention


@dataclass
class PrefillChunk:
    start: int  # first row of this chunk in the flat batch
    length: int  # tokens in the chunk
    context_len: int  # tokens the sequence holds after this step (cached + chunk)
    block_table: torch.Tensor  # [num_blocks] block ids covering context_len
    # Where the chunk's K/V go, when the step's slot_mapping does not cover it (steps with
    # the native paged attention, whose longer chunks take the chunk attention).
    slots: torch.Tensor | None = None


@dataclass
class DecodeGroup:
    start: int  # first row in the flat batch
    count: int  # sequences (rows) in the group
    block_tables: torch.Tensor  # [count, max_blocks], padded with block 0
    mask: torch.Tensor | None  # [count, 1, 1, max_blocks * block_size] additive, or None
    blocks: torch.Tensor = field(init=False)  # block_tables flattened, for one gather

    def __post_init__(self) -> None:
        self.blocks = self.block_tables.reshape(-1)


@dataclass
class AttentionMetadata:
    """Where each token's K/V goes and what each query attends to, for one step."""

    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] flat slot = block_id * block_size + offset
    # The first num_decodes rows are single-token decodes, in groups of similar context
    # length (each group pads its contexts to its longest, so one long chat does not make
    # every short one read thousands of padded slots).
    num_decodes: int = 0
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    # What the native paged attention reads instead of the groups above (None where the
    # model runs without it): each row's sequence, an index into `tables`, and the step's
    # sequences' block tables, padded with block 0.
    row_seq: torch.Tensor | None = None  # [T] int32
    tables: torch.Tensor | None = None  # [sequences, width] int64
    # The first paged_rows rows take the native paged attention; the rest are `prefills`,
    # chunks longer than PAGED_MAX_CHUNK rows, where tiles of rows win (_prefill_attention).
    paged_rows: int = 0
    # The step whose products the rows take (the native path's; None: all the rows). A
    # step's speculative guesses do not count: its rows come out as they would in the step
    # without them, so greedy speculation keeps plain decoding's text.
    as_rows: int | None = None


# The native paged attention takes a sequence's rows one by one; the chunk attention
# (kernels/chunk_attention.c, or SDPA where it does not build) takes a chunk's rows as tiles
# and wins from about this many rows of one sequence (at 2 rows over 512 cached tokens the
# native kernel is faster than SDPA with its gather, at 8 rows the tiles are). Measured
# with `python -m inference.bench.step_ab --rows 16 32 64 --prefill 512`.
PAGED_MAX_CHUNK = 4


@dataclass(frozen=True)
class LayerAttention:
    """What sets one layer's attention apart from plain causal softmax attention."""

    window: int | None = None  # a row sees only the last `window` positions (its own too)
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap)

    @property
    def plain(self) -> bool:
        return self.window is None and self.softcap is None


PLAIN = LayerAttention()


class Attention:
    """One model's attention (every layer's: heads and scale are the model's), with the
    kernels it may use; `paged` None: the gathered-blocks paths (grouped metadata)."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        chunk_kernel: ctypes.CDLL | None,
        chunk_bf16: bool,
        paged: PagedAttention | None,
    ) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        # Prompts' chunks over their context: tiles over the paged pool where the kernels
        # build (CPU, float32), else a gather of the context and SDPA.
        self.chunk_kernel = chunk_kernel
        self.chunk_bf16 = chunk_bf16
        self._chunk_shape: kernels.ChunkShape | None = None
        self.paged = paged

    def attend(
        self,
        qkv: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        layer: LayerAttention = PLAIN,
    ) -> torch.Tensor:
        """Write the step's K/V into this layer's pool, then attend: qkv [T, heads +
        2 * kv_heads, head_dim] (rope applied) -> [T, heads, head_dim]."""
        d = self.head_dim
        if not layer.plain:
            if meta.tables is not None:
                raise ValueError("a windowed or soft-capped layer needs grouped metadata")
            self._write(qkv, kv_cache, meta.slot_mapping)
            return self._exact_attention(qkv, kv_cache, meta, layer)
        if self.paged is not None and meta.tables is not None:
            assert meta.row_seq is not None  # built together with the tables
            # In the kernels' pool, as the chunk attention: a step whose products run there
            # leaves torch one thread.
            threads = kernels.threads()
            n = meta.paged_rows
            if n == qkv.shape[0]:
                return self.paged(qkv, kv_cache, meta.positions, meta.row_seq, meta.tables, threads)
            out = qkv.new_empty(qkv.shape[0], self.num_heads, d)
            if n:
                positions, row_seq = meta.positions[:n], meta.row_seq[:n]
                out[:n] = self.paged(qkv[:n], kv_cache, positions, row_seq, meta.tables, threads)
            for p in meta.prefills:
                rows = slice(p.start, p.start + p.length)
                assert p.slots is not None  # set for every chunk of such a step
                self._write(qkv[rows], kv_cache, p.slots)
                out[rows] = self._prefill_attention(qkv[rows], kv_cache, p, meta.positions[rows])
            return out
        self._write(qkv, kv_cache, meta.slot_mapping)
        return self._attention(qkv, kv_cache, meta)

    def _write(self, qkv: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
        """The rows' K/V ([2 * hkv, T, d], in the pool's element type) into their slots."""
        hkv, width = self.num_kv_heads, row_width(self.head_dim, kv_cache.dtype)
        new_kv = to_pool(qkv[:, self.num_heads :].transpose(0, 1), kv_cache.dtype)
        kv_cache.view(2 * hkv, -1, width).index_copy_(1, slots, new_kv)

    def _rows(
        self, kv_cache: torch.Tensor, blocks: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """These blocks of the pool as values of `dtype`: [2 * hkv, blocks, block_size, d]."""
        return from_pool(torch.index_select(kv_cache, 1, blocks), self.head_dim, dtype)

    def _attention(
        self, qkv: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """qkv: [T, heads + 2 * kv_heads, head_dim] -> attention output [T, heads, head_dim]."""
        hq = self.num_heads
        if len(meta.decode_groups) == 1 and not meta.prefills:
            return self._decode_attention(qkv[:, :hq], kv_cache, meta.decode_groups[0])
        out = qkv.new_empty(qkv.shape[0], hq, self.head_dim)
        for g in meta.decode_groups:
            rows = slice(g.start, g.start + g.count)
            out[rows] = self._decode_attention(qkv[rows, :hq], kv_cache, g)
        for p in meta.prefills:
            rows = slice(p.start, p.start + p.length)
            out[rows] = self._prefill_attention(qkv[rows], kv_cache, p, meta.positions[rows])
        return out

    def _decode_attention(
        self, q: torch.Tensor, kv_cache: torch.Tensor, group: DecodeGroup
    ) -> torch.Tensor:
        """One query per sequence over its gathered blocks: [D, heads, head_dim]."""
        nd, hkv, d = q.shape[0], self.num_kv_heads, self.head_dim
        per_kv = self.num_heads // hkv
        # The pool is head-major, so one gather lands each head's context contiguously:
        # [2 * hkv, D * blocks, block_size, d] -> keys and values as [hkv, D, ctx, d].
        # (index_select copies whole blocks; advanced indexing goes element by element.)
        kv = self._rows(kv_cache, group.blocks, q.dtype).view(2, hkv, nd, -1, d)
        # The kv heads' query heads ride as a query length of per_kv: one plain (non-GQA)
        # fused attention call over [D, kv_heads, ...], no score matrix in Python.
        out = F.scaled_dot_product_attention(
            q.view(nd, hkv, per_kv, d),
            kv[0].transpose(0, 1),
            kv[1].transpose(0, 1),
            attn_mask=group.mask,
            scale=self.scale,
        )
        return out.reshape(nd, hkv * per_kv, d)

    def _prefill_attention(
        self, qkv: torch.Tensor, kv_cache: torch.Tensor, p: PrefillChunk, positions: torch.Tensor
    ) -> torch.Tensor:
        """Causal attention of a chunk over its context: [n, heads, head_dim]. `positions`
        are the chunk's rows' (the chunk's K/V are in the pool already)."""
        if self.chunk_kernel is not None:
            out = self._chunk_kernel_attention(qkv, kv_cache, p, positions)
            if out is not None:
                return out
        n, hq, hkv, d = qkv.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        q = qkv[:, :hq].transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
        if p.context_len == n:
            # Nothing cached before this chunk: its own K/V are the whole context, as the
            # pool holds them (rounded to its dtype), so that every path attends over the
            # same values whatever the chunking.
            kv = from_pool(to_pool(qkv[:, hq:].transpose(0, 1), kv_cache.dtype), d, qkv.dtype)
            mask, causal = None, True
        else:
            ctx = p.context_len
            kv = self._rows(kv_cache, p.block_table, qkv.dtype).view(2 * hkv, -1, d)[:, :ctx]
            q_pos = torch.arange(ctx - n, ctx, device=qkv.device)
            mask = torch.arange(ctx, device=qkv.device)[None, :] <= q_pos[:, None]
            causal = False
        out = F.scaled_dot_product_attention(
            q,
            kv[:hkv].unsqueeze(0),
            kv[hkv:].unsqueeze(0),
            attn_mask=mask,
            is_causal=causal,
            scale=self.scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)

    def _chunk_kernel_attention(
        self, qkv: torch.Tensor, kv_cache: torch.Tensor, p: PrefillChunk, positions: torch.Tensor
    ) -> torch.Tensor | None:
        """The chunk over its context read where it lies in the pool (kernels/
        chunk_attention.c); None where the pool or shape is not the kernel's."""
        assert self.chunk_kernel is not None
        if (
            qkv.dtype != torch.float32
            or kv_cache.dtype not in kernels.KV_DTYPES
            or not kv_cache.is_contiguous()
        ):
            return None
        kv_type = kernels.kv_type(kv_cache)
        shape = self._chunk_shape
        if shape is None or (shape.num_blocks, shape.block_size, shape.kv_type) != (
            *kv_cache.shape[1:3],
            kv_type,
        ):
            shape = self._chunk_shape = kernels.ChunkShape(
                heads=self.num_heads, kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                block_size=kv_cache.shape[2], num_blocks=kv_cache.shape[1], scale=self.scale,
                kv_type=kv_type, bf16=int(self.chunk_bf16),
            )  # fmt: skip
        return kernels.chunk_attention(
            self.chunk_kernel, shape, qkv.contiguous(), positions.contiguous(),
            p.block_table.contiguous(), kv_cache, kernels.threads(),
        )  # fmt: skip

    def _exact_attention(
        self, qkv: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
        layer: LayerAttention,
    ) -> torch.Tensor:  # fmt: skip
        """Every row over its context in torch ops, with the layer's window and soft cap."""
        out = qkv.new_empty(qkv.shape[0], self.num_heads, self.head_dim)
        for g in meta.decode_groups:
            rows = slice(g.start, g.start + g.count)
            pos = meta.positions[rows]
            for j in range(g.count):
                # Row j's context is its block table's first pos + 1 slots.
                kv = self._context(kv_cache, g.block_tables[j], int(pos[j]) + 1, qkv.dtype)
                out[g.start + j] = self._exact(
                    qkv[g.start + j : g.start + j + 1], kv, pos[j : j + 1], layer
                )[0]
        for p in meta.prefills:
            rows = slice(p.start, p.start + p.length)
            kv = self._context(kv_cache, p.block_table, p.context_len, qkv.dtype)
            out[rows] = self._exact(qkv[rows], kv, meta.positions[rows], layer)
        return out

    def _context(
        self, kv_cache: torch.Tensor, block_table: torch.Tensor, ctx: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """A sequence's first `ctx` K/V rows from the pool as values of `dtype`: [2 *
        kv_heads, ctx, head_dim]."""
        kv = self._rows(kv_cache, block_table, dtype)
        return kv.view(2 * self.num_kv_heads, -1, self.head_dim)[:, :ctx]

    def _exact(
        self, qkv: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor, layer: LayerAttention
    ) -> torch.Tensor:
        """Rows at `positions` over context `kv` [2 * kv_heads, ctx, d] (qkv's dtype) ->
        [n, heads, d]."""
        n, hkv, d = qkv.shape[0], self.num_kv_heads, self.head_dim
        per_kv = self.num_heads // hkv
        q = qkv[:, : self.num_heads].reshape(n, hkv, per_kv, d).permute(1, 2, 0, 3)
        k, v = kv[:hkv].unsqueeze(1), kv[hkv:].unsqueeze(1)  # [hkv, 1, ctx, d]
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale  # [hkv, per_kv, n, ctx]
        if layer.softcap is not None:
            scores = torch.tanh(scores / layer.softcap) * layer.softcap
        key_pos = torch.arange(kv.shape[1], device=qkv.device)
        seen = key_pos[None, :] <= positions[:, None]
        if layer.window is not None:
            seen &= key_pos[None, :] > positions[:, None] - layer.window
        scores = scores.masked_fill(~seen, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(qkv.dtype)
        return torch.matmul(probs, v).permute(2, 0, 1, 3).reshape(n, self.num_heads, d)
