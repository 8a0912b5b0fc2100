"""The torch path's paged attention (kernels/decode_attention.c's paged_attention) against
attention written out."""

from __future__ import annotations

import pytest
import torch

from inference.engine.kv_codec import from_pool, to_pool
from inference.engine.paged_attention import PagedAttention, load
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence

pytestmark = pytest.mark.skipif(load() is None, reason="needs gcc and an AVX2/FMA/F16C CPU")

HEADS, KV_HEADS, HEAD_DIM, BLOCK, BLOCKS = 6, 2, 64, 4, 40


def _reference(qkv, pool, positions, row_seq, tables):
    """Each row over positions 0..its own of its sequence, K/V of every row written first
    (in the pool's element type: a float16 or int8 pool's rows rounded to it)."""
    pool = pool.clone()
    per = HEADS // KV_HEADS
    for r in range(qkv.shape[0]):
        table, pos = tables[row_seq[r]], int(positions[r])
        slot_block, offset = table[pos // BLOCK], pos % BLOCK
        pool[:, slot_block, offset] = to_pool(qkv[r, HEADS:], pool.dtype)
    out = torch.empty(qkv.shape[0], HEADS, HEAD_DIM)
    for r in range(qkv.shape[0]):
        table, ctx = tables[row_seq[r]], int(positions[r]) + 1
        rows = pool[:, table].reshape(2 * KV_HEADS, -1, pool.shape[-1])[:, :ctx]
        keys = from_pool(rows, HEAD_DIM, torch.float32)
        for h in range(HEADS):
            g = h // per
            scores = keys[g] @ qkv[r, h] * HEAD_DIM**-0.5
            out[r, h] = torch.softmax(scores, -1) @ keys[KV_HEADS + g]
    return out, pool


def _case(seed: int):
    g = torch.Generator().manual_seed(seed)
    pool = torch.randn(2 * KV_HEADS, BLOCKS, BLOCK, HEAD_DIM, generator=g)
    # Three sequences on shuffled blocks: a decode at position 13, a 3-row chunk (guesses)
    # at 5..7, a decode at position 0.
    order = torch.randperm(BLOCKS, generator=g)
    tables = torch.stack([order[0:5], order[5:10], order[10:15]])
    positions = torch.tensor([13, 5, 6, 7, 0])
    row_seq = torch.tensor([0, 1, 1, 1, 2], dtype=torch.int32)
    qkv = torch.randn(5, HEADS + 2 * KV_HEADS, HEAD_DIM, generator=g)
    return qkv, pool, positions, row_seq, tables


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.int8])
def test_rows_attend_over_their_own_blocks_after_every_row_wrote_its_kv(threads, kv_dtype):
    qkv, pool, positions, row_seq, tables = _case(seed=threads)
    pool = to_pool(pool, kv_dtype)
    expected, expected_pool = _reference(qkv, pool, positions, row_seq, tables)
    attention = PagedAttention(load(), HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5)
    got = attention(qkv, pool, positions, row_seq, tables, threads)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(pool, expected_pool)


def test_a_block_table_out_of_range_is_refused_and_the_pool_left_as_it_was():
    qkv, pool, positions, row_seq, tables = _case(seed=7)
    tables[2, 0] = BLOCKS  # one past the pool
    before = pool.clone()
    attention = PagedAttention(load(), HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5)
    with pytest.raises(RuntimeError, match="out of range"):
        attention(qkv, pool, positions, row_seq, tables, 1)
    assert torch.equal(pool, before)


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


def test_a_mixed_step_matches_the_gather_and_sdpa_path(make_engine):
    """Decodes of different lengths, a short chunk (paged) and a long chunk (SDPA) in one
    step give the logits the gather + SDPA path gives."""

    def step_logits(paged: bool) -> torch.Tensor:
        engine = make_engine(block_size=4)
        if not paged:
            engine.runner.model.paged = None
        seqs = [
            Sequence(f"s{i}", _prompt(n, i), SamplingParams())
            for i, n in enumerate((9, 30, 17, 40))
        ]
        for seq in seqs:  # fill the cache up to the last few tokens, one chunk each
            keep = {"s0": 1, "s1": 1, "s2": 3, "s3": 12}[seq.request_id]
            n = len(seq) - keep
            assert engine.kv.allocate(seq, n)
            engine.runner.run(ScheduledBatch([seq], [n]))
            seq.num_computed_tokens = n
        counts = [seq.num_uncomputed_tokens for seq in seqs]
        for seq, n in zip(seqs, counts, strict=True):
            assert engine.kv.allocate(seq, seq.num_computed_tokens + n)
        _, logits = engine.runner.run(ScheduledBatch(seqs, counts), all_logits=True)
        return logits

    torch.testing.assert_close(step_logits(True), step_logits(False), atol=1e-4, rtol=1e-4)
