"""The native path's attention (kernels/decode_attention.c) against softmax(q K^T) V in torch,
for every shape its kernels branch on: query heads per KV head (the decode row's heads of
one KV head in one pass for 2 to 4, head after head otherwise), head_dim (512-bit vectors
for multiples of 16 up to 128; 256-bit for 8 to 128 by powers of two in one pass, for other
multiples of 8 head after head; scalar otherwise), contexts
ending on and beside block edges over scattered blocks, a sequence's several rows, and the
pool's formats (float32, float16, int8 rows with their scales)."""

from __future__ import annotations

import pytest
import torch

from inference.engine import kernels
from inference.engine.kv_codec import from_pool, to_pool
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


# A sequence's rows, as many as the native path takes of a chunk.
CHUNK = 8


def _case(heads, kv_heads, d, seed=0):
    """Rows alone over scattered blocks, then one sequence's chunk of CHUNK rows."""
    gen = torch.Generator().manual_seed(seed)
    width = -(-max(CONTEXTS) // BLOCK)
    num_blocks = width * (len(CONTEXTS) + 1) + 3
    pool = torch.randn(2 * kv_heads, num_blocks, BLOCK, d, generator=gen)
    # Every row's blocks distinct and out of order, as many chats' blocks interleave.
    order = torch.randperm(num_blocks, generator=gen)
    tables = [order[i * width : (i + 1) * width] for i in range(len(CONTEXTS) + 1)]
    chunk_table = tables.pop()
    positions = [c - 1 for c in CONTEXTS] + list(range(40, 40 + CHUNK))
    table = torch.stack(tables + [chunk_table] * CHUNK).contiguous()
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
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.int8])
def test_decode_attention_is_softmax_of_the_scores_times_the_values(
    heads, kv_heads, head_dim, threads, kv_dtype
):
    _check(heads, kv_heads, head_dim, threads, kv_dtype)


def _check(heads: int, kv_heads: int, head_dim: int, threads: int, kv_dtype: torch.dtype) -> None:
    lib = kernels.load()
    qkv, positions, tables, pool = _case(heads, kv_heads, head_dim)
    pool = to_pool(pool, kv_dtype)
    scale = head_dim**-0.5
    shape = kernels.LayerShape(
        heads * head_dim, heads, kv_heads, head_dim, 4 * heads * head_dim, 1e-5, scale,
        BLOCK, pool.shape[1], kernels.kv_type(pool),
    )  # fmt: skip
    got = kernels.decode_attention(lib, shape, qkv, positions, tables, pool, threads)
    # A float16 or int8 pool's values, exactly as the kernels read them.
    values = from_pool(pool, head_dim, torch.float32)
    want = _reference(qkv, positions, tables, values, heads, kv_heads, scale)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.int8])
@pytest.mark.parametrize("run", [2, 5, 8])
def test_a_sequences_few_rows_come_out_as_each_row_alone(run, kv_dtype):
    """A decode's speculative guesses (a run of up to 8 rows of one sequence) give each row
    the bits it gets in a step of its own: greedy speculation then keeps plain decoding's
    text. Beside rows of other sequences too."""
    lib = kernels.load()
    heads, kv_heads, d = 9, 3, 64
    qkv, positions, tables, pool = _case(heads, kv_heads, d)
    pool = to_pool(pool, kv_dtype)
    # Two rows of other sequences, then the run: one sequence's consecutive positions.
    rows = [0, 4] + [len(CONTEXTS) + i for i in range(run)]
    qkv, positions, tables = qkv[rows].contiguous(), positions[rows], tables[rows].contiguous()
    shape = kernels.LayerShape(
        heads * d, heads, kv_heads, d, 4 * heads * d, 1e-5, d**-0.5,
        BLOCK, pool.shape[1], kernels.kv_type(pool),
    )  # fmt: skip
    together = kernels.decode_attention(lib, shape, qkv, positions, tables, pool, 2)
    for r in range(len(rows)):
        alone = kernels.decode_attention(
            lib, shape, qkv[r : r + 1].contiguous(), positions[r : r + 1],
            tables[r : r + 1].contiguous(), pool, 2,
        )  # fmt: skip
        assert torch.equal(together[r], alone[0]), r


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
        "    for dtype in (torch.float32, torch.float16, torch.int8):\n"
        "        _check(*shape, 2, dtype)\n"
        "print('agreed')\n"
    )
    run_in_avx2_build(code)
