"""Our own llama-family forward over a flat batch of tokens from many sequences.

All tokens of a step (one per decoding sequence, a chunk per prefilling sequence) go through
the linear layers as one [T, hidden] matrix. Attention is where sequences differ: each layer
first writes the step's K/V into the paged cache (one index_copy_ over the slot mapping),
then decodes attend together over their gathered blocks, and each prefill chunk attends
causally over its own context.

The weights come from the Hugging Face folder through safetensors; q/k/v and gate/up are
fused into one matrix each, so a layer is four matmuls.

Tensor parallel (Megatron style, see tensor_parallel.py): with tp_size=N this object holds
one rank's shard. q/k/v and gate/up keep 1/N of their rows (whole heads, a slice of the
intermediate size), o and down the matching 1/N of their columns, so each rank's o and down
produce a partial sum of the full output; `all_reduce` adds them up across ranks before the
residual add. Embedding, norms and lm_head are replicated. num_heads and num_kv_heads are
the rank's own counts, so whoever sizes the KV pools from them gets per-rank shards.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoConfig, PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from inference.engine import kernels, paged_attention
from inference.engine.native_decode import NativeDecoder
from inference.engine.paged_attention import PagedAttention
from inference.engine.quantized import Q4_1, Q8_0, BlockWeight
from inference.engine.row_ops import PoolRowOps, RowOps, TorchRowOps


@dataclass
class PrefillChunk:
    start: int  # first row of this chunk in the flat batch
    length: int  # tokens in the chunk
    context_len: int  # tokens the sequence holds after this step (cached + chunk)
    block_table: torch.Tensor  # [num_blocks] block ids covering context_len
    # Where the chunk's K/V go, when the step's slot_mapping does not cover it (steps with
    # the native paged attention, whose longer chunks take the chunk attention).
    slots: torch.Tensor | None = None


@dataclass
class DecodeGroup:
    start: int  # first row in the flat batch
    count: int  # sequences (rows) in the group
    block_tables: torch.Tensor  # [count, max_blocks], padded with block 0
    mask: torch.Tensor | None  # [count, 1, 1, max_blocks * block_size] additive, or None
    blocks: torch.Tensor = field(init=False)  # block_tables flattened, for one gather

    def __post_init__(self) -> None:
        self.blocks = self.block_tables.reshape(-1)


@dataclass
class AttentionMetadata:
    """Where each token's K/V goes and what each query attends to, for one step."""

    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] flat slot = block_id * block_size + offset
    # The first num_decodes rows are single-token decodes, in groups of similar context
    # length (each group pads its contexts to its longest, so one long chat does not make
    # every short one read thousands of padded slots).
    num_decodes: int = 0
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    # What the native paged attention reads instead of the groups above (None where the
    # model runs without it): each row's sequence, an index into `tables`, and the step's
    # sequences' block tables, padded with block 0.
    row_seq: torch.Tensor | None = None  # [T] int32
    tables: torch.Tensor | None = None  # [sequences, width] int64
    # The first paged_rows rows take the native paged attention; the rest are `prefills`,
    # chunks longer than PAGED_MAX_CHUNK rows, where tiles of rows win (_prefill_attention).
    paged_rows: int = 0


_LINEAR_FP16: Callable[[torch.Tensor, object], torch.Tensor] = (
    torch.ops.quantized.linear_dynamic_fp16.default
)

# Weight formats (EngineConfig.quantization): each names how a step of many rows multiplies
# ("large") and whether steps of few rows use 4-bit blocks instead.
QUANTIZATIONS = ("none", "fp16", "int8", "int4", "hybrid")

# hybrid: steps of at most this many rows use the Q4_1 weights (and the native path),
# bigger ones the float format; the crossover depends on that format, so there is one per
# format, each measured (docs/performance.md, "The crossover"). ENGINE_NATIVE_MAX_ROWS
# overrides it. HYBRID_MAX_ROWS is also where the torch path stops taking the 4-bit blocks
# and where a step's guesses stop being nearly free (engine.py).
# - Measured first on a 2-core AVX2 CPU in CPU ms per decode step, before the grouped
#   4-bit kernels: 4-bit 11.5 / 26.5 / 50.7 / 78.1 at 1 / 4 / 8 / 12 rows, fp16 34.8 /
#   41.1 / 65.1 / 77.2: 4-bit read a quarter of the bytes and won while reading weights
#   dominated; by 12 rows fp16's GEMM had caught up.
HYBRID_MAX_ROWS = 8
# - fp16 weights (fbgemm; CPUs without native bf16), with the grouped kernels (each
#   unpacked block serves 4 rows) on the same kind of AVX2 CPU (AMD EPYC Zen 3, 2 cores),
#   wall ms per decode step, 4-bit against fp16: 41.7 / 103.3 at 12 rows, 54.0 / 122.1 at
#   16, 102.7 / 215.0 at 32, 214.9 / 370.6 at 64 (the 4-bit path on both cores, fbgemm on
#   one: the other is the web side's); served, 16 and 64 users 1.61x and 1.37x the tok/s.
HYBRID_MAX_ROWS_FP16 = 64
# - bf16 weights (oneDNN; AVX512-BF16 / AMX), on a 2-core Xeon with AMX: the grouped 4-bit
#   kernels (each unpacked block serves 4 rows, VNNI dot products) stay ahead of oneDNN's
#   bf16 products at every decode batch up to max_num_seqs.
HYBRID_MAX_ROWS_BF16 = 64
# Steps on the native path take the lm_head from its 8-bit blocks too, in the kernels' own
# thread pool, up to this many rows: torch's float products of the head at a few rows
# measured no faster on one thread (fp16) or 2-3x slower (bf16), and on more threads their
# OpenMP workers spin on the cores the pool needs next (docs/performance.md).
HEAD_BLOCK_ROWS = 8
# bf16 with AMX (a 2-core Xeon): oneDNN's head caught up at 24 rows (10.44 against 9.64 ms).
HEAD_BLOCK_ROWS_AMX = 16
# ... unless the kernels run on AMX's tiles too (kernels.amx_available(), amx_gemm.c): from
# 4 rows the head's blocks take them, 6.4 ms at 64 rows on both cores, against oneDNN's
# bf16 at 12.7 ms in a 64-stream step (the logits' share, one thread; docs/performance.md).
HEAD_BLOCK_ROWS_AMX_TILES = 64
# bf16 on AVX512-BF16 without AMX (AMD EPYC Zen 4, 2 cores): the blocks on both cores
# against oneDNN's bf16 on one, ms for the head at 24 / 32 / 48 / 64 rows: 7.1 / 9.3 /
# 14.2 / 21.0 against 13.4 / 15.1 / 22.2 / 23.6; in a whole decode step of 64 streams
# 79.5 against 96.6 ms (docs/performance.md).
HEAD_BLOCK_ROWS_BF16 = 64
# fp16 (AVX2): the blocks on both cores against fbgemm's fp16 on one, ms for the head at
# 16 / 32 / 64 rows: 11.3 / 21.3 / 42.3 against 22.3 / 48.8 / 80.8 (Zen 3).
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


# Where large steps multiply bf16 (AVX512-BF16), the torch path's steps of up to this many
# rows (prompts' chunks, mostly) take the 4-bit blocks with bf16 activations
# (kernels/quant_gemm.c, q4_1_gemm_bf16): a quarter of the bytes of bf16 weights, exact
# weights, float32 sums. 30 layers' products on a Zen 4 (AVX512-BF16, no AMX), 2 threads,
# against oneDNN's bf16: 8.5 / 14.2 / 26.1 / 45.1 / 58.2 ms at 8 / 16 / 32 / 48 / 64 rows
# against 25.1 / 26.8 / 35.6 / 56.2 / 73.1, and 121.1 against 112.0 at 128.
BF16_BLOCK_ROWS = 64
# With AMX, every torch-path step's products take the 4-bit blocks on AMX's tiles
# (kernels/amx_gemm.c, q4_1_gemm_amx: weights unpacked to bf16 in the cache, x in bf16,
# float32 sums) in the kernels' pool. 30 layers' products on a 2-core Xeon, the kernel on 2
# threads against oneDNN's bf16 on the one thread the torch path gives it: 22.1 / 28.7 /
# 43.7 ms at 64 / 128 / 256 rows against 42.4 / 51.9 / 69.0 (docs/performance.md).
AMX_BLOCK_ROWS = 1 << 30
AMX_COLUMNS = 32  # a product's outputs on the tiles: whole chunks of this many
# Where large steps are fp16 (AVX2, no bf16), every torch-path step's products take the
# 4-bit blocks with x at 16 bits a block (kernels/panel_gemm.c, q4_1_gemm_i16: the weights'
# integers unpacked once per 16 columns, float precision) in the kernels' pool. 30 layers'
# products on a 2-core Zen 3 at 16 / 64 / 256 rows, one thread: 36.9 / 123.1 / 476.3 ms
# against fbgemm's fp16 products 43.5 / 151.4 / 586.2 (docs/performance.md). Built for
# AVX512-VNNI (8-row tiles of 512-bit sums) it takes bf16 large steps' place too, on CPUs
# with AVX512-BF16 and no AMX: on a Zen 4, 2 threads, 74.4 / 128.6 / 218.3 ms at 64 / 128
# / 256 rows against the bf16-activation product's 76.8 / 150.4 / 282.7 and oneDNN's bf16
# on the one thread the torch path gave it past 64 rows and two streams, 108.6 / 178.1 /
# 326.6; served there, 16 users 1.16x the tok/s and TTFT p90 0.78x, 64 users 1.06x.
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


# The native paged attention takes a sequence's rows one by one; the chunk attention
# (kernels/chunk_attention.c, or SDPA where it does not build) takes a chunk's rows as tiles
# and, measured per layer (docs/performance.md), wins from about this many rows of one
# sequence: at 2 rows over 512 cached tokens the native kernel took 0.15 ms against SDPA's
# 0.26 (gather included), at 8 rows 0.59 against 0.36 (the tiles are faster than SDPA).
PAGED_MAX_CHUNK = 4


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


class DecoderLayer:
    """One layer's weights; with tp_size > 1, this rank's 1/tp_size of each projection."""

    def __init__(
        self,
        w: dict[str, torch.Tensor],
        prefix: str,
        formats: WeightFormats,
        put: Callable[[torch.Tensor], torch.Tensor],
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        def shard(t: Any, dim: int) -> Any:
            n = t.shape[dim] // tp_size
            lo, hi = tp_rank * n, (tp_rank + 1) * n
            if isinstance(t, torch.Tensor):
                return t[lo:hi] if dim == 0 else t[:, lo:hi].contiguous()
            return t.rows(lo, hi) if dim == 0 else t.cols(lo, hi)

        def linear(names: tuple[str, ...], dim: int) -> Linear:
            # dim 0: column-parallel (a slice of the outputs); 1: row-parallel (the inputs).
            keys = [f"{prefix}.{n}.weight" for n in names]
            blocks = None
            if formats.blocks is not None:
                parts = [shard(formats.blocks[k], dim) for k in keys]
                blocks = parts[0] if len(parts) == 1 else type(parts[0]).cat(parts)
            weight = None
            if formats.large is not None and not blocks_take_every_row(
                blocks, formats.bf16_rows, formats.bf16_kind
            ):
                weight = torch.cat([put(shard(w[k], dim)) for k in keys])
            return Linear(
                weight,
                formats.large or "none",
                blocks,
                formats.block_rows,
                formats.bf16_rows,
                formats.bf16_kind,
            )

        self.input_norm = put(w[f"{prefix}.input_layernorm.weight"])
        self.post_norm = put(w[f"{prefix}.post_attention_layernorm.weight"])
        # Split per projection, then fuse: each rank's qkv is [its q heads; its k; its v].
        self.qkv = linear(tuple(f"self_attn.{n}_proj" for n in ("q", "k", "v")), 0)
        self.o = linear(("self_attn.o_proj",), 1)
        self.gate_up = linear(("mlp.gate_proj", "mlp.up_proj"), 0)
        self.down = linear(("mlp.down_proj",), 1)


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


BLOCKS_FILE = "gguf-blocks.safetensors"


def save_blocks(blocks: dict[str, BlockWeight], folder: str | os.PathLike[str]) -> None:
    """Store a GGUF's block matrices beside a converted checkpoint (read_gguf is slow)."""
    from safetensors.torch import save_file

    flat: dict[str, torch.Tensor] = {}
    for name, b in blocks.items():
        if name == "lm_head.weight" and b is blocks.get("embed_tokens.weight"):
            continue
        kind = "q4_1" if isinstance(b, Q4_1) else "q8_0"
        flat[f"{name}.{kind}.qs"] = b.qs
        flat[f"{name}.{kind}.d"] = b.d
        if isinstance(b, Q4_1):
            flat[f"{name}.{kind}.m"] = b.m
    save_file(flat, os.path.join(folder, BLOCKS_FILE))


def load_blocks(folder: str) -> dict[str, BlockWeight] | None:
    path = os.path.join(folder, BLOCKS_FILE)
    if not os.path.isfile(path):
        return None
    flat = load_file(path)
    out: dict[str, BlockWeight] = {}
    for key in flat:
        name, kind, part = key.rsplit(".", 2)
        if part != "qs":
            continue
        if kind == "q4_1":
            out[name] = Q4_1(flat[key], flat[f"{name}.q4_1.d"], flat[f"{name}.q4_1.m"])
        else:
            out[name] = Q8_0(flat[key], flat[f"{name}.q8_0.d"])
    if "lm_head.weight" not in out and "embed_tokens.weight" in out:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


def _head_blocks(stored: dict[str, BlockWeight], head: torch.Tensor, tied: bool) -> Q8_0:
    """The lm_head as Q8_0: the GGUF's own blocks where the folder came from one (`stored`),
    else quantized from the float weight now."""
    own = stored.get("embed_tokens.weight" if tied else "lm_head.weight")
    if isinstance(own, Q8_0) and own.shape == tuple(head.shape):
        return own
    return Q8_0.quantize(head)


def _block_weights(stored: dict[str, BlockWeight], w: dict[str, torch.Tensor]) -> dict[str, Q4_1]:
    """Each linear's 4-bit blocks: the GGUF's own where the folder came from one (`stored`),
    else quantized from the float weights now."""
    blocks: dict[str, Q4_1] = {}
    for name, t in w.items():
        if name.endswith("_proj.weight"):
            b = stored.get(name)
            blocks[name] = b if isinstance(b, Q4_1) else Q4_1.quantize(t)
    return blocks


def check_tensor_parallel_size(config: PretrainedConfig, tp_size: int) -> None:
    """Raise a ValueError unless heads, KV heads and the MLP width all split into tp_size."""
    sizes = {
        "attention heads": config.num_attention_heads,
        "KV heads": config.num_key_value_heads,
        "intermediate size": config.intermediate_size,
    }
    if tp_size >= 1 and all(v % tp_size == 0 for v in sizes.values()):
        return
    common = math.gcd(*sizes.values())
    fits = [n for n in range(1, common + 1) if common % n == 0]
    counts = ", ".join(f"{v} {k}" for k, v in sizes.items())
    raise ValueError(
        f"tensor_parallel_size={tp_size} does not divide this model ({counts}); "
        f"sizes that fit: {', '.join(map(str, fits))}"
    )


def rope_tables(config: PretrainedConfig, max_len: int, head_dim: int) -> torch.Tensor:
    """cos and sin for every position, as HF computes them: [2, max_len, head_dim] float32."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scaling = 1.0
    else:
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    freqs = torch.arange(max_len, dtype=torch.float)[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return torch.stack((emb.cos() * scaling, emb.sin() * scaling))


def rope_rotation_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with the first half negated, so that rope(x) = x * cos + roll(x, d/2) * this.

    HF rotates with cat(-x2, x1); roll gives cat(x2, x1), and the sign moves into sin.
    """
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def load_weights(folder: str) -> dict[str, torch.Tensor]:
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(f))
    return weights


class LlamaModel:
    def __init__(
        self,
        folder: str,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        quantization: str = "none",
        max_len: int | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        native_max_rows: int = 0,
    ) -> None:
        config = AutoConfig.from_pretrained(folder)
        check_tensor_parallel_size(config, tp_size)
        if tp_size > 1 and all_reduce is None:
            raise ValueError("a tensor-parallel shard needs an all_reduce")
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        # Sums the ranks' partial outputs in place (and returns the tensor); None on one rank.
        self.all_reduce = all_reduce
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads // tp_size
        self.num_kv_heads = config.num_key_value_heads // tp_size
        self.head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        if quantization not in QUANTIZATIONS:
            choices = ", ".join(QUANTIZATIONS)
            raise ValueError(f"quantization must be one of {choices}; got {quantization!r}")
        if quantization != "none" and self.device.type != "cpu":
            raise ValueError(f"quantization={quantization!r} runs on CPU only")
        self.max_len = max_len or config.max_position_embeddings

        # Weights stay where safetensors put them (CPU) until sliced: a rank moves only
        # its own shard to its device.
        w = {k.removeprefix("model."): v for k, v in load_weights(folder).items()}

        def put(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=self.device, dtype=dtype)

        self.quantization = quantization
        formats = WeightFormats(large=quantization)
        native_rows = 0  # steps the native path may take (none without 4-bit blocks)
        stored: dict[str, BlockWeight] = {}
        if quantization in ("int4", "hybrid"):
            # The kernels take whole pairs of 32-weight blocks along each input.
            widths = (config.hidden_size, config.intermediate_size // tp_size)
            if any(k % 64 for k in widths):
                raise ValueError(
                    f"quantization={quantization!r} needs hidden and (per-rank) intermediate "
                    f"sizes divisible by 64; this model has {widths}: use fp16 or none"
                )
            stored = load_blocks(folder) or {}
            formats.blocks = _block_weights(stored, w)
            formats.large = None if quantization == "int4" else _large_format(dtype)
            native_rows = native_max_rows or default_native_max_rows(formats.large)
            # The torch path multiplies by the 4-bit blocks only where the native path
            # would take a step whatever its chunks: past that it runs prompts' chunks,
            # which keep the float format (native_decode.NativeDecoder says why).
            formats.block_rows = min(native_rows, HYBRID_MAX_ROWS)
            kind = prompt_blocks(formats.large)
            if kind is not None:
                formats.bf16_rows, formats.bf16_kind = prompt_block_rows(kind), kind
        self.embed = put(w["embed_tokens.weight"])
        self.norm = put(w["norm.weight"])
        # Logits are computed on rank 0 only.
        self.lm_head: Linear | None = None
        if tp_rank == 0:
            lm_head = w.get("lm_head.weight")
            tied = lm_head is None or getattr(config, "tie_word_embeddings", False)
            head = put(lm_head) if lm_head is not None and not tied else self.embed
            if formats.blocks is None:
                self.lm_head = Linear(head, quantization)
            else:
                # With 4-bit layers, small steps take the head from 8-bit blocks (the
                # GGUF's own) with 16-bit activations: 8-bit ones flipped the very first
                # token of "What is the capital of France?" (the final hidden state has one
                # outlier ~30x the others, which cost the rest of its block their
                # precision). Larger steps take the float format.
                self.lm_head = Linear(
                    head,
                    _large_format(dtype),
                    _head_blocks(stored, head, tied),
                    head_block_rows(formats.large, native_rows),
                )
        self.layers = [
            DecoderLayer(w, f"layers.{i}", formats, put, tp_rank, tp_size)
            for i in range(self.num_layers)
        ]
        # Fused weights were copied; drop the per-projection originals.
        del w
        cos_sin = rope_tables(config, self.max_len, self.head_dim)
        self.cos = cos_sin[0].to(device=self.device, dtype=dtype)
        self.sin = rope_rotation_sin(cos_sin[1]).to(device=self.device, dtype=dtype)
        self.torch_ops = TorchRowOps(self.eps)
        # The eager forward's work between products in the kernels' pool where they load.
        self.pool_ops: PoolRowOps | None = None
        if PoolRowOps.usable(self.device, dtype, tp_size) and (pool_lib := kernels.load()):
            self.pool_ops = PoolRowOps(pool_lib, self.eps)
        self.native: NativeDecoder | None = None
        lib = kernels.load() if formats.blocks is not None else None
        if lib is not None and NativeDecoder.usable(self):
            self.native = NativeDecoder(self, lib, native_rows, HYBRID_MAX_ROWS)
        # Prompts' chunks over their context: tiles over the paged pool where the kernels
        # build (CPU, float32), else a gather of the context and SDPA. Their products run
        # in bf16 where the prompts' matrix products already do (formats.large).
        self.chunk_kernel = kernels.load() if self.device.type == "cpu" else None
        self.chunk_bf16 = formats.large == "bf16"
        self._chunk_shape: kernels.ChunkShape | None = None
        # The torch path's attention: straight over the paged pool where it builds (CPU,
        # float32), else a gather of each group's blocks and SDPA.
        self.paged: PagedAttention | None = None
        if PagedAttention.usable(self.device, dtype):
            lib = paged_attention.load()
            assert lib is not None  # usable() loaded it
            self.paged = PagedAttention(
                lib, self.num_heads, self.num_kv_heads, self.head_dim, self.scale
            )

    # -- forward ----------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        """Hidden states after the final norm, one row per input token: [T, hidden]."""
        chunks = [p.length for p in meta.prefills]
        if self.native is not None and self.native.handles(input_ids.shape[0], chunks):
            return self.native.forward(input_ids, meta, kv_caches)

        def attend(i: int, qkv: torch.Tensor) -> torch.Tensor:
            return self.attend(qkv, kv_caches[i], meta)

        return self.layers_forward(input_ids, meta.positions, _call_linear, attend, self.pool_ops)

    def layers_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        linear: Callable[[Linear, torch.Tensor], torch.Tensor],
        attend: Callable[[int, torch.Tensor], torch.Tensor],
        ops: RowOps | None = None,
    ) -> torch.Tensor:
        """The torch path's layers, with the products (`linear`) and the attention of layer
        i (`attend(i, qkv)`: writes the rows' K/V, returns [T, heads, head_dim]) supplied by
        the caller: the eager forward calls them directly, the compiled step
        (compiled_step.py) through opaque custom ops, so one graph holds everything else.
        `ops`: the work between the products (row_ops.py; torch ops by default)."""
        ops = ops or self.torch_ops
        x = F.embedding(input_ids, self.embed)
        cos, sin = self.cos[positions], self.sin[positions]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        reduce = self.all_reduce or _unchanged
        layers = self.layers
        x, h = ops.add_norm(x, None, layers[0].input_norm)
        for i, layer in enumerate(layers):
            qkv = linear(layer.qkv, h).view(-1, hq + 2 * hkv, d)
            # q and k are adjacent heads of the fused projection: rotated together, and
            # then k and v are adjacent too and go to the cache in one copy.
            ops.rope(qkv, hq + hkv, cos, sin)
            attn = attend(i, qkv)
            x, h = ops.add_norm(
                x, reduce(linear(layer.o, attn.reshape(-1, hq * d))), layer.post_norm
            )
            # The residual add is fused with the next layer's norm (the final one last).
            after = layers[i + 1].input_norm if i + 1 < len(layers) else self.norm
            x, h = ops.add_norm(
                x, reduce(linear(layer.down, ops.act(linear(layer.gate_up, h)))), after
            )
        return h

    def attend(
        self, qkv: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Write the step's K/V into this layer's pool, then attend: qkv [T, heads +
        2 * kv_heads, head_dim] (rope applied) -> [T, heads, head_dim]."""
        hkv, d = self.num_kv_heads, self.head_dim
        if self.paged is not None and meta.tables is not None:
            assert meta.row_seq is not None  # built together with the tables
            # In the kernels' pool, as the chunk attention: a step whose products run there
            # leaves torch one thread.
            threads = kernels.threads()
            n = meta.paged_rows
            if n == qkv.shape[0]:
                return self.paged(qkv, kv_cache, meta.positions, meta.row_seq, meta.tables, threads)
            out = qkv.new_empty(qkv.shape[0], self.num_heads, d)
            if n:
                positions, row_seq = meta.positions[:n], meta.row_seq[:n]
                out[:n] = self.paged(qkv[:n], kv_cache, positions, row_seq, meta.tables, threads)
            for p in meta.prefills:
                rows = slice(p.start, p.start + p.length)
                assert p.slots is not None  # set for every chunk of such a step
                new_kv = qkv[rows, self.num_heads :].transpose(0, 1).to(kv_cache.dtype)
                kv_cache.view(2 * hkv, -1, d).index_copy_(1, p.slots, new_kv)
                out[rows] = self._prefill_attention(qkv[rows], kv_cache, p, meta.positions[rows])
            return out
        # [2 * hkv, T, d], rounded to the pool's dtype where it is narrower
        new_kv = qkv[:, self.num_heads :].transpose(0, 1).to(kv_cache.dtype)
        kv_cache.view(2 * hkv, -1, d).index_copy_(1, meta.slot_mapping, new_kv)
        return self._attention(qkv, kv_cache, meta)

    def close(self) -> None:
        """Nothing to release here; TensorParallelModel.close() stops the other ranks."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            raise RuntimeError("logits are computed on tensor-parallel rank 0 only")
        return self.lm_head(hidden).float()

    def _attention(
        self, qkv: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """qkv: [T, heads + 2 * kv_heads, head_dim] -> attention output [T, heads, head_dim]."""
        hq = self.num_heads
        if len(meta.decode_groups) == 1 and not meta.prefills:
            return self._decode_attention(qkv[:, :hq], kv_cache, meta.decode_groups[0])
        out = qkv.new_empty(qkv.shape[0], hq, self.head_dim)
        for g in meta.decode_groups:
            rows = slice(g.start, g.start + g.count)
            out[rows] = self._decode_attention(qkv[rows, :hq], kv_cache, g)
        for p in meta.prefills:
            rows = slice(p.start, p.start + p.length)
            out[rows] = self._prefill_attention(qkv[rows], kv_cache, p, meta.positions[rows])
        return out

    def _decode_attention(
        self, q: torch.Tensor, kv_cache: torch.Tensor, group: DecodeGroup
    ) -> torch.Tensor:
        """One query per sequence over its gathered blocks: [D, heads, head_dim]."""
        nd, hkv, d = q.shape[0], self.num_kv_heads, self.head_dim
        per_kv = self.num_heads // hkv
        # The pool is head-major, so one gather lands each head's context contiguously:
        # [2 * hkv, D * blocks, block_size, d] -> keys and values as [hkv, D, ctx, d].
        # (index_select copies whole blocks; advanced indexing goes element by element.)
        kv = torch.index_select(kv_cache, 1, group.blocks).view(2, hkv, nd, -1, d).to(q.dtype)
        # The kv heads' query heads ride as a query length of per_kv: one plain (non-GQA)
        # fused attention call over [D, kv_heads, ...], no score matrix in Python.
        out = F.scaled_dot_product_attention(
            q.view(nd, hkv, per_kv, d),
            kv[0].transpose(0, 1),
            kv[1].transpose(0, 1),
            attn_mask=group.mask,
            scale=self.scale,
        )
        return out.reshape(nd, hkv * per_kv, d)

    def _prefill_attention(
        self, qkv: torch.Tensor, kv_cache: torch.Tensor, p: PrefillChunk, positions: torch.Tensor
    ) -> torch.Tensor:
        """Causal attention of a chunk over its context: [n, heads, head_dim]. `positions`
        are the chunk's rows' (the chunk's K/V are in the pool already)."""
        if self.chunk_kernel is not None:
            out = self._chunk_kernel_attention(qkv, kv_cache, p, positions)
            if out is not None:
                return out
        n, hq, hkv, d = qkv.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        q = qkv[:, :hq].transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
        if p.context_len == n:
            # Nothing cached before this chunk: its own K/V are the whole context, as the
            # pool holds them (rounded to its dtype), so that every path attends over the
            # same values whatever the chunking.
            kv = qkv[:, hq:].transpose(0, 1).to(kv_cache.dtype).to(qkv.dtype)
            mask, causal = None, True
        else:
            ctx = p.context_len
            kv = torch.index_select(kv_cache, 1, p.block_table).view(2 * hkv, -1, d)[:, :ctx]
            kv = kv.to(qkv.dtype)
            q_pos = torch.arange(ctx - n, ctx, device=qkv.device)
            mask = torch.arange(ctx, device=qkv.device)[None, :] <= q_pos[:, None]
            causal = False
        out = F.scaled_dot_product_attention(
            q,
            kv[:hkv].unsqueeze(0),
            kv[hkv:].unsqueeze(0),
            attn_mask=mask,
            is_causal=causal,
            scale=self.scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)

    def _chunk_kernel_attention(
        self, qkv: torch.Tensor, kv_cache: torch.Tensor, p: PrefillChunk, positions: torch.Tensor
    ) -> torch.Tensor | None:
        """The chunk over its context read where it lies in the pool (kernels/
        chunk_attention.c); None where the pool or shape is not the kernel's."""
        assert self.chunk_kernel is not None
        if (
            qkv.dtype != torch.float32
            or kv_cache.dtype not in kernels.KV_DTYPES
            or not kv_cache.is_contiguous()
        ):
            return None
        half = kernels.kv_half(kv_cache)
        shape = self._chunk_shape
        if shape is None or (shape.num_blocks, shape.block_size, shape.kv_half) != (
            *kv_cache.shape[1:3],
            half,
        ):
            shape = self._chunk_shape = kernels.ChunkShape(
                heads=self.num_heads, kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                block_size=kv_cache.shape[2], num_blocks=kv_cache.shape[1], scale=self.scale,
                kv_half=half, bf16=int(self.chunk_bf16),
            )  # fmt: skip
        return kernels.chunk_attention(
            self.chunk_kernel, shape, qkv.contiguous(), positions.contiguous(),
            p.block_table.contiguous(), kv_cache, kernels.threads(),
        )  # fmt: skip


def _large_format(dtype: torch.dtype) -> str:
    """hybrid's format for big steps of a float32 model: bf16 weights where the CPU multiplies
    bf16 natively (AMX / AVX512-BF16: ~1.7x fbgemm's fp16 at 64 rows, docs/performance.md),
    else fp16-stored weights with float32 compute (fbgemm); other dtypes as they are."""
    if dtype != torch.float32:
        return "none"
    return "bf16" if kernels.cpu_has_native_bf16() else "fp16"


def _unchanged(x: torch.Tensor) -> torch.Tensor:
    return x


def _call_linear(linear: Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x)


def load_config(folder: str) -> PretrainedConfig:
    config: PretrainedConfig = AutoConfig.from_pretrained(folder)
    return config
