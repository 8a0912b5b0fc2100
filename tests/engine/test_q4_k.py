"""GGUF's Q4_K held in its own blocks (quantized.Q4_K): the file's values bit for bit, and
every product the engine runs on Q4_1 blocks taking them with the file's own scales."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from inference.engine.formats.ggml_types import GGMLType, ggml_type
from inference.engine.formats.gguf_file import GGUFTensor
from inference.engine.formats.gguf_model import _as_q4_k
from inference.engine.quantized import Q4_1, Q4_K
from tests.engine.conftest import needs_kernels, run_in_avx2_build
from tests.engine.test_quantized import _panel_rows

Q4_K_TYPE = ggml_type(12, "test")


def random_k_tensor(
    type_: GGMLType, block_bytes: int, halves: tuple[int, ...], sigma: float, name: str,
    rows: int, k: int, seed: int,
) -> GGUFTensor:  # fmt: skip
    """A K-quant tensor of random bytes, as a file holds it, whose float16 fields (at
    `halves` in each 256's `block_bytes`) are finite: normal with `sigma`."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, k // 256, block_bytes), dtype=np.uint8)
    for offset in halves:
        scale = (rng.standard_normal((rows, k // 256, 1)) * sigma).astype(np.float16)
        raw[..., offset : offset + 2] = scale.view(np.uint8)
    raw2 = torch.from_numpy(raw.reshape(rows, -1))
    return GGUFTensor(name, type_, (rows, k), raw2)


def random_q4_k_tensor(rows: int, k: int, seed: int) -> GGUFTensor:
    """A Q4_K tensor of random bytes with finite float16 d and dmin."""
    return random_k_tensor(Q4_K_TYPE, 144, (0, 2), 0.01, "blk.0.ffn_up.weight", rows, k, seed)


def gguf_values(t: GGUFTensor) -> torch.Tensor:
    """The tensor's values as gguf's own dequantization gives them."""
    kind = GGMLQuantizationType[t.type.name]
    return torch.from_numpy(dequantize(t.raw.numpy(), kind).copy())


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_q4_k_blocks_hold_the_files_values_bit_for_bit():
    t = random_q4_k_tensor(21, 512, seed=0)
    want = gguf_values(t)
    blocks = _as_q4_k(t)
    assert isinstance(blocks, Q4_K)
    assert same_bits(blocks.dequantize(), want)
    assert same_bits(blocks.for_kernel().dequantize(), want)
    # Slices, reordered rows and joins keep them too (a fused product, a tensor-parallel
    # shard, the q/k rows llama.cpp's converter reorders).
    order = torch.randperm(21, generator=torch.Generator().manual_seed(1))
    assert same_bits(blocks.take_rows(order).for_kernel().dequantize(), want[order])
    assert same_bits(blocks.rows(3, 11).dequantize(), want[3:11])
    assert same_bits(blocks.cols(256, 512).dequantize(), want[:, 256:])
    joined = Q4_K.cat([blocks.rows(0, 5), blocks.rows(5, 21)]).for_kernel()
    assert same_bits(joined.dequantize(), want)
    with pytest.raises(ValueError, match="super-blocks"):
        blocks.cols(0, 128)
    with pytest.raises(ValueError, match="Q4_K joins Q4_K"):
        Q4_K.cat([blocks, Q4_1.quantize(want)])


def test_q4_k_holds_fewer_bytes_than_q4_1():
    blocks = _as_q4_k(random_q4_k_tensor(64, 2048, seed=2)).for_kernel()
    arrays = (blocks.qs, blocks.d, blocks.m, blocks.sc, blocks.mn)
    held = sum(x.numel() * x.element_size() for x in arrays)
    assert held * 8 / (64 * 2048) == 4.625  # Q4_1 with float16 scales: 5; the file: 4.5


def _as_q4_1(blocks: Q4_K) -> Q4_1:
    """The same weights as Q4_1 with each block's scale and offset rounded to float16 (how
    they were held before Q4_K's own blocks)."""
    d, m = blocks._scales()
    return Q4_1.from_values(blocks._values(), d.half(), m.half())


def _products(rows: int, n: int, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    blocks = _as_q4_k(random_q4_k_tensor(n, 512, seed=rows + n))
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    exact = x @ blocks.dequantize().T
    ours = blocks.for_kernel().matmul_t(x, kind)
    plain = _as_q4_1(blocks).for_kernel().matmul_t(x, kind)
    return ours, plain, exact


@needs_kernels
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 16, 17, 40])
@pytest.mark.parametrize("n", [24, 70])
@pytest.mark.parametrize("panels", [(0, 0), (1, 1)])
def test_q4_k_products_are_q4_1s_with_the_files_own_scales(rows, n, panels):
    """The 8-bit activations' products (the grouped tiles, and the panels where forced from
    one row) and the 16-bit ones (i16): each as Q4_1's product of the same weights, the
    only difference Q4_1's float16 rounding of each block's scale (2^-11 relative)."""
    with _panel_rows(*panels):
        for kind in ("int8", "i16"):
            ours, plain, exact = _products(rows, n, kind)
            scale = exact.abs().max().item()
            assert (ours - plain).abs().max().item() <= 2e-3 * scale, kind
            assert (ours - exact).abs().max().item() <= 0.05 * scale, kind


@needs_kernels
def test_q4_k_products_take_bf16_and_amx_where_they_run():
    from inference.engine import kernels

    kinds = [k for k, ok in (("bf16", kernels.bf16_gemm_available()),
                             ("amx", kernels.amx_available())) if ok]  # fmt: skip
    if not kinds:
        pytest.skip("no bf16 or AMX products on this CPU")
    for kind in kinds:
        ours, plain, exact = _products(33, 64, kind)
        scale = exact.abs().max().item()
        assert (ours - plain).abs().max().item() <= 5e-3 * scale, kind


@needs_kernels
def test_the_avx2_builds_q4_k_products_agree_too():
    code = (
        "from tests.engine.test_q4_k import _products\n"
        "for rows in (1, 3, 4, 17, 40):\n"
        "    for kind in ('int8', 'i16'):\n"
        "        ours, plain, exact = _products(rows, 70, kind)\n"
        "        scale = exact.abs().max().item()\n"
        "        assert (ours - plain).abs().max().item() <= 2e-3 * scale, (rows, kind)\n"
        "print('agreed')\n"
    )
    run_in_avx2_build(code)
