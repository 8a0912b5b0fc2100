"""y = x @ W.T in each weight format, and which format serves a step of N rows.

The row thresholds below are the one table of "which product serves a step of N rows" on
the model side (the kernels' own live in kernels/__init__.py); each cites what measured it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inference.engine import kernels
from inference.engine.quantized import Q4_1, Q8_0

_LINEAR_FP16: Callable[[torch.Tensor, object], torch.Tensor] = (
    torch.ops.quantized.linear_dynamic_fp16.default
)

# Weight formats (EngineConfig.quantization): each names how a step of many rows multiplies
# ("large") and whether steps of few rows use 4-bit blocks instead.
QUANTIZATIONS = ("none", "fp16", "int8", "int4", "hybrid")

# hybrid: steps of at most this many rows use the Q4_1 weights (and the native path),
# bigger ones the float format; the crossover depends on that format, so there is one per
# format. ENGINE_NATIVE_MAX_ROWS overrides it. HYBRID_MAX_ROWS is also where the torch path
# stops taking the 4-bit blocks and where a step's guesses stop being nearly free
# (engine.py). Each is measured with `python -m inference.bench.step_profile --streams 4 8
# 12 16 32 64 --native-max-rows 8 64 --no-split` (wall ms per decode step by rows).
# - int4 (no float format): 4-bit reads a quarter of the bytes and wins while reading
#   weights dominates; by 12 rows a float GEMM catches up.
HYBRID_MAX_ROWS = 8
# - fp16 weights (fbgemm; CPUs without native bf16): the grouped kernels (each unpacked
#   block serves 4 rows) on every core stay ahead of fbgemm at every decode batch.
HYBRID_MAX_ROWS_FP16 = 64
# - bf16 weights (oneDNN; AVX512-BF16 / AMX): the grouped kernels (VNNI dot products) stay
#   ahead of oneDNN's bf16 products at every decode batch up to max_num_seqs.
HYBRID_MAX_ROWS_BF16 = 64
# Steps on the native path take the lm_head from its 8-bit blocks too, in the kernels' own
# thread pool, up to this many rows: torch's float products of the head at a few rows are
# no faster on one thread (fp16) or slower (bf16), and on more threads their OpenMP workers
# spin on the cores the pool needs next. The head's limits are measured with
# `python -m inference.bench.kernels --rows 16 24 32 48 64 --kinds int8 panel amx onednn
# fbgemm` (the kinds the CPU has; the head's rows of the table).
HEAD_BLOCK_ROWS = 8
# bf16 with AMX whose tiles the kernels cannot use: oneDNN's head (on AMX) catches up by
# 24 rows.
HEAD_BLOCK_ROWS_AMX = 16
# ... unless the kernels run on AMX's tiles too (kernels.amx_available(), amx_gemm.c): from
# 4 rows the head's blocks take them, ahead of oneDNN's bf16 at every decode batch.
HEAD_BLOCK_ROWS_AMX_TILES = 64
# bf16 on AVX512-BF16 without AMX: the blocks on every core ahead of oneDNN's bf16 on one.
HEAD_BLOCK_ROWS_BF16 = 64
# fp16 (AVX2): the blocks on every core ahead of fbgemm's fp16 on one.
HEAD_BLOCK_ROWS_FP16 = 64


def default_native_max_rows(large: str | None) -> int:
    """The measured crossover for hybrid's float format of larger steps (None: int4)."""
    return {"bf16": HYBRID_MAX_ROWS_BF16, "fp16": HYBRID_MAX_ROWS_FP16}.get(
        large or "", HYBRID_MAX_ROWS
    )


def head_block_rows(large: str | None, native_max_rows: int) -> int:
    """Up to how many rows the lm_head takes its 8-bit blocks: at most the native path's."""
    bf16 = HEAD_BLOCK_ROWS_BF16
    if kernels.cpu_has_amx():
        bf16 = HEAD_BLOCK_ROWS_AMX_TILES if kernels.amx_available() else HEAD_BLOCK_ROWS_AMX
    rows = {"bf16": bf16, "fp16": HEAD_BLOCK_ROWS_FP16}.get(large or "", HEAD_BLOCK_ROWS)
    return min(native_max_rows, rows)


# The torch path's products from the 4-bit blocks, by kind, each measured against the
# float format it replaces with `python -m inference.bench.kernels --rows 8 16 32 64 128
# 256 --kinds bf16 i16 amx onednn fbgemm` (the kinds the CPU has; the 30 layers' rows).
# Where large steps multiply bf16 (AVX512-BF16), steps of up to this many rows (prompts'
# chunks, mostly) take the 4-bit blocks with bf16 activations (kernels/quant_gemm.c,
# q4_1_gemm_bf16): a quarter of the bytes of bf16 weights, exact weights, float32 sums;
# past it oneDNN's bf16 catches up.
BF16_BLOCK_ROWS = 64
# With AMX, every torch-path step's products take the 4-bit blocks on AMX's tiles
# (kernels/amx_gemm.c, q4_1_gemm_amx: weights unpacked to bf16 in the cache, x in bf16,
# float32 sums) in the kernels' pool, ahead of oneDNN's bf16 at every row count.
AMX_BLOCK_ROWS = 1 << 30
AMX_COLUMNS = 32  # a product's outputs on the tiles: whole chunks of this many
# Where large steps are fp16 (AVX2, no bf16), every torch-path step's products take the
# 4-bit blocks with x at 16 bits a block (kernels/panel_gemm.c, q4_1_gemm_i16: the weights'
# integers unpacked once per 16 columns, float precision) in the kernels' pool, ahead of
# fbgemm's fp16 at every row count. Built for AVX512-VNNI (8-row tiles of 512-bit sums) it
# takes bf16 large steps' place too, on CPUs with AVX512-BF16 and no AMX, ahead of both
# the bf16-activation product and oneDNN's bf16.
I16_BLOCK_ROWS = 1 << 30


def prompt_blocks(large: str | None) -> str | None:
    """Which 4-bit product the torch path's steps take ("amx" or "i16" for all of them,
    "bf16" up to BF16_BLOCK_ROWS rows; kernels.q4_1_gemm), or None: where large steps are
    bf16 and the kernels have the product, or fp16 and the kernels load. Where large steps
    are bf16: AMX's tiles where they run, else the 16-bit product's AVX512-VNNI tile, else
    bf16 activations. On a CPU with AMX whose tiles the kernels cannot use, oneDNN's bf16
    (on AMX) keeps them: the kernels' products were not measured against it."""
    if large == "fp16":
        return "i16" if kernels.load() is not None else None
    if large != "bf16":
        return None
    if kernels.amx_available():
        return "amx"
    if kernels.cpu_has_amx():
        return None
    if kernels.i16_vnni_available():
        return "i16"
    return "bf16" if kernels.bf16_gemm_available() else None


def prompt_block_rows(kind: str | None) -> int:
    """Up to how many rows the torch path's steps take prompt_blocks' product."""
    rows = {"amx": AMX_BLOCK_ROWS, "bf16": BF16_BLOCK_ROWS, "i16": I16_BLOCK_ROWS}
    return rows.get(kind or "", 0)


def blocks_rows(blocks: Q4_1 | Q8_0 | None, rows: int, kind: str) -> int:
    """Up to how many rows a product's 4-bit blocks take prompt_blocks' product `kind`
    (`rows`, its limit): Q4_1 blocks only, and on AMX's tiles whole chunks of columns."""
    if not isinstance(blocks, Q4_1) or (kind == "amx" and blocks.shape[0] % AMX_COLUMNS):
        return 0
    return rows


def blocks_take_every_row(blocks: Q4_1 | Q8_0 | None, rows: int, kind: str) -> bool:
    """Whether a product's 4-bit blocks serve steps of any size by prompt_blocks' product
    `kind` up to `rows` rows: then its float copy would never be multiplied, and is not
    made (~212 MB of fp16 or bf16 for the bundled model's layers)."""
    return blocks_rows(blocks, rows, kind) >= min(AMX_BLOCK_ROWS, I16_BLOCK_ROWS)


class Linear:
    """y = x @ W.T: in the model dtype (exact), fp16- or int8-stored (fbgemm), and/or from
    4-bit blocks (`blocks`, used for steps of at most `block_rows` rows with 8-bit
    activations, and up to `bf16_rows` rows with 16-bit ones: `bf16_kind`, "bf16", "amx" or
    "i16", see kernels.q4_1_gemm). With no weight, the blocks serve every step."""

    def __init__(
        self,
        weight: torch.Tensor | None,
        quantization: str = "none",
        blocks: Q4_1 | Q8_0 | None = None,
        block_rows: int = 0,
        bf16_rows: int = 0,
        bf16_kind: str = "bf16",
    ) -> None:
        self.blocks = blocks.for_kernel() if blocks is not None else None
        self.block_rows = block_rows if blocks is not None else 0
        self.bf16_rows = blocks_rows(blocks, bf16_rows, bf16_kind)
        self.bf16_kind = bf16_kind
        # Its key for the compiled step's opaque product (compiled_step.py); -1: none yet.
        self.compile_key = -1
        self.weight: torch.Tensor | None = None
        self.packed: object | None = None
        self.kind = "dense"
        if weight is None:
            if blocks is None:
                raise ValueError("a Linear needs a weight or blocks")
            self.kind = "blocks"
            if not blocks_take_every_row(blocks, self.bf16_rows, bf16_kind):
                self.block_rows = 1 << 62  # int4: the 8-bit activations' product throughout
            self.out_features = blocks.shape[0]
            return
        self.out_features = weight.shape[0]
        if quantization == "int8":
            w = weight.float()
            scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
            zero = torch.zeros(w.shape[0], dtype=torch.long)
            qw = torch.quantize_per_channel(w, scale.double(), zero, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(qw, None)
            self.kind = "int8"
        elif quantization == "fp16":
            self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)
            self.kind = "fp16"
        elif quantization == "bf16":
            # Internal to hybrid on a CPU with AVX512-BF16 / AMX: a float32 model (the
            # native small steps want it) whose large steps multiply in bf16 (oneDNN).
            self.weight = weight.to(torch.bfloat16).contiguous()
            self.kind = "bf16"
        else:
            self.weight = weight.contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= self.block_rows:
            return self.blocks.matmul_t(x).to(x.dtype)  # type: ignore[union-attr]
        if x.shape[0] <= self.bf16_rows:
            assert isinstance(self.blocks, Q4_1)  # bf16_rows is set for Q4_1 blocks only
            return self.blocks.matmul_t(x, kind=self.bf16_kind).to(x.dtype)
        if self.kind == "fp16":
            if x.dtype == torch.float32:
                # The overload itself: calling the op packet costs ~10 us of Python each.
                return _LINEAR_FP16(x, self.packed)
            return _LINEAR_FP16(x.float(), self.packed).to(x.dtype)
        if self.kind == "bf16":
            assert self.weight is not None  # only a blocks-only Linear has none
            return F.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)
        if self.kind == "int8":
            # fbgemm quantizes activations to 7 bits (reduce_range) so its int16
            # accumulation cannot overflow on AVX2.
            y: torch.Tensor = torch.ops.quantized.linear_dynamic(x.float(), self.packed, True)
            return y.to(x.dtype)
        assert self.weight is not None
        return F.linear(x, self.weight)


class BiasedLinear(Linear):
    """A Linear with an added bias (Qwen2's q/k/v): a subclass, so that the bias-free
    products of the other families pay nothing for it."""

    def __init__(self, bias: torch.Tensor, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x) + self.bias


@dataclass
class WeightFormats:
    """How the linear weights are held: `large` is the float format ("none", "fp16", "int8";
    None: no float copy at all), `blocks` the 4-bit matrices (None: none), which serve the
    steps of at most `block_rows` rows."""

    large: str | None
    blocks: dict[str, Q4_1] | None = None
    block_rows: int = 0
    # Past block_rows and up to this many, the blocks with bf16 activations (prompts), by
    # this product (prompt_blocks).
    bf16_rows: int = 0
    bf16_kind: str = "bf16"


def large_format(dtype: torch.dtype) -> str:
    """hybrid's format for big steps of a float32 model: bf16 weights where the CPU multiplies
    bf16 natively (AMX / AVX512-BF16: ~1.7x fbgemm's fp16 at 64 rows),
    else fp16-stored weights with float32 compute (fbgemm); other dtypes as they are."""
    if dtype != torch.float32:
        return "none"
    return "bf16" if kernels.cpu_has_native_bf16() else "fp16"


def call_linear(linear: Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x)
