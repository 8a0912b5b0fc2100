"""The build's self-check of one built kernels library, in a process of its own (an
instruction the CPU refuses kills this process, not the build):

    python -m inference.engine.kernel_check PATH

A few 4-, 5-, 6- and 8-bit products against torch's, with the panels, AMX's tiles and the
grouped tiles' column pairs forced on and off; exits non-zero with what differed.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import torch

from inference.engine import kernels
from inference.engine.quantized import Q4_1, Q4_K, Q5_K, Q6_K, Q8_0


def check(path: Path) -> None:
    """A few products of the library at `path` against torch's, with the panels and AMX's
    tiles forced on and off; SystemExit with what differed."""
    lib = ctypes.CDLL(str(path))
    kernels.declare(lib)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 256, generator=g)
    w = torch.randn(64, 256, generator=g) * 0.05
    q4 = Q4_1.quantize(w).for_kernel()
    q8 = Q8_0.quantize(w).for_kernel()
    qk = random_q4_k(64, 256, g).for_kernel()
    q5 = random_q5_k(64, 256, g).for_kernel()
    q6 = random_q6_k(64, 256, g).for_kernel()
    kinds = ["int8", "i16"]
    kinds += ["bf16"] if lib.q4_1_bf16_available() else []
    kinds += ["amx"] if lib.q4_1_amx_available() else []
    # The grouped tiles one column group a tile and two (q4_pair_tile), then the panels and
    # AMX's tiles.
    for tiles, pairs in (((0, 0), 0), ((0, 0), 1), ((1, 1), 0)):
        lib.set_panel_min_rows(*tiles)
        lib.set_amx_min_rows(*tiles)
        lib.set_pair_min_rows(pairs, pairs)
        for kind in kinds:
            got = kernels.q4_1_gemm(lib, q4.qs, q4.d, q4.m, x, q4.n, kind)
            _agree(f"q4_1 {kind}, tiles from {tiles[0]} rows", got, x @ q4.dequantize().T)
            got = kernels.q4_1_gemm(lib, qk.qs, qk.d, qk.m, x, qk.n, kind, qk.sc, qk.mn)
            _agree(f"q4_k {kind}, tiles from {tiles[0]} rows", got, x @ qk.dequantize().T)
            got = kernels.q4_1_gemm(lib, q5.qs, q5.d, q5.m, x, q5.n, kind, q5.sc, q5.mn, q5.qh)
            _agree(f"q5_k {kind}, tiles from {tiles[0]} rows", got, x @ q5.dequantize().T)
        got = kernels.q8_0_gemm(lib, q8.qs, q8.d, x, q8.n)
        _agree(f"q8_0, tiles from {tiles[0]} rows", got, x @ q8.dequantize().T)
        got = kernels.q8_0_gemm(lib, q6.qs, q6.d, x, q6.n, sc=q6.sc)
        _agree(f"q6_k, tiles from {tiles[0]} rows", got, x @ q6.dequantize().T)


def random_q4_k(n: int, k: int, g: torch.Generator) -> Q4_K:
    """Q4_K blocks of random nibbles, 6-bit scales and minimums, in GGUF's layout."""
    qs = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    sc, mn = (torch.randint(0, 64, (n, k // 32), generator=g, dtype=torch.uint8) for _ in "ab")
    d = (torch.rand(n, k // 256, generator=g) * 0.004).half()
    m = (torch.rand(n, k // 256, generator=g) * -0.004).half()
    return Q4_K(qs, d, m, sc=sc, mn=mn)


def random_q5_k(n: int, k: int, g: torch.Generator) -> Q5_K:
    """Q5_K blocks of random values (fifth bits too), scales and minimums, in GGUF's layout."""
    q4 = random_q4_k(n, k, g)
    qh = torch.randint(0, 256, (n, k // 8), generator=g, dtype=torch.uint8)
    return Q5_K(q4.qs, q4.d, q4.m, sc=q4.sc, mn=q4.mn, qh=qh)


def random_q6_k(n: int, k: int, g: torch.Generator) -> Q6_K:
    """Q6_K blocks of random 6-bit values and int8 scales, in GGUF's layout."""
    qs = torch.randint(0, 256, (n, k * 3 // 4), generator=g, dtype=torch.uint8)
    sc = torch.randint(-128, 128, (n, k // 16), generator=g, dtype=torch.int8)
    d = (torch.rand(n, k // 256, generator=g) * 0.001).half()
    return Q6_K(qs, d, sc=sc)


def _agree(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    err = ((got - want).norm() / want.norm()).item()
    if not err < 0.02:  # 8-bit or bf16 activations: within about a percent
        raise SystemExit(f"{what}: relative error {err:.3g}")


if __name__ == "__main__":
    check(Path(sys.argv[1]))
