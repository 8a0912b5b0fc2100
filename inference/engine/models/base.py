"""The decoder every supported family is: embedding, layers of attention and gated MLP with
RMS norms, final norm, head; over a flat batch of tokens from many sequences.

All tokens of a step (one per decoding sequence, a chunk per prefilling sequence) go through
the linear layers as one [T, hidden] matrix; attention (layers/attention.py) is where
sequences differ. q/k/v and gate/up are fused into one matrix each, so a layer is four
products. A family (models/<family>.py) subclasses DecoderModel and says, from its config,
how its checkpoint names its tensors and where its maths departs from Llama's: norms with an
offset, norms after attention and MLP, q/k norms, scaled embeddings, another activation,
soft-capped logits, sliding-window or rope-less layers.

Tensor parallel (Megatron style, see tensor_parallel.py): with tp_size=N this object holds
one rank's shard. q/k/v and gate/up keep 1/N of their rows (whole heads, a slice of the
intermediate size), o and down the matching 1/N of their columns, so each rank's o and down
produce a partial sum of the full output; `all_reduce` adds them up across ranks before the
residual add. Embedding, norms and lm_head are replicated. num_heads and num_kv_heads are
the rank's own counts, so whoever sizes the KV pools from them gets per-rank shards.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig

from inference.engine import huge_pages, kernels, paged_attention
from inference.engine.errors import UnsupportedModelError
from inference.engine.formats.gguf_file import return_freed_memory
from inference.engine.layers.activation import ACTIVATIONS, softcap
from inference.engine.layers.attention import (
    PLAIN,
    Attention,
    AttentionMetadata,
    LayerAttention,
)
from inference.engine.layers.fused import GATE_UP, QKV
from inference.engine.layers.linear import (
    HYBRID_MAX_ROWS,
    QUANTIZATIONS,
    BiasedLinear,
    Linear,
    StackedLinear,
    WeightFormats,
    blocks_take_every_row,
    call_linear,
    default_native_max_rows,
    gguf_prompts_int8,
    head_block_rows,
    large_format,
    prompt_block_rows,
    prompt_blocks,
)
from inference.engine.layers.rotary import (
    check_rope_type,
    rope_partial,
    rope_rotation_sin,
    rope_tables,
)
from inference.engine.paged_attention import PagedAttention
from inference.engine.quantized import Q4_1, Q8_0, BlockWeight
from inference.engine.row_ops import PoolRowOps, RowOps, TorchRowOps, rms_norm

if TYPE_CHECKING:
    from inference.engine.native_decode import NativeDecoder

L = TypeVar("L", bound=Linear)


@dataclass(frozen=True)
class LayerSpec:
    """How one layer attends: its window (None: every earlier position) and its rope table
    (a key of config.rope_parameters where the config holds one per kind of layer, "" for
    the model's one set, None: no rope at all)."""

    window: int | None = None
    rope: str | None = ""


class Weights(dict[str, torch.Tensor]):
    """A checkpoint's tensors by canonical name; one not held is read by `lazy` (a GGUF's
    matrices, each when a float copy of it is wanted), and a missing one is a refusal
    naming it."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        family: str,
        lazy: Callable[[str], torch.Tensor | None] | None = None,
    ) -> None:
        super().__init__(tensors)
        self.family = family
        self.lazy = lazy

    def __missing__(self, name: str) -> torch.Tensor:
        if self.lazy is not None and (t := self.lazy(name)) is not None:
            return t
        raise UnsupportedModelError(
            f"tensor {name!r} is missing from this {self.family} checkpoint: the files do "
            "not hold what the architecture needs"
        )


class DecoderLayer:
    """One layer's weights; with tp_size > 1, this rank's 1/tp_size of each projection.
    `post_norm` is the MLP's input norm (Llama's post_attention_layernorm)."""

    def __init__(
        self,
        model: DecoderModel,
        w: Weights,
        prefix: str,
        formats: WeightFormats,
        spec: LayerSpec,
    ) -> None:
        tp_rank, tp_size, put = model.tp_rank, model.tp_size, model.put

        def shard(t: Any, dim: int) -> Any:
            n = t.shape[dim] // tp_size
            lo, hi = tp_rank * n, (tp_rank + 1) * n
            if isinstance(t, torch.Tensor):
                return t[lo:hi] if dim == 0 or t.dim() == 1 else t[:, lo:hi].contiguous()
            return t.rows(lo, hi) if dim == 0 else t.cols(lo, hi)

        def qkv_product() -> Linear | StackedLinear:
            # A GGUF whose q/k/v the file holds in different formats (a Q4_K_M file's q and
            # k in Q4_K, v in Q6_K: gguf_model.layer_formats): a Linear per run of one format.
            if formats.blocks is not None:
                held = [type(formats.blocks[f"{prefix}.{n}.weight"]) for n in QKV]
                if len(set(held)) > 1:
                    runs = [
                        tuple(n for _, n in run)
                        for _, run in groupby(zip(held, QKV, strict=True), itemgetter(0))
                    ]
                    return StackedLinear([linear(r, 0, None) for r in runs], _bias(QKV, 0))
            return linear(QKV, 0, _bias(QKV, 0))

        def linear(names: tuple[str, ...], dim: int, bias: torch.Tensor | None) -> Linear:
            # dim 0: column-parallel (a slice of the outputs); 1: row-parallel (the inputs).
            keys = [f"{prefix}.{n}.weight" for n in names]
            blocks = None
            if formats.blocks is not None:
                # Popped: the GGUF-layout blocks go once the Linear has its kernel layout.
                parts = [shard(formats.blocks.pop(k), dim) for k in keys]
                blocks = parts[0] if len(parts) == 1 else type(parts[0]).cat(parts)
                del parts
            weight = None
            prompt_rows, prompt_product = formats.prompt_of(blocks)
            if formats.large is not None and not blocks_take_every_row(
                blocks, prompt_rows, prompt_product
            ):
                weight = torch.cat([put(shard(w[k], dim)) for k in keys])
            args = (weight, formats.large or "none", blocks, formats.block_rows,
                    prompt_rows, prompt_product, formats.q8_kind)  # fmt: skip
            made = model.settled(Linear(*args) if bias is None else BiasedLinear(bias, *args))
            # The GGUF-layout blocks go back to the system now, not at the layer's end: a
            # layer's matrices in both layouts at once were a GGUF load's peak.
            del args, blocks
            return_freed_memory()
            return made

        def _bias(names: tuple[str, ...], dim: int) -> torch.Tensor | None:
            keys = [f"{prefix}.{n}.bias" for n in names]
            if all(k not in w for k in keys):
                return None
            if dim == 1:
                # Each rank's product is a partial sum: the bias is added once, on rank 0.
                return put(w[keys[0]]) if tp_rank == 0 else put(torch.zeros_like(w[keys[0]]))
            return torch.cat([put(shard(w[k], 0)) for k in keys])

        norm = model.norm_weight
        names = model.norm_names
        self.input_norm = norm(w[f"{prefix}.input_layernorm.weight"])
        self.post_norm = norm(w[f"{prefix}.{names['mlp_in']}.weight"])
        # Gemma's norms of the attention's and the MLP's outputs, before the residual add.
        self.attn_out_norm = self.mlp_out_norm = None
        if "attn_out" in names:
            self.attn_out_norm = norm(w[f"{prefix}.{names['attn_out']}.weight"])
            self.mlp_out_norm = norm(w[f"{prefix}.{names['mlp_out']}.weight"])
        # Qwen3's and Gemma 3's norms of each q and k head, before rope.
        self.q_norm = self.k_norm = None
        if model.qk_norm:
            self.q_norm = norm(w[f"{prefix}.self_attn.q_norm.weight"])
            self.k_norm = norm(w[f"{prefix}.self_attn.k_norm.weight"])
        # Split per projection, then fuse: each rank's qkv is [its q heads; its k; its v].
        self.qkv = qkv_product()
        self.o = linear(("self_attn.o_proj",), 1, _bias(("self_attn.o_proj",), 1))
        self.gate_up = linear(GATE_UP, 0, _bias(GATE_UP, 0))
        self.down = linear(("mlp.down_proj",), 1, _bias(("mlp.down_proj",), 1))
        self.rope = spec.rope
        window = spec.window if spec.window is not None and spec.window < model.max_len else None
        self.attention = LayerAttention(window, model.attn_softcap)

    @property
    def llama_shaped(self) -> bool:
        """Whether this layer's maths is Llama's exactly (the native path's)."""
        return (
            self.attn_out_norm is None
            # q/k norms both or neither: the C layer norms each head of q and k (Qwen3).
            and (self.q_norm is None) == (self.k_norm is None)
            and self.rope is not None
            and self.attention.plain
            # A bias on q/k/v only (Qwen2's): the C layer adds it after the product.
            and not any(isinstance(x, BiasedLinear) for x in (self.o, self.gate_up, self.down))
        )


class DecoderModel:
    """Llama's maths, and the switches other families turn (class attributes and the
    classmethods below); a family module subclasses it and overrides what differs."""

    # The registry's keys: config.architectures[0] and config.model_type.
    family: ClassVar[str] = "llama"
    architectures: ClassVar[tuple[str, ...]] = ()
    model_types: ClassVar[tuple[str, ...]] = ()
    # Canonical norm names (after rename): the MLP's input norm; with "attn_out" and
    # "mlp_out", the norms of the attention's and the MLP's outputs (Gemma).
    norm_names: ClassVar[dict[str, str]] = {"mlp_in": "post_attention_layernorm"}
    norm_offset: ClassVar[float] = 0.0  # Gemma scales by (1 + w): folded into w at load
    qk_norm: ClassVar[bool] = False
    scale_embeddings: ClassVar[bool] = False  # Gemma: embeddings times sqrt(hidden)

    @classmethod
    def rename(
        cls, tensors: dict[str, torch.Tensor], config: PretrainedConfig
    ) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors under the canonical names (Llama's, no "model.")."""
        return {k.removeprefix("model."): v for k, v in tensors.items()}

    @classmethod
    def layer_specs(cls, config: PretrainedConfig) -> list[LayerSpec]:
        window = getattr(config, "sliding_window", None)
        types = (
            getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        )
        return [LayerSpec(window if t == "sliding_attention" else None) for t in types]

    @classmethod
    def check(cls, config: PretrainedConfig) -> None:
        """An UnsupportedModelError where this config asks for what the family lacks."""
        act = cls.activation(config)
        if act not in ACTIVATIONS:
            raise UnsupportedModelError(
                f"activation {act!r} of {config.model_type} is not supported; "
                f"supported: {', '.join(ACTIVATIONS)}"
            )
        params = getattr(config, "rope_parameters", None) or {}
        for key in {spec.rope for spec in cls.layer_specs(config)} - {None}:
            check_rope_type(params[key] if key else params, config.model_type)

    @classmethod
    def activation(cls, config: PretrainedConfig) -> str:
        return str(getattr(config, "hidden_act", "silu"))

    @classmethod
    def query_scale(cls, config: PretrainedConfig, head_dim: int) -> float:
        return float(head_dim**-0.5)

    def __init__(
        self,
        config: PretrainedConfig,
        tensors: dict[str, torch.Tensor],
        stored_blocks: dict[str, BlockWeight] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        quantization: str = "none",
        max_len: int | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        native_max_rows: int = 0,
        lazy: Callable[[str], torch.Tensor | None] | None = None,
    ) -> None:
        """`stored_blocks`: block matrices read from the files (a GGUF's own), taken over
        (popped) as the layers are built; `lazy`: a reader of the float tensors `tensors`
        leaves out (a GGUF's matrices, which then come as blocks only)."""
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
        self.scale = self.query_scale(config, self.head_dim)
        self.attn_softcap: float | None = getattr(config, "attn_logit_softcapping", None)
        self.final_softcap: float | None = getattr(config, "final_logit_softcapping", None)
        self.check(config)
        act = self.activation(config)
        self.act = ACTIVATIONS[act]
        self.silu = act == "silu"
        if quantization not in QUANTIZATIONS:
            choices = ", ".join(QUANTIZATIONS)
            raise ValueError(f"quantization must be one of {choices}; got {quantization!r}")
        if quantization != "none" and self.device.type != "cpu":
            raise ValueError(f"quantization={quantization!r} runs on CPU only")
        self.max_len = max_len or config.max_position_embeddings
        specs = self.layer_specs(config)
        # Weights stay where they were read (CPU) until sliced: a rank moves only its own
        # shard to its device.
        w = Weights(self.rename(tensors, config), self.family, lazy)
        self.quantization = quantization
        formats = WeightFormats(large=quantization)
        native_rows = 0  # steps the native path may take (none without 4-bit blocks)
        stored: dict[str, BlockWeight] = stored_blocks or {}
        if quantization in ("int4", "hybrid"):
            # The kernels take whole pairs of 32-weight blocks along each input.
            widths = (config.hidden_size, config.intermediate_size // tp_size)
            if any(k % 64 for k in widths):
                raise ValueError(
                    f"quantization={quantization!r} needs hidden and (per-rank) intermediate "
                    f"sizes divisible by 64; this model has {widths}: use fp16 or none"
                )
            formats.blocks = _block_weights(stored, w)
            formats.large = None if quantization == "int4" else large_format(dtype)
            native_rows = native_max_rows or default_native_max_rows(formats.large)
            # The torch path multiplies by the 4-bit blocks only where the native path
            # would take a step whatever its chunks: past that it runs prompts' chunks,
            # which keep the float format (native_decode.NativeDecoder says why).
            formats.block_rows = min(native_rows, HYBRID_MAX_ROWS)
            kind = prompt_blocks(formats.large)
            if kind is not None:
                formats.prompt_rows, formats.prompt_product = prompt_block_rows(kind), kind
            formats.gguf_int8 = gguf_prompts_int8(kind)
        self.native_rows = native_rows
        self.has_blocks = formats.blocks is not None
        # A GGUF's embedding stays in its 8-bit blocks, shared with a tied head: a float
        # copy of a large vocabulary outweighs the 4-bit layers of a small model.
        self.embed_blocks: Q8_0 | None = None
        own = stored.get("embed_tokens.weight")
        if lazy is not None and formats.blocks is not None and isinstance(own, Q8_0):
            self.embed_blocks = own.for_kernel()
            stored["embed_tokens.weight"] = self.embed_blocks
            if stored.get("lm_head.weight") is own:
                stored["lm_head.weight"] = self.embed_blocks
        del own
        self.embed: torch.Tensor | None = None
        if self.embed_blocks is None:
            self.embed = self.put(w["embed_tokens.weight"])
        self.embed_scale = None
        if self.scale_embeddings:
            # As transformers does: sqrt(hidden) rounded to the model's dtype.
            self.embed_scale = torch.tensor(self.hidden_size**0.5, dtype=dtype, device=self.device)
        self.norm = self.norm_weight(w["norm.weight"])
        # The blocks each decode step streams whole, on huge pages (huge_pages.Arena).
        self._arena: huge_pages.Arena | None = huge_pages.Arena(self.device)
        head = self._lm_head(w, stored, formats, dtype, native_rows)
        self.lm_head = None if head is None else self.settled(head)
        self.layers = []
        for i in range(self.num_layers):
            self.layers.append(DecoderLayer(self, w, f"layers.{i}", formats, specs[i]))
            # Each layer's conversions freed as much as it keeps: give that back now, so
            # that the load's peak stays near what the model holds.
            return_freed_memory()
        self._arena = None
        # Fused weights were copied; drop the per-projection originals.
        del w
        self._rope_tables(config, {layer.rope for layer in self.layers})
        self.torch_ops = TorchRowOps(self.eps)
        # The eager forward's work between products in the kernels' pool where they load.
        self.pool_ops: PoolRowOps | None = None
        if PoolRowOps.usable(self.device, dtype, tp_size) and (pool_lib := kernels.load()):
            self.pool_ops = PoolRowOps(pool_lib, self.eps)
        # Set by models.load_model where the native path serves this model's small steps.
        self.native: NativeDecoder | None = None
        self.attention = self._attention(dtype, formats)

    # -- building ---------------------------------------------------------------------

    def put(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self.device, dtype=self.dtype)

    def settled(self, linear: L) -> L:
        """`linear`, its blocks moved into the load's arena (while the model is built)."""
        if linear.blocks is not None and self._arena is not None:
            self._arena.settle(linear.blocks)
        return linear

    def norm_weight(self, w: torch.Tensor) -> torch.Tensor:
        if self.norm_offset:
            w = w.float() + self.norm_offset
        return self.put(w)

    def _lm_head(
        self, w: Weights, stored: dict[str, BlockWeight], formats: WeightFormats,
        dtype: torch.dtype, native_rows: int,
    ) -> Linear | None:  # fmt: skip
        # Logits are computed on rank 0 only.
        if self.tp_rank != 0:
            return None
        if self.embed_blocks is not None:
            # A GGUF's head (its own or the embedding's), as blocks only: they serve every
            # step, with no float copy.
            blocks = stored["lm_head.weight"]
            assert isinstance(blocks, Q8_0)  # load_gguf_blocks makes the head Q8_0
            return Linear(None, "none", blocks)
        lm_head = w.get("lm_head.weight")
        tied = lm_head is None or getattr(self.config, "tie_word_embeddings", False)
        head = self.put(lm_head) if lm_head is not None and not tied else self.embed
        assert head is not None  # a float embedding wherever the head is not in blocks
        if formats.blocks is None:
            return Linear(head, self.quantization)
        # With 4-bit layers, small steps take the head from 8-bit blocks (the GGUF's own)
        # with 16-bit activations: 8-bit ones flipped the very first token of "What is the
        # capital of France?" (the final hidden state has one outlier ~30x the others, which
        # cost the rest of its block their precision). Larger steps take the float format.
        return Linear(
            head,
            large_format(dtype),
            _head_blocks(stored, head, tied),
            head_block_rows(formats.large, native_rows),
        )

    def _rope_tables(self, config: PretrainedConfig, keys: set[str | None]) -> None:
        """cos and sin (sin as rope_rotation_sin's) per rope table the layers use."""
        self.rope_cos: dict[str, torch.Tensor] = {}
        self.rope_sin: dict[str, torch.Tensor] = {}
        for key in sorted(k for k in keys if k is not None):
            cos_sin = rope_tables(config, self.max_len, self.head_dim, key or None)
            self.rope_cos[key] = cos_sin[0].to(device=self.device, dtype=self.dtype)
            self.rope_sin[key] = rope_rotation_sin(cos_sin[1]).to(
                device=self.device, dtype=self.dtype
            )
        # The one table of a model whose layers share it (the native path's and CUDA
        # graphs'): the first layer's.
        first = self.layers[0].rope
        if first is not None:
            self.cos, self.sin = self.rope_cos[first], self.rope_sin[first]
        self.rotary_dim = self.cos.shape[-1] if first is not None else self.head_dim

    def _attention(self, dtype: torch.dtype, formats: WeightFormats) -> Attention:
        # The torch path's attention: straight over the paged pool where it builds (CPU,
        # float32) and every layer's attention is plain, else a gather of each group's
        # blocks and SDPA (or the exact torch path of windowed and soft-capped layers).
        paged = None
        if self.attention_plain and PagedAttention.usable(self.device, dtype):
            lib = paged_attention.load()
            assert lib is not None  # usable() loaded it
            paged = PagedAttention(
                lib, self.num_heads, self.num_kv_heads, self.head_dim, self.scale
            )
        return Attention(
            self.num_heads, self.num_kv_heads, self.head_dim, self.scale,
            kernels.load() if self.device.type == "cpu" else None,
            formats.large == "bf16", paged,
        )  # fmt: skip

    @property
    def attention_plain(self) -> bool:
        """Whether every layer attends by plain causal softmax (what the fast kernels do)."""
        return all(layer.attention.plain for layer in self.layers)

    @property
    def llama_shaped(self) -> bool:
        """Whether the whole forward is Llama's (what native_decode's C layers compute)."""
        return (
            self.silu
            and self.embed_scale is None
            and self.final_softcap is None
            and self.rotary_dim == self.head_dim
            and len(self.rope_cos) == 1
            and all(layer.llama_shaped for layer in self.layers)
        )

    @property
    def paged(self) -> PagedAttention | None:
        return self.attention.paged

    @paged.setter
    def paged(self, value: PagedAttention | None) -> None:
        self.attention.paged = value

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
            return self.attend(qkv, kv_caches[i], meta, i)

        return self.layers_forward(input_ids, meta.positions, call_linear, attend, self.pool_ops)

    def layers_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        linear: Callable[[Linear | StackedLinear, torch.Tensor], torch.Tensor],
        attend: Callable[[int, torch.Tensor], torch.Tensor],
        ops: RowOps | None = None,
    ) -> torch.Tensor:
        """The torch path's layers, with the products (`linear`) and the attention of layer
        i (`attend(i, qkv)`: writes the rows' K/V, returns [T, heads, head_dim]) supplied by
        the caller: the eager forward calls them directly, the compiled step
        (compiled_step.py) through opaque custom ops, so one graph holds everything else.
        `ops`: the work between the products (row_ops.py; torch ops by default)."""
        ops = ops or self.torch_ops
        x = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        tables = {
            k: (self.rope_cos[k][positions], self.rope_sin[k][positions]) for k in self.rope_cos
        }
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        reduce = self.all_reduce or _unchanged
        act = ops.act if self.silu else self.act
        layers = self.layers
        x, h = ops.add_norm(x, None, layers[0].input_norm)
        for i, layer in enumerate(layers):
            qkv = linear(layer.qkv, h).view(-1, hq + 2 * hkv, d)
            if layer.q_norm is not None and layer.k_norm is not None:
                q = rms_norm(qkv[:, :hq], layer.q_norm, self.eps)
                k = rms_norm(qkv[:, hq : hq + hkv], layer.k_norm, self.eps)
                qkv = torch.cat((q, k, qkv[:, hq + hkv :]), dim=1)
            if layer.rope is not None:
                cos, sin = tables[layer.rope]
                # q and k are adjacent heads of the fused projection: rotated together, and
                # then k and v are adjacent too and go to the cache in one copy.
                if self.rotary_dim == d:
                    ops.rope(qkv, hq + hkv, cos, sin)
                else:
                    rope_partial(qkv, hq + hkv, cos, sin)
            attn = attend(i, qkv)
            out = reduce(linear(layer.o, attn.reshape(-1, hq * d)))
            if layer.attn_out_norm is not None:
                out = rms_norm(out, layer.attn_out_norm, self.eps)
            x, h = ops.add_norm(x, out, layer.post_norm)
            out = reduce(linear(layer.down, act(linear(layer.gate_up, h))))
            if layer.mlp_out_norm is not None:
                out = rms_norm(out, layer.mlp_out_norm, self.eps)
            # The residual add is fused with the next layer's norm (the final one last).
            after = layers[i + 1].input_norm if i + 1 < len(layers) else self.norm
            x, h = ops.add_norm(x, out, after)
        return h

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The input rows: the float embedding's, or the blocks' (a GGUF's) dequantized."""
        if self.embed_blocks is not None:
            return self.embed_blocks.embedding(input_ids).to(self.dtype)
        assert self.embed is not None
        return F.embedding(input_ids, self.embed)

    def attend(
        self, qkv: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, layer: int = 0
    ) -> torch.Tensor:
        """Layer `layer`'s attention: writes the step's K/V into its pool, then attends:
        qkv [T, heads + 2 * kv_heads, head_dim] (rope applied) -> [T, heads, head_dim]."""
        spec = self.layers[layer].attention if self.layers else PLAIN
        return self.attention.attend(qkv, kv_cache, meta, spec)

    def close(self) -> None:
        """Nothing to release here; TensorParallelModel.close() stops the other ranks."""

    def compute_logits(self, hidden: torch.Tensor, as_rows: int | None = None) -> torch.Tensor:
        """The rows' logits; `as_rows`: the step whose head product they take (Linear's)."""
        if self.lm_head is None:
            raise RuntimeError("logits are computed on tensor-parallel rank 0 only")
        logits = self.lm_head(hidden, as_rows).float()
        if self.final_softcap is not None:
            logits = softcap(logits, self.final_softcap)
        return logits


def _unchanged(x: torch.Tensor) -> torch.Tensor:
    return x


def _head_blocks(stored: dict[str, BlockWeight], head: torch.Tensor, tied: bool) -> Q8_0:
    """The lm_head as Q8_0: the GGUF's own blocks where the folder came from one (`stored`),
    else quantized from the float weight now."""
    own = stored.get("embed_tokens.weight" if tied else "lm_head.weight")
    if isinstance(own, Q8_0) and own.shape == tuple(head.shape):
        return own
    return Q8_0.quantize(head)


def _block_weights(stored: dict[str, BlockWeight], w: Weights) -> dict[str, BlockWeight]:
    """Each linear's blocks: the GGUF's own where the model came from one (`stored`, taken
    over: Q4_1, Q4_K, Q5_K, or Q8_0 and Q6_K: gguf_model.layer_formats), else 4-bit ones
    quantized from the float weights now."""
    blocks: dict[str, BlockWeight] = {}
    for name in dict.fromkeys([*stored, *w]):
        if name.endswith("_proj.weight"):
            b = stored.pop(name, None)
            blocks[name] = b if isinstance(b, (Q4_1, Q8_0)) else Q4_1.quantize(w[name])
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
