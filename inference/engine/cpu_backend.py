"""The CPU backend: which instruction set the native kernels are built and loaded for and,
for the build a process loaded, which product serves a step of N rows and on how many
threads.

The only place that knows ISAs and row thresholds. The build (python -m
inference.engine.kernels.build) tries the ISAs best first and keeps each that compiles and
passes its self-check; a process loads the best build its CPU runs (kernels.load) and gets
its `Backend` (kernels.backend()) once. Each threshold names the benchmark that measures
it; docs/performance.md holds the current figures.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import torch


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
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (none where it cannot be read)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's flags as the kernel sees them (/proc/cpuinfo), not the compiler's own
    -march=native probe, which on some virtual machines enables what the host hides."""
    return frozenset(_cpuinfo().get("flags", "").split())


def split_512() -> bool:
    """Whether the CPU runs 512-bit operations as two 256-bit halves: AMD's family 25, whose
    AVX512 parts execute them so (the rest of that family has no AVX512)."""
    info = _cpuinfo()
    return info.get("vendor_id") == "AuthenticAMD" and info.get("cpu family") == "25"


def pair_min_rows() -> tuple[int, int]:
    """PAIR_MIN_ROWS for this CPU, as the kernels take them (set_pair_min_rows)."""
    return PAIR_MIN_ROWS["halves" if split_512() else "full"]


def supported_isas() -> list[Isa]:
    """The builds this CPU can run, best first: what the build makes."""
    return [i for i in ISAS if i.needs <= cpu_flags()]


def avx512_allowed() -> bool:
    """False under ENGINE_KERNELS_AVX512=0: the engine then serves as on a CPU without the
    AVX512 family (and so without AMX), for comparisons with AVX2-only CPUs."""
    return os.environ.get("ENGINE_KERNELS_AVX512", "1") not in ("0", "false", "no")


def runnable_isas() -> list[Isa]:
    """The builds a process may load here, best first (AVX2's alone where not
    avx512_allowed)."""
    return [i for i in supported_isas() if avx512_allowed() or i is AVX2]


def engine_cpu_flags() -> frozenset[str]:
    """The flags the engine's choices of product and format go by: cpu_flags, less the
    AVX512 family and AMX where not avx512_allowed. Otherwise the AVX2 build beside an
    AVX512-BF16 CPU's flags would take bf16 large steps, which an AVX2-only CPU never does."""
    flags = cpu_flags()
    if avx512_allowed():
        return flags
    return frozenset(f for f in flags if not f.startswith(("avx512", "amx")))


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: only there is bfloat16 faster than float32 on a CPU."""
    return bool(engine_cpu_flags() & {"avx512_bf16", "amx_bf16"})


def cpu_has_amx() -> bool:
    """AMX tiles for bf16: there oneDNN's bf16 products outrun the 8-bit blocks early."""
    return "amx_bf16" in engine_cpu_flags()


# --- Which product serves a step of N rows ------------------------------------------------
#
# hybrid (EngineConfig.quantization): steps of at most this many rows take the 4-bit blocks
# on the native path, larger ones the float format; one crossover per float format
# (ENGINE_NATIVE_MAX_ROWS overrides it). HYBRID_MAX_ROWS is also where the torch path stops
# taking the 8-bit-activation product and where a step's guesses stop being nearly free
# (engine.py). Measured by: python -m inference.bench.step_profile (ms per decode step by
# streams, with ENGINE_NATIVE_MAX_ROWS set to each candidate).
HYBRID_MAX_ROWS = 8  # int4 alone
HYBRID_MAX_ROWS_FP16 = 64  # fbgemm's fp16 large steps (CPUs without native bf16)
HYBRID_MAX_ROWS_BF16 = 64  # oneDNN's bf16 large steps (AVX512-BF16, AMX)
# Up to how many rows the native path takes the lm_head from its 8-bit blocks, in the
# kernels' pool: python -m inference.bench.kernels --rows 4 8 16 24 32 64 --threads 1 2
# --kinds int8 onednn fbgemm (the head's columns).
HEAD_BLOCK_ROWS = 8  # int4 alone
HEAD_BLOCK_ROWS_AMX = 16  # bf16 on a CPU with AMX whose tiles the kernels cannot use
HEAD_BLOCK_ROWS_AMX_TILES = 64  # ... and where they can (the head's blocks on the tiles)
HEAD_BLOCK_ROWS_BF16 = 64  # bf16 on AVX512-BF16 without AMX
HEAD_BLOCK_ROWS_FP16 = 64  # fp16 (AVX2)
# The torch path's steps (prompts' chunks) take the 4-bit blocks with 16-bit activations
# up to these rows, by the product prompt_product picks (kernels.q4_1_gemm's kinds):
# python -m inference.bench.kernels --rows 8 16 32 64 128 256 --threads 1 2
# --kinds bf16 amx i16 onednn fbgemm.
BF16_BLOCK_ROWS = 64
AMX_BLOCK_ROWS = 1 << 30  # every step
I16_BLOCK_ROWS = 1 << 30  # every step
INT8_BLOCK_ROWS = 1 << 30  # every step
# A GGUF's own blocks (Q4_K, Q5_K, and the Q6_K and Q8_0 ones held at 8 bits) take prompts'
# rows with 8-bit activations, a scale per 32 (the native path's products at every row
# count), where the 4-bit blocks would take the 16-bit product's VNNI tile: llama.cpp
# multiplies those files' prompts at 8 bits too, and the engine's next tokens stay as close
# to its on the same file (tests/engine/test_gguf_models.py). Llama-1B's Q4_K layers took
# 0.53-0.56x the time at 128-512 rows, its Q6_K ones 0.69-0.71x (python -m
# inference.bench.kernels --shapes llama-1b --rows 128 512 --kinds int8 i16 for the Q4_K
# ones). Q4_1 keeps 16 bits: on the default model 8 bits over a whole prompt cost its first
# token (docs/performance.md).
GGUF_PROMPTS_INT8 = True
AMX_COLUMNS = 32  # a product's outputs on AMX's tiles: whole chunks of this many
# Inside the native path's products (pushed into the kernels: set_amx_min_rows,
# set_panel_min_rows), (layers, head): from how many rows the 8-bit-activation product
# moves to AMX's tiles, and below them to panel_gemm.c's panels (8-row tiles with
# AVX512-VNNI, 4-row with AVX2): python -m inference.bench.kernels --rows 4 8 12 16 24 32
# 48 64 --threads 2 --kinds int8 panel amx (and --shapes llama-1b: a GGUF's Q4_K layers).
# With AVX512-VNNI the grouped tiles take two column groups a tile from PAIR_MIN_ROWS rows,
# which beat the panels up to ~48 rows.
AMX_MIN_ROWS = (16, 4)
PANEL_MIN_ROWS = {"avx512": (48, 16), "avx2": (24, 24)}
# Below the panels, from how many rows the 8-bit-activation product takes two column groups
# a 512-bit tile (q4_1_gemm.c's q4_pair_tile; AVX512-VNNI builds), (Q4_1, Q4_K and Q5_K),
# by how the CPU runs 512-bit operations (split_512): python -m inference.bench.kernels
# --rows 1 2 4 8 16 --threads 1 2 --kinds int8 int8-single (and --shapes llama-1b for the
# K-quants). The same bits either way. The K-quants' tile spends more per block on its
# scales, which two groups a tile halve: where one row is bound by that arithmetic (15 GB/s
# against 28 for a plain read), Llama-1B's Q4_K layers took 0.84x, 0.81x, 0.77x the time at
# 1, 2, 4 rows; the bundled model's small Q4_1 matrices 1.02-1.11x. Where 512-bit
# operations run as two 256-bit halves, the pair's 512-bit vectors (built by inserts) buy
# nothing at few rows: Llama-1B's Q4_K layers took 1.21x, 1.17x, 1.04x at 1, 2, 4 rows,
# 0.88x at 8 and 0.87x at 16.
PAIR_MIN_ROWS = {"full": (8, 1), "halves": (8, 8)}
# A GGUF's Q8_0 and Q6_K layer matrices (all of a Q8_0 or Q6_K file's, a Q4_K_M or Q5_K_M
# file's Q6_K ones) take the head's 16-bit products (8-bit activations on the native path
# with AVX512-VNNI: gemm_dispatch.c's q8_layers_matmul), the panels from the head's panel
# rows, never AMX's tiles (whose bf16 cost those files' next tokens their precision:
# q8_0_layers_gemm.c).
# A mixed step (decodes and a prompt's chunk) splits from this many decoding rows, where
# the split is not off (EngineConfig.split_mixed_steps; auto: not on AMX, whose tiles
# take the chunk's rows with the decodes): python -m inference.bench.mixed_step.
SPLIT_MIN_ROWS = 8
# A step with batch-invariant rows (a seeded request's: model_runner's invariant) runs all
# its rows on the one-row products up to this many rows, where those cost the others' rows
# less than a forward of the invariant rows' own; past it the invariant rows take their
# own forward: python -m inference.bench.invariant --streams 8 16 24 32.
INVARIANT_FOLD_ROWS = 16

# --- On how many threads ------------------------------------------------------------------
#
# Torch-path steps from at most this many streams take small_step_threads (every core by
# default), as native steps do; larger ones keep num_threads, leaving a core to the web
# side (a prompt's chunk from one or two streams counts: counting only decoding streams
# made served TTFT worse, the web side being busiest while a wave of prompts arrives).
# Steps whose products run in the pool by ALL_CORES_POOLED's products take
# small_step_threads whatever their streams: with AMX's tiles, a mixed step of 63 decodes
# and a 128-token chunk took 0.66x the time on both cores (the web side needs a fraction
# of one at 64 chats), served chat-mix gained 3-5% tok/s at 16 and 64 chats; a GGUF's
# 8-bit prompts ("int8", GGUF_PROMPTS_INT8) take i16's place and its rule; the bf16
# products were not measured so and keep the rule. Measured served: python -m
# inference.bench.vs_llama --concurrency 16 64, before and after a change here.
FEW_STREAMS = 2
ALL_CORES_POOLED = frozenset({"i16", "amx", "int8"})


def _row_limits(setting: str, layers: int, head: int) -> tuple[int, int]:
    """(layers, head), or the setting's one value for both (0: never; for comparisons)."""
    raw = os.environ.get(setting, "")
    if not raw.strip():
        return layers, head
    try:
        return int(raw), int(raw)
    except ValueError:
        raise ValueError(f"{setting} must be an integer, got {raw!r}") from None


def invariant_fold_rows() -> int:
    """Up to how many rows a step with batch-invariant rows runs as one (INVARIANT_FOLD_ROWS)."""
    return INVARIANT_FOLD_ROWS


def amx_min_rows() -> tuple[int, int]:
    """AMX_MIN_ROWS, or ENGINE_AMX_MIN_ROWS's one value for both."""
    return _row_limits("ENGINE_AMX_MIN_ROWS", *AMX_MIN_ROWS)


def panel_min_rows(vnni: bool = True) -> tuple[int, int]:
    """(layers, head): from how many rows the native path's products take the panels, by
    the build (`vnni`: the 512-bit tiles, else AVX2's), or ENGINE_PANEL_MIN_ROWS's one
    value for both. Where AMX's tiles run they come first (amx_min_rows)."""
    return _row_limits("ENGINE_PANEL_MIN_ROWS", *PANEL_MIN_ROWS["avx512" if vnni else "avx2"])


@dataclass(frozen=True)
class Backend:
    """The loaded build (`isa`, None: torch's products alone) and whether this process was
    granted AMX's tiles: every choice below follows from these two and the CPU's flags."""

    isa: Isa | None
    amx_tiles: bool = False

    @property
    def vnni(self) -> bool:
        """The 512-bit panels and the 16-bit product's AVX512-VNNI tile."""
        return self.isa is not None and self.isa.needs >= AVX512.needs

    @property
    def bf16_product(self) -> bool:
        """The bf16-activation 4-bit product (AVX512-BF16)."""
        return self.isa is not None and self.isa.needs >= AVX512_BF16.needs

    @property
    def chunk_amx(self) -> bool:
        """The prompts' chunk attention with bf16 products on AMX's tiles, where they run:
        0.2-0.5x the AVX512-BF16 tiles' time from 4 rows over 300 cached positions to 512
        rows over 2000, the same at 4-16 rows over none (python -m
        inference.bench.chunk_attention)."""
        return self.amx_tiles

    def kernel_min_rows(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(AMX's (layers, head), the panels'), as the kernels take them (0: never)."""
        amx = amx_min_rows() if self.amx_tiles else (0, 0)
        return amx, panel_min_rows(self.vnni) if self.isa else (0, 0)

    def native_max_rows(self, large: str | None) -> int:
        """hybrid's crossover for its float format of larger steps (None: int4)."""
        rows = {"bf16": HYBRID_MAX_ROWS_BF16, "fp16": HYBRID_MAX_ROWS_FP16}
        return rows.get(large or "", HYBRID_MAX_ROWS)

    def head_block_rows(self, large: str | None, native_max_rows: int) -> int:
        """Up to how many rows the lm_head takes its 8-bit blocks: at most the native path's."""
        bf16 = HEAD_BLOCK_ROWS_BF16
        if cpu_has_amx():
            bf16 = HEAD_BLOCK_ROWS_AMX_TILES if self.amx_tiles else HEAD_BLOCK_ROWS_AMX
        rows = {"bf16": bf16, "fp16": HEAD_BLOCK_ROWS_FP16}.get(large or "", HEAD_BLOCK_ROWS)
        return min(native_max_rows, rows)

    def prompt_product(self, large: str | None) -> str | None:
        """Which 4-bit product the torch path's steps take (kernels.q4_1_gemm's kind), or
        None: with fp16 large steps, the 16-bit one wherever the kernels load; with bf16,
        AMX's tiles where they run, else the 16-bit product's VNNI tile, else bf16
        activations. On a CPU with AMX whose tiles the kernels cannot use, oneDNN's bf16
        (on AMX) keeps them: the kernels' products were not measured against it."""
        if self.isa is None:
            return None
        if large == "fp16":
            return "i16"
        if large != "bf16":
            return None
        if self.amx_tiles:
            return "amx"
        if cpu_has_amx():
            return None
        if self.vnni:
            return "i16"
        return "bf16" if self.bf16_product else None

    def gguf_prompts_int8(self, kind: str | None) -> bool:
        """Whether a GGUF's own blocks take prompts at 8 bits where the 4-bit blocks take
        prompt_product's `kind` (GGUF_PROMPTS_INT8)."""
        return GGUF_PROMPTS_INT8 and kind == "i16" and self.vnni

    def prompt_rows(self, kind: str | None) -> int:
        """Up to how many rows the torch path's steps take prompt_product's product."""
        rows = {"amx": AMX_BLOCK_ROWS, "bf16": BF16_BLOCK_ROWS, "i16": I16_BLOCK_ROWS,
                "int8": INT8_BLOCK_ROWS}  # fmt: skip
        return rows.get(kind or "", 0)

    def large_format(self, dtype: torch.dtype) -> str:
        """hybrid's format for big steps of a float32 model: bf16 weights where the CPU
        multiplies bf16 natively, else fp16-stored weights with float32 compute (fbgemm);
        other dtypes as they are. Measured by: python -m inference.bench.linear_formats."""
        if dtype != torch.float32:
            return "none"
        return "bf16" if cpu_has_native_bf16() else "fp16"

    def split_mixed(self, mode: str) -> bool:
        """Whether mixed steps split (EngineConfig.split_mixed_steps: auto, on, off)."""
        return mode == "on" or (mode == "auto" and not cpu_has_amx())

    def step_threads(
        self, native: bool, streams: int, pooled: str | None, threads: int, small_threads: int
    ) -> tuple[int, int]:
        """(the kernels' pool's threads, torch's) for a step: native, or on the torch path
        from `streams` streams with its products in the pool by `pooled` (None: torch's).
        Where the step's products run in the pool, torch keeps one thread: its OpenMP
        workers spin for a while after each op, on the cores the pool wants next."""
        if native:
            return small_threads, 1
        pool = small_threads if streams <= FEW_STREAMS or pooled in ALL_CORES_POOLED else threads
        return pool, 1 if pooled else pool
