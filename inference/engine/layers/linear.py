"""y = x @ W.T in each weight format. Which one serves a step of N rows is the CPU
backend's choice (cpu_backend.py), asked through the loaded kernels' backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inference.engine import kernels
from inference.engine.cpu_backend import (
    AMX_BLOCK_ROWS,
    AMX_COLUMNS,
    I16_BLOCK_ROWS,
    INT8_BLOCK_ROWS,
)
from inference.engine.cpu_backend import BF16_BLOCK_ROWS as BF16_BLOCK_ROWS
from inference.engine.cpu_backend import HYBRID_MAX_ROWS as HYBRID_MAX_ROWS
from inference.engine.quantized import Q4_1, Q4_K, Q8_0

_LINEAR_FP16: Callable[[torch.Tensor, object], torch.Tensor] = (
    torch.ops.quantized.linear_dynamic_fp16.default
)

# Weight formats (EngineConfig.quantization): each names how a step of many rows multiplies
# ("large") and whether steps of few rows use 4-bit blocks instead.
QUANTIZATIONS = ("none", "fp16", "int8", "int4", "hybrid")


# Which product serves a step of N rows is the CPU backend's (cpu_backend.py, its one table
# of thresholds); these ask the backend of the kernels loaded here.
def default_native_max_rows(large: str | None) -> int:
    """hybrid's crossover for its float format of larger steps (None: int4)."""
    return kernels.backend().native_max_rows(large)


def head_block_rows(large: str | None, native_max_rows: int) -> int:
    """Up to how many rows the lm_head takes its 8-bit blocks: at most the native path's."""
    return kernels.backend().head_block_rows(large, native_max_rows)


def prompt_blocks(large: str | None) -> str | None:
    """Which 4-bit product the torch path's steps take (kernels.q4_1_gemm's kind), or None."""
    return kernels.backend().prompt_product(large)


def gguf_prompts_int8(kind: str | None) -> bool:
    """Whether a GGUF's own blocks take prompts at 8 bits where the 4-bit ones take `kind`."""
    return kernels.backend().gguf_prompts_int8(kind)


def prompt_block_rows(kind: str | None) -> int:
    """Up to how many rows the torch path's steps take prompt_blocks' product."""
    return kernels.backend().prompt_rows(kind)


def large_format(dtype: torch.dtype) -> str:
    """hybrid's format for big steps of a float32 model (bf16 or fp16), else "none"."""
    return kernels.backend().large_format(dtype)


def blocks_rows(blocks: Q4_1 | Q8_0 | None, rows: int, kind: str) -> int:
    """Up to how many rows a product's 4-bit blocks take prompt_blocks' product `kind`
    (`rows`, its limit): Q4_1 blocks only, and on AMX's tiles whole chunks of columns."""
    if not isinstance(blocks, Q4_1) or (kind == "amx" and blocks.shape[0] % AMX_COLUMNS):
        return 0
    return rows


def blocks_take_every_row(blocks: Q4_1 | Q8_0 | None, rows: int, kind: str) -> bool:
    """Whether a product's blocks serve steps of any size: 4-bit ones by prompt_blocks'
    product `kind` up to `rows` rows, 8-bit ones (a GGUF's layers of more than 4 bits)
    wherever the kernels load, q8_0_gemm taking every row count (cpu_backend.py's head
    rows pick its tiles). Then the float copy would never be multiplied, and is not made
    (~212 MB of fp16 or bf16 for the bundled model's layers)."""
    if isinstance(blocks, Q8_0):
        return kernels.load() is not None
    every = min(AMX_BLOCK_ROWS, I16_BLOCK_ROWS, INT8_BLOCK_ROWS)
    return blocks_rows(blocks, rows, kind) >= every


class Linear:
    """y = x @ W.T: in the model dtype (exact), fp16- or int8-stored (fbgemm), and/or from
    blocks (`blocks`, used for steps of at most `block_rows` rows; Q4_1's with 8-bit
    activations, and up to `prompt_rows` rows with 16-bit ones by `prompt_product`: "bf16",
    "amx" or "i16", see kernels.q4_1_gemm; Q8_0's with 16-bit ones by `q8_kind`,
    Q8_0.matmul_t).
    With no weight, the blocks serve every step."""

    def __init__(
        self,
        weight: torch.Tensor | None,
        quantization: str = "none",
        blocks: Q4_1 | Q8_0 | None = None,
        block_rows: int = 0,
        prompt_rows: int = 0,
        prompt_product: str = "bf16",
        q8_kind: str = "q8_0",
    ) -> None:
        self.blocks = blocks.for_kernel() if blocks is not None else None
        # Q8_0 blocks' product (Q8_0.matmul_t's kind): the head's "q8_0", a layer's "i16" or
        # "int8" (WeightFormats.q8_kind).
        self.q8_kind = q8_kind
        self.block_rows = block_rows if blocks is not None else 0
        self.prompt_rows = blocks_rows(blocks, prompt_rows, prompt_product)
        self.prompt_product = prompt_product
        # Its key for the compiled step's opaque product (compiled_step.py); -1: none yet.
        self.compile_key = -1
        self.weight: torch.Tensor | None = None
        self.packed: object | None = None
        self.kind = "dense"
        if weight is None:
            if blocks is None:
                raise ValueError("a Linear needs a weight or blocks")
            self.kind = "blocks"
            # int4's Q4_1: the 8-bit activations' product throughout. Q8_0: its one product
            # at every size, which picks its tiles by the rows itself (gemm_dispatch.c).
            if isinstance(blocks, Q8_0) or not blocks_take_every_row(
                blocks, self.prompt_rows, prompt_product
            ):
                self.block_rows = 1 << 62
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

    def __call__(self, x: torch.Tensor, as_rows: int | None = None) -> torch.Tensor:
        """`as_rows`: the step whose product the rows take (default: x's rows); fewer where
        the rows must come out as they would in that smaller step (a sequence's speculative
        guesses, checked as its plain decoding would compute them). The head's."""
        if (x.shape[0] if as_rows is None else as_rows) <= self.block_rows:
            if isinstance(self.blocks, Q8_0):
                return self.blocks.matmul_t(x, kind=self.q8_kind, as_rows=as_rows).to(x.dtype)
            return self.blocks.matmul_t(x).to(x.dtype)  # type: ignore[union-attr]
        if x.shape[0] <= self.prompt_rows:
            assert isinstance(self.blocks, Q4_1)  # prompt_rows is set for Q4_1 blocks only
            return self.blocks.matmul_t(x, kind=self.prompt_product).to(x.dtype)
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

    def __call__(self, x: torch.Tensor, as_rows: int | None = None) -> torch.Tensor:
        return super().__call__(x, as_rows) + self.bias


class StackedLinear:
    """A product whose outputs come from parts held in different block formats, each part
    its own Linear, their outputs side by side: a GGUF's q and k in Q4_K beside its v in
    Q6_K (a Q4_K_M file's), read as the file holds them rather than all three widened to
    8 bits (gguf_model.layer_formats)."""

    def __init__(self, parts: list[Linear], bias: torch.Tensor | None = None) -> None:
        self.parts = parts
        self.bias = bias
        self.out_features = sum(p.out_features for p in parts)
        self.compile_key = -1
        # The torch path's 16-bit block product: what every part takes (model_runner).
        self.prompt_rows = min(p.prompt_rows for p in parts)
        self.prompt_product = parts[0].prompt_product

    def __call__(self, x: torch.Tensor, as_rows: int | None = None) -> torch.Tensor:
        y = torch.cat([p(x, as_rows) for p in self.parts], dim=-1)
        return y if self.bias is None else y + self.bias


@dataclass
class WeightFormats:
    """How the linear weights are held: `large` is the float format ("none", "fp16", "int8";
    None: no float copy at all), `blocks` the block matrices (None: none; Q4_1, or a
    GGUF's Q8_0), which serve the steps of at most `block_rows` rows."""

    large: str | None
    blocks: dict[str, Q4_1 | Q8_0] | None = None
    block_rows: int = 0
    # Past block_rows and up to this many (prompts), the blocks with 16-bit activations, by
    # this product (cpu_backend's prompt_product: "bf16", "amx" or "i16").
    prompt_rows: int = 0
    prompt_product: str = "bf16"
    # A GGUF's Q4_K, Q5_K, Q6_K and Q8_0 blocks take prompts at 8 bits (cpu_backend's
    # gguf_prompts_int8).
    gguf_int8: bool = False

    def prompt_of(self, blocks: Q4_1 | Q8_0 | None) -> tuple[int, str]:
        """(prompt_rows, prompt_product) for a matrix of these blocks."""
        if self.gguf_int8 and isinstance(blocks, Q4_K):
            return INT8_BLOCK_ROWS, "int8"
        return self.prompt_rows, self.prompt_product

    @property
    def q8_kind(self) -> str:
        """The product a layer's Q8_0 (and Q6_K) blocks take (Q8_0.matmul_t's kind)."""
        return "int8" if self.gguf_int8 else "i16"


def call_linear(linear: Linear | StackedLinear, x: torch.Tensor) -> torch.Tensor:
    return linear(x)
