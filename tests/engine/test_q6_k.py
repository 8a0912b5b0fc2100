"""GGUF's Q6_K held in its own blocks (quantized.Q6_K): the file's values bit for bit, and
every product the engine runs on Q8_0 blocks taking them with the file's own scales."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from inference.engine import kernels
from inference.engine.formats.ggml_types import ggml_type
from inference.engine.formats.gguf_file import GGUFTensor
from inference.engine.formats.gguf_model import _as_kernel_q6_k, _as_q6_k
from inference.engine.kernels.library import library_path
from inference.engine.quantized import Q6_K, Q8_0
from tests.engine.conftest import needs_kernels, run_in_avx2_build
from tests.engine.test_q4_k import gguf_values, random_k_tensor, same_bits
from tests.engine.test_quantized import _panel_rows

Q6_K_TYPE = ggml_type(14, "test")


def random_q6_k_tensor(rows: int, k: int, seed: int) -> GGUFTensor:
    """A Q6_K tensor of random bytes with a finite float16 d."""
    return random_k_tensor(Q6_K_TYPE, 210, (208,), 0.001, "blk.0.ffn_down.weight", rows, k, seed)


def test_q6_k_blocks_hold_the_files_values_bit_for_bit():
    t = random_q6_k_tensor(21, 512, seed=0)
    want = gguf_values(t)
    blocks = _as_q6_k(t)
    assert isinstance(blocks, Q6_K) and blocks.shape == (21, 512)
    assert same_bits(blocks.dequantize(), want)
    assert same_bits(blocks.for_kernel().dequantize(), want)
    # The head's, made straight into the kernel layout a few groups of rows at a time.
    head = _as_kernel_q6_k(t)
    assert head.kernel and same_bits(head.dequantize(), want)
    assert torch.equal(head.qs, blocks.for_kernel().qs)
    # Slices, reordered rows and joins keep them too (a fused product, a tensor-parallel
    # shard, the q/k rows llama.cpp's converter reorders).
    order = torch.randperm(21, generator=torch.Generator().manual_seed(1))
    assert same_bits(blocks.take_rows(order).for_kernel().dequantize(), want[order])
    assert same_bits(blocks.rows(3, 11).dequantize(), want[3:11])
    assert same_bits(blocks.cols(256, 512).dequantize(), want[:, 256:])
    joined = Q6_K.cat([blocks.rows(0, 5), blocks.rows(5, 21)]).for_kernel()
    assert same_bits(joined.dequantize(), want)
    with pytest.raises(ValueError, match="super-blocks"):
        blocks.cols(0, 128)
    with pytest.raises(ValueError, match="Q6_K joins Q6_K"):
        Q6_K.cat([blocks, Q8_0.quantize(want)])


def test_the_embedding_lookup_reads_q6_k_rows():
    """A tied embedding / head held as Q6_K: its rows looked up in either layout are the
    file's."""
    t = random_q6_k_tensor(37, 256, seed=3)
    want = gguf_values(t)
    ids = torch.tensor([[0, 36, 8], [7, 7, 15]])
    for blocks in (_as_q6_k(t), _as_kernel_q6_k(t)):
        assert same_bits(blocks.embedding(ids), want[ids])


def test_q6_k_holds_fewer_bytes_than_q8_0():
    blocks = _as_q6_k(random_q6_k_tensor(64, 2048, seed=2)).for_kernel()
    held = sum(x.numel() * x.element_size() for x in (blocks.qs, blocks.d, blocks.sc))
    assert held * 8 / (64 * 2048) == 6.5625  # Q8_0 with float32 scales: 9; the file: 6.5625


def _products(
    rows: int, n: int, kind: str, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    blocks = _as_q6_k(random_q6_k_tensor(n, 512, seed=rows + n + seed))
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    exact = x @ blocks.dequantize().T
    ours = blocks.for_kernel().matmul_t(x, kind)
    # The same weights as Q8_0 blocks (within half an 8-bit step), by Q8_0's product.
    wide = Q8_0.quantize(blocks.dequantize()).for_kernel().matmul_t(x, kind)
    return ours, wide, exact


@contextmanager
def _amx_rows(layers: int, head: int) -> Iterator[None]:
    lib = kernels.load()
    assert lib is not None
    lib.set_amx_min_rows(layers, head)
    try:
        yield
    finally:
        lib.set_amx_min_rows(*kernels.backend().kernel_min_rows()[0])


@needs_kernels
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 16, 17, 40])
@pytest.mark.parametrize("n", [24, 70])
@pytest.mark.parametrize("panels", [(0, 0), (1, 1)])
def test_q6_k_products_are_the_exact_ones(rows, n, panels):
    """The 16-bit activations' products, the layers' ("i16") and the head's ("q8_0"), off
    AMX's tiles: the grouped tiles and the panels (forced from one row) give the exact
    product within 16-bit x's rounding, closer than Q8_0's of the same weights."""
    with _amx_rows(0, 0), _panel_rows(*panels):
        for kind in ("i16", "q8_0"):
            ours, wide, exact = _products(rows, n, kind)
            scale = exact.abs().max().item()
            assert (ours - exact).abs().max().item() <= 1e-4 * scale, kind
            assert (wide - exact).abs().max().item() <= 2e-2 * scale, kind


@needs_kernels
def test_q6_k_products_take_amx_where_it_runs():
    if not kernels.amx_available():
        pytest.skip("no AMX tiles on this CPU")
    with _amx_rows(1, 1):
        for rows in (1, 33):
            ours, wide, exact = _products(rows, 64, "q8_0")
            err = ((ours - exact).norm() / exact.norm()).item()
            wide_err = ((wide - exact).norm() / exact.norm()).item()
            assert err < 5e-3 and err < wide_err, (rows, err, wide_err)


@needs_kernels
def test_the_avx2_builds_q6_k_products_agree_too():
    code = (
        "from tests.engine.test_q6_k import _products\n"
        "from tests.engine.test_quantized import _panel_rows\n"
        "for panels in ((0, 0), (1, 1)):\n"
        "    with _panel_rows(*panels):\n"
        "        for rows in (1, 3, 4, 17, 40):\n"
        "            for kind in ('i16', 'q8_0'):\n"
        "                ours, wide, exact = _products(rows, 70, kind)\n"
        "                scale = exact.abs().max().item()\n"
        "                assert (ours - exact).abs().max().item() <= 1e-4 * scale, (rows, kind)\n"
        "print('agreed')\n"
    )
    run_in_avx2_build(code)


@needs_kernels
def test_the_kernels_self_check_takes_q6_k():
    isa = kernels.loaded_isa()
    assert isa is not None
    check = [sys.executable, "-m", "inference.engine.kernel_check", str(library_path(isa))]
    done = subprocess.run(check, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@needs_kernels
def test_q6_k_products_hold_at_the_extremes():
    """Every weight at its largest magnitude (q - 32 = -32, scale -128) against x at its
    block's largest: the panels' block sums (15-bit x times scaled weights) and the
    grouped tiles' (16-bit x, per 16) stay within int32."""
    n, k = 16, 256
    qs = torch.zeros(n, k * 3 // 4, dtype=torch.uint8)  # q = 0: q - 32 = -32
    sc = torch.full((n, k // 16), -128, dtype=torch.int8)
    d = torch.full((n, k // 256), 0.001, dtype=torch.float16)
    blocks = Q6_K(qs, d, sc=sc).for_kernel()
    x = torch.ones(3, k)
    exact = x @ blocks.dequantize().T
    with _amx_rows(0, 0):
        for panels in ((0, 0), (1, 1)):
            with _panel_rows(*panels):
                for kind in ("i16", "q8_0"):
                    got = blocks.matmul_t(x, kind)
                    assert torch.allclose(got, exact, rtol=1e-4), (panels, kind)


def _as_8bit_x(x: torch.Tensor) -> torch.Tensor:
    """x as the 8-bit activations hold it (activations.c: per 32, max|x| / 127, to nearest
    even), in float64."""
    rows, k = x.shape
    xb = x.double().reshape(rows, k // 32, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127
    q = torch.round(xb / torch.where(d > 0, d, torch.ones_like(d)))
    return (q * d).reshape(rows, k)


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 5, 9, 17])
@pytest.mark.parametrize("panels", [0, 1])
def test_the_native_paths_8bit_layer_products_are_exact_on_their_activations(rows, panels):
    """A GGUF's Q8_0 and Q6_K layers on the native path (kernels.q8_0_layers_gemm): with
    AVX512-VNNI, x at 8 bits a block as llama.cpp takes them, the weights offset to unsigned
    and the offsets taken off in integers; the product then equals float64's on those
    activations (grouped tiles and panels, both formats). Elsewhere the 16-bit product:
    within its rounding of the exact one."""
    lib = kernels.load()
    assert lib is not None
    eight_bit = kernels.backend().vnni
    g = torch.Generator().manual_seed(rows)
    for n in (24, 200):
        x = torch.randn(rows, 512, generator=g)
        x[:, 7] *= 30
        for w in (
            _as_kernel_q6_k(random_q6_k_tensor(n, 512, rows)),
            Q8_0.quantize(torch.randn(n, 512, generator=g) * 0.05).for_kernel(),
        ):
            sc = w.k_parts()
            with _panel_rows(0, panels):
                got = kernels.q8_0_layers_gemm(lib, w.qs, w.d, x, w.n, sc).double()
            on_8bit = eight_bit
            want = (_as_8bit_x(x) if on_8bit else x.double()) @ w.dequantize().double().T
            bound = 1e-6 if on_8bit else 5e-4  # 16 bits a block, one x 30x its block
            assert (got - want).abs().max() <= bound * want.abs().max(), (type(w).__name__, n)


@needs_kernels
def test_the_8bit_layer_products_hold_at_the_extremes():
    """Q8_0's largest weights (q + 128: 255 or 1) and Q6_K's (q 63 or 0, offset -32) against
    x at its block's largest: the 8-bit products' offset integer sums stay within int32."""
    lib = kernels.load()
    assert lib is not None
    n, k = 16, 256
    x = torch.ones(3, k)
    x[1] *= -1
    q6 = Q6_K(
        torch.zeros(n, k * 3 // 4, dtype=torch.uint8),
        torch.full((n, k // 256), 0.001, dtype=torch.float16),
        sc=torch.full((n, k // 16), -128, dtype=torch.int8),
    ).for_kernel()
    q8 = Q8_0.quantize(torch.full((n, k), -1.0)).for_kernel()
    for w in (q6, q8):
        exact = x @ w.dequantize().T
        for panels in (0, 1):
            with _panel_rows(0, panels):
                got = kernels.q8_0_layers_gemm(lib, w.qs, w.d, x, w.n, w.k_parts())
            assert torch.allclose(got, exact, rtol=1e-4), (type(w).__name__, panels)
