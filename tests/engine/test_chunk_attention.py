"""The prompts' chunk attention (kernels/chunk_attention.c) against SDPA over the gathered
context, for every shape it takes: block sizes around its key groups, chunks that start
after a cached context or at position 0, grouped and plain heads, one and two threads, and
its bf16 products where the CPU has them (AVX512-BF16's tiles, and AMX's where they run:
chunk_attention_amx.c), over float32, float16 and int8 pools."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.bench.chunk_attention import amx_tiles, kinds
from inference.engine import kernels
from inference.engine.kv_codec import from_pool, to_pool
from tests.engine.conftest import needs_kernels

lib = kernels.load()
pytestmark = needs_kernels
# The tile kinds this CPU runs: name -> (bf16 products, AMX's tiles).
KINDS = kinds()


def _case(heads, kv_heads, head_dim, block_size, rows, cached, seed=0):
    g = torch.Generator().manual_seed(seed)
    ctx = cached + rows
    num_blocks = -(-ctx // block_size) + 5
    pool = torch.randn(2 * kv_heads, num_blocks, block_size, head_dim, generator=g)
    # The sequence's blocks in no particular order, as the allocator hands them out.
    table = torch.randperm(num_blocks, generator=g)[: -(-ctx // block_size)].to(torch.int64)
    qkv = torch.randn(rows, heads + 2 * kv_heads, head_dim, generator=g)
    positions = torch.arange(cached, ctx, dtype=torch.int64)
    return pool, table, qkv, positions


def _reference(pool, table, qkv, positions, heads, kv_heads, scale):
    d = pool.shape[-1]
    ctx = int(positions[-1]) + 1
    kv = torch.index_select(pool, 1, table).reshape(2 * kv_heads, -1, d)[:, :ctx]
    q = qkv[:, :heads].transpose(0, 1).unsqueeze(0)
    mask = torch.arange(ctx)[None, :] <= positions[:, None]
    out = F.scaled_dot_product_attention(
        q, kv[:kv_heads].unsqueeze(0), kv[kv_heads:].unsqueeze(0), attn_mask=mask,
        scale=scale, enable_gqa=True,
    )  # fmt: skip
    return out[0].transpose(0, 1)


def _run(pool, table, qkv, positions, heads, kv_heads, scale, bf16, threads, amx=False):
    _, num_blocks, block_size, _ = pool.shape
    d = qkv.shape[-1]
    shape = kernels.ChunkShape(
        heads=heads, kv_heads=kv_heads, head_dim=d, block_size=block_size,
        num_blocks=num_blocks, scale=scale, kv_type=kernels.kv_type(pool),
        bf16=int(bf16),
    )  # fmt: skip
    assert lib is not None
    with amx_tiles(lib, amx):
        return kernels.chunk_attention(lib, shape, qkv, positions, table, pool, threads)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.int8])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim",
    [(9, 3, 64), (4, 4, 64), (8, 2, 32), (6, 3, 64), (4, 2, 128), (4, 2, 96)],
)
@pytest.mark.parametrize(
    "block_size,rows,cached",
    [(16, 34, 700), (16, 100, 0), (4, 23, 0), (4, 9, 30), (5, 13, 17), (16, 2, 40), (32, 65, 33)],
)
def test_a_chunk_matches_sdpa_over_its_gathered_context(
    kv_dtype, kind, threads, heads, kv_heads, head_dim, block_size, rows, cached
):
    pool, table, qkv, positions = _case(heads, kv_heads, head_dim, block_size, rows, cached)
    pool = to_pool(pool, kv_dtype)
    scale = head_dim**-0.5
    bf16, amx = KINDS[kind]
    got = _run(pool, table, qkv, positions, heads, kv_heads, scale, bf16, threads, amx)
    assert got is not None
    # A float16 or int8 pool's values, exactly as the kernel reads them.
    values = from_pool(pool, head_dim, torch.float32)
    want = _reference(values, table, qkv, positions, heads, kv_heads, scale)
    # bf16 products: 8 bits of mantissa in queries, keys, weights and values.
    tol = 3e-2 if bf16 else 1e-5
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_rows_write_nothing_and_each_sees_only_up_to_its_own_position(kind):
    pool, table, qkv, positions = _case(9, 3, 64, 16, 20, 10)
    bf16, amx = KINDS[kind]
    before = pool.clone()
    got = _run(pool, table, qkv, positions, 9, 3, 0.125, bf16, 1, amx)
    assert torch.equal(pool, before)
    # Changing the keys and values past the first row's position moves every row but it.
    later = pool.clone()
    slots = [int(table[p // 16]) * 16 + p % 16 for p in range(11, 30)]
    later.view(6, -1, 64)[:, slots] += 1.0
    moved = _run(later, table, qkv, positions, 9, 3, 0.125, bf16, 1, amx)
    assert moved is not None and got is not None
    torch.testing.assert_close(moved[0], got[0])
    assert not torch.allclose(moved[1:], got[1:])


def test_a_position_past_the_block_table_is_refused():
    pool, table, qkv, positions = _case(9, 3, 64, 16, 8, 24)
    with pytest.raises(RuntimeError, match="past its block table"):
        _run(pool, table[:1], qkv, positions, 9, 3, 0.125, False, 1)


def test_a_shape_the_kernel_does_not_take_is_left_to_the_caller():
    # Query heads that are not a multiple of the KV heads: None, the model keeps SDPA.
    pool, table, qkv, positions = _case(5, 2, 64, 16, 4, 0)
    assert _run(pool, table, qkv, positions, 5, 2, 0.125, False, 1) is None
