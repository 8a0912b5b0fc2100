"""The native path's attention (kernels/decode_attention.c) against softmax(q K^T) V in torch,
for every shape its kernels branch on: query heads per KV head (the decode row's heads of
one KV head in one pass for 2 to 4, head after head otherwise), head_dim (512-bit vectors
for multiples of 16 up to 128; 256-bit for 8 to 128 by powers of two in one pass, for other
multiples of 8 head after head; scalar otherwise), contexts
ending on and beside block edges over scattered blocks, a chunk's rows in tiles, and the
pool's two formats (float32, float16)."""

from __future__ import annotations

import pytest
import torch

from inference.engine import kernels
from tests.engine.conftest import needs_kernels, run_in_avx2_build

pytestmark = needs_kernels

BLOCK = 16
# Contexts (positions + 1) of the rows alone: one position, a block's edge and its
# neighbours, several blocks, a partial last block.
CONTEXTS = [1, 15, 16, 17, 100, 257]


def _reference(qkv, positions, tables, pool, heads, kv_heads, scale):
    d = qkv.shape[-1]
    group = heads // kv_heads
    out = torch.empty(qkv.shape[0], heads, d, dtype=torch.float64)
    for r in range(qkv.shape[0]):
        ctx = int(positions[r]) + 1
        blocks = tables[r, : -(-ctx // BLOCK)]
        for h in range(heads):
            g = h // group
            keys = pool[g, blocks].reshape(-1, d)[:ctx].double()
            vals = pool[kv_heads + g, blocks].reshape(-1, d)[:ctx].double()
            w = torch.softmax(keys @ qkv[r, h].double() * scale, dim=0)
            out[r, h] = w @ vals
    return out


def _case(heads, kv_heads, d, seed=0):
    """Rows alone over scattered blocks, then one sequence's chunk of three rows."""
    gen = torch.Generator().manual_seed(seed)
    width = -(-max(CONTEXTS) // BLOCK)
    num_blocks = width * (len(CONTEXTS) + 1) + 3
    pool = torch.randn(2 * kv_heads, num_blocks, BLOCK, d, generator=gen)
    # Every row's blocks distinct and out of order, as many chats' blocks interleave.
    order = torch.randperm(num_blocks, generator=gen)
    tables = [order[i * width : (i + 1) * width] for i in range(len(CONTEXTS) + 1)]
    chunk_table = tables.pop()
    positions = [c - 1 for c in CONTEXTS] + [40, 41, 42]
    table = torch.stack(tables + [chunk_table] * 3).contiguous()
    qkv = torch.randn(len(positions), heads + 2 * kv_heads, d, generator=gen)
    return qkv, torch.tensor(positions, dtype=torch.int64), table, pool


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [
        (4, 2, 16),  # the tiny test model's: 2 heads a group, 16 wide
        (6, 2, 16),
        (8, 2, 16),
        (9, 3, 64),  # the default model's
        (8, 2, 32),
        (4, 1, 64),
        (10, 2, 64),  # 5 a group: head after head
        (4, 4, 64),  # no grouping
        (4, 2, 128),
        (6, 2, 128),
        (4, 2, 8),
        (4, 2, 40),  # 256-bit vectors, head after head
        (4, 2, 12),  # scalar
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_decode_attention_is_softmax_of_the_scores_times_the_values(
    heads, kv_heads, head_dim, threads, kv_dtype
):
    _check(heads, kv_heads, head_dim, threads, kv_dtype)


def _check(heads: int, kv_heads: int, head_dim: int, threads: int, kv_dtype: torch.dtype) -> None:
    lib = kernels.load()
    qkv, positions, tables, pool = _case(heads, kv_heads, head_dim)
    pool = pool.to(kv_dtype)
    scale = head_dim**-0.5
    shape = kernels.LayerShape(
        heads * head_dim, heads, kv_heads, head_dim, 4 * heads * head_dim, 1e-5, scale,
        BLOCK, pool.shape[1], int(kv_dtype == torch.float16),
    )  # fmt: skip
    got = kernels.decode_attention(lib, shape, qkv, positions, tables, pool, threads)
    # A float16 pool's values, exactly as the kernels read them.
    want = _reference(qkv, positions, tables, pool.float(), heads, kv_heads, scale)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


def test_the_avx2_builds_attention_where_the_cpu_has_avx512_too():
    """The 256-bit passes serve CPUs without AVX512; on one that has it they are built only
    when asked (ENGINE_KERNELS_AVX512=0), so a process of their own checks the shapes they
    branch on, both pool formats, wherever the suite runs."""
    code = (
        "import torch\n"
        "from inference.engine import kernels\n"
        "from tests.engine.test_decode_attention import _check\n"
        "assert '-mavx512f' not in kernels.cpu_build_flags()\n"
        "for shape in ((9, 3, 64), (4, 2, 16), (8, 2, 128), (4, 1, 64), (4, 4, 64), (4, 2, 40)):\n"
        "    for dtype in (torch.float32, torch.float16):\n"
        "        _check(*shape, 2, dtype)\n"
        "print('agreed')\n"
    )
    run_in_avx2_build(code)
