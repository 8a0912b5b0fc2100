"""GGUF's Q5_K held in its own blocks (quantized.Q5_K): the file's values bit for bit, and
every product the engine runs on Q4_1 blocks taking them (values 0..31) with the file's own
scales."""

from __future__ import annotations

import pytest
import torch

from inference.engine import kernels
from inference.engine.formats.ggml_types import ggml_type
from inference.engine.formats.gguf_file import GGUFTensor
from inference.engine.formats.gguf_model import _as_q4_k, _as_q5_k
from inference.engine.quantized import Q4_1, Q4_K, Q5_K
from tests.engine.conftest import needs_kernels, run_in_avx2_build
from tests.engine.test_q4_k import gguf_values, random_k_tensor, random_q4_k_tensor, same_bits
from tests.engine.test_quantized import _panel_rows

Q5_K_TYPE = ggml_type(13, "test")


def random_q5_k_tensor(rows: int, k: int, seed: int) -> GGUFTensor:
    """A Q5_K tensor of random bytes with finite float16 d and dmin."""
    return random_k_tensor(Q5_K_TYPE, 176, (0, 2), 0.01, "blk.0.ffn_up.weight", rows, k, seed)


def test_q5_k_blocks_hold_the_files_values_bit_for_bit():
    t = random_q5_k_tensor(21, 512, seed=0)
    want = gguf_values(t)
    blocks = _as_q5_k(t)
    assert isinstance(blocks, Q5_K) and blocks.shape == (21, 512)
    assert same_bits(blocks.dequantize(), want)
    assert same_bits(blocks.for_kernel().dequantize(), want)
    # Slices, reordered rows and joins keep them too (a fused product, a tensor-parallel
    # shard, the q/k rows llama.cpp's converter reorders).
    order = torch.randperm(21, generator=torch.Generator().manual_seed(1))
    assert same_bits(blocks.take_rows(order).for_kernel().dequantize(), want[order])
    assert same_bits(blocks.rows(3, 11).dequantize(), want[3:11])
    assert same_bits(blocks.rows(3, 11).for_kernel().dequantize(), want[3:11])
    assert same_bits(blocks.cols(256, 512).dequantize(), want[:, 256:])
    assert same_bits(blocks.cols(256, 512).for_kernel().dequantize(), want[:, 256:])
    joined = Q5_K.cat([blocks.rows(0, 5), blocks.rows(5, 21)]).for_kernel()
    assert same_bits(joined.dequantize(), want)
    with pytest.raises(ValueError, match="super-blocks"):
        blocks.cols(0, 128)
    with pytest.raises(ValueError, match="Q5_K joins Q5_K"):
        Q5_K.cat([blocks, Q4_1.quantize(want)])
    # Q4_K's join keeps its own type: Q5_K parts would lose their fifth bits there.
    with pytest.raises(ValueError, match="Q4_K joins Q4_K"):
        Q4_K.cat([blocks, blocks])


def test_q4_k_joins_q5_k_as_q5_k_exactly():
    """A fused product of Q4_K and Q5_K matrices (layer_formats) holds the Q4_K ones as Q5_K
    with every fifth bit 0: the Q4_K file's values bit for bit, in either layout."""
    q4 = random_q4_k_tensor(13, 512, seed=3)
    q5 = random_q5_k_tensor(11, 512, seed=4)
    as_q5 = _as_q5_k(q4)
    assert isinstance(as_q5, Q5_K)
    assert same_bits(as_q5.dequantize(), gguf_values(q4))
    assert same_bits(as_q5.for_kernel().dequantize(), _as_q4_k(q4).dequantize())
    joined = Q5_K.cat([as_q5, _as_q5_k(q5)]).for_kernel()
    assert same_bits(joined.dequantize(), torch.cat([gguf_values(q4), gguf_values(q5)]))


def test_q5_k_holds_its_bits_and_no_more():
    blocks = _as_q5_k(random_q5_k_tensor(64, 2048, seed=2)).for_kernel()
    arrays = (blocks.qs, blocks.d, blocks.m, blocks.sc, blocks.mn, blocks.qh)
    held = sum(x.numel() * x.element_size() for x in arrays)
    assert held * 8 / (64 * 2048) == 5.625  # the file: 5.5; as Q8_0: 9


def _at_bits(x: torch.Tensor, top: float) -> torch.Tensor:
    """x as the kernels quantize it per block of 32 (activations.c, panel_gemm.c's row16):
    scale max|x| / top, q = round(x * (1 / scale)) to nearest even."""
    b = x.reshape(x.shape[0], -1, 32)
    d = b.abs().amax(-1, keepdim=True) / top
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    return (torch.round(b * inv) * d).reshape(x.shape)


# The activations each product takes, as their values in float: kernels.q4_1_gemm's kinds.
_ACTIVATIONS = {
    "int8": lambda x: _at_bits(x, 127.0),
    "i16": lambda x: _at_bits(x, 32767.0),
    "bf16": lambda x: x.bfloat16().float(),
    "amx": lambda x: x.bfloat16().float(),
}


def _products(rows: int, n: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' product on random Q5_K blocks, and the same product in float64 on the
    dequantized weights with x at the same activations' precision (AMX's weights rounded to
    bf16 as its tiles hold them)."""
    blocks = _as_q5_k(random_q5_k_tensor(n, 512, seed=rows + n))
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    w = blocks.dequantize()
    if kind == "amx":
        w = w.bfloat16().float()
    want = _ACTIVATIONS[kind](x).double() @ w.double().T
    return blocks.for_kernel().matmul_t(x, kind), want.float()


def _agree(ours: torch.Tensor, want: torch.Tensor, tol: float = 1e-5) -> float:
    err = (ours - want).abs().max().item() / want.abs().max().item()
    assert err <= tol, err
    return err


@needs_kernels
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 16, 17, 40])
@pytest.mark.parametrize("n", [24, 70])
@pytest.mark.parametrize("panels", [(0, 0), (1, 1)])
def test_q5_k_products_are_the_dequantized_weights(rows, n, panels):
    """The 8-bit activations' products (the grouped tiles, and the panels where forced from
    one row) and the 16-bit ones (i16): the float product of the file's values with x at
    the same precision, but for the order of float sums."""
    with _panel_rows(*panels):
        for kind in ("int8", "i16"):
            _agree(*_products(rows, n, kind))


@needs_kernels
def test_q5_k_products_take_bf16_and_amx_where_they_run():
    kinds = [k for k, ok in (("bf16", kernels.bf16_gemm_available()),
                             ("amx", kernels.amx_available())) if ok]  # fmt: skip
    if not kinds:
        pytest.skip("no bf16 or AMX products on this CPU")
    for kind in kinds:
        for rows in (1, 8, 33):
            _agree(*_products(rows, 64, kind), tol=1e-4)


@needs_kernels
def test_the_avx2_builds_q5_k_products_agree_too():
    code = (
        "from tests.engine.test_q5_k import _agree, _panel_rows, _products\n"
        "for panels in ((0, 0), (1, 1)):\n"
        "    with _panel_rows(*panels):\n"
        "        for rows in (1, 3, 4, 17, 40):\n"
        "            for kind in ('int8', 'i16'):\n"
        "                _agree(*_products(rows, 70, kind))\n"
        "print('agreed')\n"
    )
    run_in_avx2_build(code)
