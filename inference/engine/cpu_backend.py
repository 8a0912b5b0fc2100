"""The CPU backend: which instruction set the native kernels are built and loaded for.

The only place that knows ISAs. The build (python -m inference.engine.kernels.build) tries
them best first and keeps each that compiles and passes its self-check; a process loads the
best built one its CPU can run (kernels.load).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Isa:
    """One build of the kernels: the CPU flags it needs (as /proc/cpuinfo names them) and the
    compiler flags that make it."""

    name: str
    needs: frozenset[str]
    cc_flags: tuple[str, ...]


AVX2 = Isa("avx2", frozenset({"avx2", "fma", "f16c"}), ("-mavx2", "-mfma", "-mf16c"))
# VNNI's one-instruction 8-bit dot products and 512-bit 16-bit products (panel_gemm.c's
# 8-row tiles, the 512-bit decode attention).
AVX512 = Isa(
    "avx512",
    AVX2.needs | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"},
    (*AVX2.cc_flags, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"),
)
# AVX512-BF16's pair products: the prompts' attention (chunk_attention.c) and the
# bf16-activation 4-bit product.
AVX512_BF16 = Isa("avx512_bf16", AVX512.needs | {"avx512_bf16"}, (*AVX512.cc_flags, "-mavx512bf16"))
# AMX's bf16 tiles: the 4-bit products of many rows (amx_gemm.c).
AMX = Isa(
    "amx",
    AVX512_BF16.needs | {"amx_tile", "amx_bf16"},
    (*AVX512_BF16.cc_flags, "-mamx-tile", "-mamx-bf16"),
)
# Best first: the build's fallback chain, and the order a process looks for a build in.
ISAS = (AMX, AVX512_BF16, AVX512, AVX2)


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's flags as the kernel sees them (/proc/cpuinfo), not the compiler's own
    -march=native probe, which on some virtual machines enables what the host hides."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def supported_isas() -> list[Isa]:
    """The builds this CPU can run, best first: what the build makes."""
    return [i for i in ISAS if i.needs <= cpu_flags()]


def runnable_isas() -> list[Isa]:
    """The builds a process may load here, best first (ENGINE_KERNELS_AVX512=0: AVX2's
    alone, for comparisons)."""
    avx512 = os.environ.get("ENGINE_KERNELS_AVX512", "1") not in ("0", "false", "no")
    return [i for i in supported_isas() if avx512 or i is AVX2]


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: only there is bfloat16 faster than float32 on a CPU."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def cpu_has_amx() -> bool:
    """AMX tiles for bf16: there oneDNN's bf16 products outrun the 8-bit blocks early."""
    return "amx_bf16" in cpu_flags()
