"""Decode steps on CUDA replayed from CUDA graphs, one per bucket (nano-vllm's scheme).

A decode step of a few rows is mostly kernel launches: ~15 a layer, each costing more on
the host than on the GPU. Captured once per bucket of rows (1, 2, 4, 8, 16, 32, 64, up to
max_num_seqs) and of block-table width (powers of two, up to the model's context), a step
is one replay: its inputs are copied into the graph's static buffers, the rows beyond the
step's (padding) write their K/V into a scratch block no sequence owns and attend to it
alone.

Only decode steps (one token per row, no speculative guesses) are replayed; prefill chunks,
guesses and anything wider take the eager forward. Graphs of one width are captured the
first time a step needs them (a few ms each), all from one memory pool.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from inference.engine.layers.attention import AttentionMetadata
    from inference.engine.models.base import DecoderModel

log = logging.getLogger(__name__)

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def row_buckets(max_rows: int) -> list[int]:
    """The captured row counts: powers of two up to the first one that holds max_rows."""
    out = []
    for b in ROW_BUCKETS:
        out.append(b)
        if b >= max_rows:
            break
    return out


def _bucket(n: int, buckets: list[int]) -> int | None:
    for b in buckets:
        if b >= n:
            return b
    return None


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    rows: int
    width: int
    hidden: torch.Tensor  # the graph's output, [rows, hidden]


class CudaGraphStep:
    """Replays decode steps of `model` over `kv_caches`, whose block `scratch_block` is
    reserved for padding rows (the runner allocates the pool one block larger)."""

    def __init__(
        self,
        model: DecoderModel,
        kv_caches: list[torch.Tensor],
        max_rows: int,
        max_blocks: int,
        block_size: int,
        scratch_block: int,
    ) -> None:
        if model.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA model")
        self.model = model
        self.kv_caches = kv_caches
        self.buckets = row_buckets(max_rows)
        self.max_rows = self.buckets[-1]
        self.block_size = block_size
        self.scratch = scratch_block
        widths, w = [], 1
        while w < max_blocks:
            widths.append(w)
            w *= 2
        self.widths = [*widths, max_blocks]
        self.max_width = max_blocks
        dev = model.device
        n = self.max_rows
        # Static inputs: every graph reads slices of these.
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slots = torch.zeros(n, dtype=torch.long, device=dev)
        self.context_lens = torch.ones(n, dtype=torch.long, device=dev)
        self.tables = torch.full((n, max_blocks), scratch_block, dtype=torch.long, device=dev)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.steps = 0  # forwards replayed from a graph

    # -- which steps ------------------------------------------------------------------

    def handles(self, rows: int, meta: AttentionMetadata) -> bool:
        """A decode-only step of at most max_rows rows (no chunks, no guesses)."""
        return (
            0 < rows <= self.max_rows
            and not meta.prefills
            and meta.num_decodes == rows
            and all(g.block_tables.shape[1] <= self.max_width for g in meta.decode_groups)
        )

    # -- replay -----------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        rows = input_ids.shape[0]
        width = max(g.block_tables.shape[1] for g in meta.decode_groups)
        bucket = _bucket(rows, self.buckets)
        wbucket = _bucket(width, self.widths)
        assert bucket is not None and wbucket is not None  # handles() said so
        g = self.graphs.get((bucket, wbucket)) or self._capture(bucket, wbucket)
        self._load(input_ids, meta, bucket, wbucket)
        g.graph.replay()
        self.steps += 1
        return g.hidden[:rows]

    def _load(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, bucket: int, width: int
    ) -> None:
        rows = input_ids.shape[0]
        self.input_ids[:rows].copy_(input_ids, non_blocking=True)
        self.positions[:rows].copy_(meta.positions, non_blocking=True)
        self.slots[:rows].copy_(meta.slot_mapping, non_blocking=True)
        self.context_lens[:rows].copy_(meta.positions + 1, non_blocking=True)
        tables = self.tables[:bucket, :width]
        tables.fill_(self.scratch)
        for group in meta.decode_groups:
            t = group.block_tables
            tables[group.start : group.start + group.count, : t.shape[1]].copy_(
                t, non_blocking=True
            )
        # Padding rows: position 0 of the scratch block, which only they read.
        self.input_ids[rows:bucket].zero_()
        self.positions[rows:bucket].zero_()
        self.slots[rows:bucket].fill_(self.scratch * self.block_size)
        self.context_lens[rows:bucket].fill_(1)

    # -- capture ----------------------------------------------------------------------

    def _capture(self, rows: int, width: int) -> _Graph:
        m = self.model
        ids, positions = self.input_ids[:rows], self.positions[:rows]
        slots, ctx = self.slots[:rows], self.context_lens[:rows]
        tables = self.tables[:rows, :width]
        self.slots[:rows].fill_(self.scratch * self.block_size)
        self.positions[:rows].zero_()
        self.context_lens[:rows].fill_(1)
        tables.fill_(self.scratch)

        def attend(i: int, qkv: torch.Tensor) -> torch.Tensor:
            return self._attend(qkv, self.kv_caches[i], slots, ctx, tables)

        def run() -> torch.Tensor:
            return m.layers_forward(ids, positions, _call, attend)

        # Warm up on a side stream first (allocator and library state), as PyTorch asks.
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = run()
        torch.cuda.synchronize()
        captured = _Graph(graph, rows, width, hidden)
        self.graphs[(rows, width)] = captured
        log.info("captured a CUDA graph: %d rows, %d blocks per row", rows, width)
        return captured

    def capture_all(self) -> None:
        """Every row bucket at the narrowest width (wider ones come when needed)."""
        for rows in self.buckets:
            if (rows, self.widths[0]) not in self.graphs:
                self._capture(rows, self.widths[0])

    def _attend(
        self,
        qkv: torch.Tensor,
        kv_cache: torch.Tensor,
        slots: torch.Tensor,
        context_lens: torch.Tensor,
        tables: torch.Tensor,
    ) -> torch.Tensor:
        """Static-shape decode attention: write each row's K/V at its slot, gather its
        table's blocks, mask the positions past its context, SDPA."""
        m = self.model
        hq, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
        rows, width = tables.shape
        new_kv = qkv[:, hq:].transpose(0, 1).to(kv_cache.dtype)  # [2 * hkv, rows, d]
        kv_cache.view(2 * hkv, -1, d).index_copy_(1, slots, new_kv)
        kv = kv_cache.index_select(1, tables.reshape(-1)).view(2, hkv, rows, -1, d)
        kv = kv.to(qkv.dtype)
        key_pos = torch.arange(width * self.block_size, device=qkv.device)
        mask = (key_pos[None, :] < context_lens[:, None])[:, None, None, :]
        per_kv = hq // hkv
        out = F.scaled_dot_product_attention(
            qkv[:, :hq].reshape(rows, hkv, per_kv, d),
            kv[0].transpose(0, 1),
            kv[1].transpose(0, 1),
            attn_mask=mask,
            scale=m.scale,
        )
        return out.reshape(rows, hq, d)


def _call(linear: object, x: torch.Tensor) -> torch.Tensor:
    y: torch.Tensor = linear(x)  # type: ignore[operator]
    return y
