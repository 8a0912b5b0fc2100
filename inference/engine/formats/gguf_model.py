"""A GGUF file as a model: its transformers config, tokenizer and Hugging Face-named weights.

`load_gguf_config` maps `general.architecture` and its `<arch>.*` keys onto the
transformers config of that model type; `load_gguf_weights` renames the tensors to the names
a Hugging Face checkpoint of that type uses and undoes what llama.cpp's converter changed
(the q/k row order of llama-family models, Gemma's norm weights stored plus one).
`load_gguf_blocks` gives every matrix in the blocks the engine multiplies natively (Q4_K,
Q5_K and Q6_K as the file has them, Q4_1, or Q8_0 where the file's is Q8_0, and for the
embedding and head unless they are Q6_K), one tensor at a time, for the quantized modes.
An architecture or tensor this file does not know is refused by name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, PretrainedConfig, PreTrainedTokenizerBase

from inference.engine import huge_pages
from inference.engine.errors import UnsupportedModelError
from inference.engine.formats.ggml_types import k_low_nibbles, k_scales
from inference.engine.formats.gguf_file import GGUFFile, GGUFTensor, return_freed_memory
from inference.engine.layers.fused import FUSED_PRODUCTS, QKV
from inference.engine.quantized import (
    GROUP,
    K_QUANT_DIVISORS,
    Q4_1,
    Q4_K,
    Q5_K,
    Q6_BYTES,
    Q6_K,
    Q8_0,
    QK,
    QK_K,
    BlockWeight,
)


class UnsupportedGGUF(UnsupportedModelError):
    pass


@dataclass(frozen=True)
class Architecture:
    model_type: str
    # llama.cpp's converter interleaves each head's q/k rows for its rope (llama family).
    permuted_qk: bool = False
    # Gemma's norms scale by (1 + w); the converter stores 1 + w.
    norm_offset: float = 0.0
    # GGUF layer tensor -> HF module, where it differs from _LAYER_NAMES.
    layer_names: tuple[tuple[str, str], ...] = ()


_GEMMA_NORMS = (
    ("attn_norm", "input_layernorm"),
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
)

# general.architecture -> how its file maps onto transformers.
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("llama", permuted_qk=True),
    "qwen2": Architecture("qwen2"),
    "qwen3": Architecture("qwen3"),
    "gemma2": Architecture("gemma2", norm_offset=1.0, layer_names=_GEMMA_NORMS),
    "gemma3": Architecture("gemma3_text", norm_offset=1.0, layer_names=_GEMMA_NORMS),
    "phi3": Architecture(
        "phi3",
        layer_names=(("attn_qkv", "self_attn.qkv_proj"), ("ffn_up", "mlp.gate_up_proj")),
    ),
}

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def gguf_path(path: str | Path) -> Path | None:
    """The GGUF file `path` names: itself, or the one .gguf in a folder; None where it names
    neither (a Hugging Face folder). A folder of several is refused: which one is meant?"""
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return p
    if not p.is_dir():
        return None
    found = sorted(p.glob("*.gguf"))
    if len(found) > 1:
        names = ", ".join(f.name for f in found)
        raise UnsupportedGGUF(f"{p} holds several GGUF files ({names}); name one of them")
    if found and not (p / "config.json").is_file():
        return found[0]
    return None


def open_gguf(path: str | Path) -> GGUFFile:
    """The file, parsed once for the config, the tokenizer, the weights and the blocks (a
    vocabulary is ~100k fields, read in 0.1-0.2 s by gguf_file._Header)."""
    p = Path(path).resolve()
    stat = p.stat()
    return _open_cached(p, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _open_cached(path: Path, mtime_ns: int, size: int) -> GGUFFile:
    return GGUFFile(path)


def architecture(file: GGUFFile) -> Architecture:
    arch = ARCHITECTURES.get(file.architecture)
    if arch is None:
        supported = ", ".join(ARCHITECTURES)
        raise UnsupportedGGUF(
            f"{file.path.name}: architecture {file.architecture or '(none)'!r} is not "
            f"supported; supported: {supported}"
        )
    return arch


def _f32(value: Any) -> float:
    """A float32 metadata value as the decimal it was written from (1e-06, not 9.99e-07)."""
    return float(str(np.float32(value)))


def load_gguf_config(path: str | Path) -> PretrainedConfig:
    return gguf_config(open_gguf(path))


def gguf_config(file: GGUFFile) -> PretrainedConfig:
    arch = architecture(file)
    a = file.architecture

    def get(key: str, default: Any = None) -> Any:
        return file.get(f"{a}.{key}", default)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    names = set(file.tensor_names())
    head_dim = int(get("attention.key_length", hidden // heads))
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": _f32(get("rope.freq_base", 1e4))}
    # Phi-4-mini rotates part of each head only: the converter writes the rotated width.
    if (rotated := int(get("rope.dimension_count", head_dim))) != head_dim:
        rope["partial_rotary_factor"] = rotated / head_dim
    scaling = get("rope.scaling.type", "none")
    if "rope_factors_long.weight" in names:
        rope.update(_longrope(file, get))
    elif scaling in ("linear", "yarn"):
        rope.update(rope_type=scaling, factor=_f32(get("rope.scaling.factor")))
        if scaling == "yarn":
            rope["original_max_position_embeddings"] = int(
                get("rope.scaling.original_context_length")
            )
    elif scaling != "none":
        raise UnsupportedGGUF(
            f"{file.path.name}: rope scaling {scaling!r} is not supported; "
            "supported: none, linear, yarn, per-frequency divisors (rope_freqs), long and "
            "short factors (rope_factors_long / _short: Phi-3's longrope)"
        )
    eos = file.get("tokenizer.ggml.eos_token_id")
    fields: dict[str, Any] = {
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": int(get("vocab_size", 0) or len(file.get("tokenizer.ggml.tokens"))),
        "tie_word_embeddings": "output.weight" not in names,
        "rope_parameters": rope,
        "bos_token_id": file.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": file.get("tokenizer.ggml.padding_token_id", eos),
        "attention_bias": "blk.0.attn_q.bias" in names,
        "torch_dtype": "float32",
    }
    if arch.model_type == "phi3":
        # Phi3Config keeps it beside its rope parameters, which take it over their own (and
        # default it to 4096): the pretraining length, where longrope switches factors.
        fields["original_max_position_embeddings"] = int(
            get("rope.scaling.original_context_length", fields["max_position_embeddings"])
        )
    # Phi-3's converter writes a window of 0 for "none" (Phi-4's sets one).
    if window := int(get("attention.sliding_window", 0) or 0):
        fields["sliding_window"] = window
    for key, hf in (
        ("attn_logit_softcapping", "attn_logit_softcapping"),
        ("final_logit_softcapping", "final_logit_softcapping"),
    ):
        if (v := get(key)) is not None:
            fields[hf] = _f32(v)
    if arch.model_type.startswith("gemma"):
        # Not in the file: llama.cpp scales Gemma's queries by 1 / sqrt(head_dim), but for
        # the 27B models (known by their layer count) by 1 / sqrt(hidden / heads).
        big = {"gemma2": 46, "gemma3_text": 62}[arch.model_type] == fields["num_hidden_layers"]
        fields["query_pre_attn_scalar"] = hidden // heads if big else fields["head_dim"]
    if arch.model_type == "gemma3_text":
        fields.update(_gemma3_layers(get, fields))
    config: PretrainedConfig = AutoConfig.for_model(arch.model_type, **fields)
    if "rope_freqs.weight" in names:
        # Llama 3's scaling, which the converter writes as its result only: each frequency's
        # divisor (1 .. factor), not the settings it came from. They are applied as they
        # are, as llama.cpp does (layers/rotary.py divides the default frequencies by
        # them); set after the config is made, whose check knows no such key.
        divisors = file.tensors()["rope_freqs.weight"].dequantize().tolist()
        config.rope_parameters["freq_factors"] = divisors
    config.architectures = [_CAUSAL_LM[arch.model_type]]
    return config


def _longrope(file: GGUFFile, get: Callable[..., Any]) -> dict[str, Any]:
    """Phi-3's longrope (the 128k models, Phi-3.5, Phi-4-mini) as transformers' parameters:
    the converter writes the long and short factors as tensors, the pretraining length and
    the attention factor (cos and sin scaled by it) as metadata, and no scaling type.
    layers/rotary.py then takes the short factors below that length and the long ones from
    it on, as for a Hugging Face folder. (llama.cpp picks one set for a whole context by
    its size: the long where the context exceeds that length.)"""
    if file.architecture != "phi3":
        raise UnsupportedGGUF(
            f"{file.path.name}: rope scaling stored as long and short factors (longrope) is "
            f"supported for phi3 only, not {file.architecture!r}"
        )
    tensors = file.tensors()
    factors = {
        f"{kind}_factor": [
            _f32(v) for v in tensors[f"rope_factors_{kind}.weight"].dequantize().tolist()
        ]
        for kind in ("long", "short")
    }
    original = get("rope.scaling.original_context_length")
    if original is None:
        raise UnsupportedGGUF(
            f"{file.path.name}: longrope factors without "
            f"{file.architecture}.rope.scaling.original_context_length"
        )
    params: dict[str, Any] = {
        "rope_type": "longrope",
        **factors,
        "original_max_position_embeddings": int(original),
    }
    # The converter computes it as transformers does by default; llama.cpp uses the file's.
    if (attention := get("rope.scaling.attn_factor")) is not None:
        params["attention_factor"] = _f32(attention)
    return params


def _gemma3_layers(get: Callable[..., Any], fields: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's kinds of layer and a rope for each, as llama.cpp reads them: windowed layers
    where the file sets a window, every sixth global unless a pattern says otherwise (a
    count, or one flag per layer); the file's rope (its base and scaling) on the global
    layers, base rope.freq_base_swa (10,000 unless set) and no scaling on the windowed."""
    n = fields["num_hidden_layers"]
    pattern = get("attention.sliding_window_pattern", 6)
    if "sliding_window" not in fields:
        windowed = [False] * n
    elif isinstance(pattern, (list, tuple)):
        windowed = [bool(p) for p in pattern]
    else:
        windowed = [(i + 1) % int(pattern) != 0 for i in range(n)]
    local = {"rope_type": "default", "rope_theta": _f32(get("rope.freq_base_swa", 1e4))}
    return {
        "layer_types": ["sliding_attention" if w else "full_attention" for w in windowed],
        "rope_parameters": {
            "sliding_attention": local,
            "full_attention": fields["rope_parameters"],
        },
    }


_CAUSAL_LM = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}


def load_gguf_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer and chat template the file carries (transformers builds it from the
    vocabulary alone). Its class is the one AutoTokenizer gives the model type of the
    config, taken from the file as parsed once (open_gguf): AutoTokenizer given the file
    parses all of it again for that type (seconds), where the vocabulary takes a tenth."""
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    p = Path(path)
    config = load_gguf_config(p)
    tokenizer_class: Any = TOKENIZER_MAPPING.get(type(config), TokenizersBackend)
    tokenizer: PreTrainedTokenizerBase = tokenizer_class.from_pretrained(p.parent, gguf_file=p.name)
    return tokenizer


# Tensors that are settings, not weights: read into the config (gguf_config).
_CONFIG_TENSORS = frozenset(
    {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
)


def weights(file: GGUFFile) -> dict[str, GGUFTensor]:
    """The file's weight tensors by GGUF name."""
    return {n: t for n, t in file.tensors().items() if n not in _CONFIG_TENSORS}


def hf_name(name: str, arch: Architecture, file: str = "") -> str:
    """GGUF tensor name -> the Hugging Face checkpoint's; a refusal for one not known."""
    base, _, suffix = name.rpartition(".")
    if base in _TOP_NAMES:
        return f"{_TOP_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk":
        kind = parts[2]
        module = dict(arch.layer_names).get(kind) or _LAYER_NAMES.get(kind)
        if module is not None:
            return f"model.layers.{parts[1]}.{module}.{suffix}"
    raise UnsupportedGGUF(
        f"{file}: tensor {name} is not known for architecture {arch.model_type!r}"
    )


def _unpermute_index(rows: int, heads: int) -> torch.Tensor:
    """The converter stores each head's rows as (pairs, 2) -> (2, pairs); HF row i is GGUF
    row index[i]."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)


def _row_order(name: str, rows: int, arch: Architecture, config: PretrainedConfig) -> Any:
    """The index that puts a q/k weight's (or bias's) rows back in HF order; None if none."""
    if not arch.permuted_qk:
        return None
    if ".self_attn.q_proj." in name:
        return _unpermute_index(rows, config.num_attention_heads)
    if ".self_attn.k_proj." in name:
        return _unpermute_index(rows, config.num_key_value_heads)
    return None


def _hf_tensors(
    path: str | Path,
) -> tuple[PretrainedConfig, Architecture, dict[str, GGUFTensor]]:
    file = open_gguf(path)
    config, arch = gguf_config(file), architecture(file)
    return config, arch, {hf_name(n, arch, file.path.name): t for n, t in weights(file).items()}


def load_gguf_weights(path: str | Path, skip: Collection[str] = ()) -> dict[str, torch.Tensor]:
    """Every tensor as float32 under its Hugging Face name, in Hugging Face's row order, but
    those whose name without `model.` is in `skip` (load_gguf_blocks holds them).

    One tensor is dequantized at a time; F32 tensors stay views of the mapped file."""
    config, arch, tensors = _hf_tensors(path)
    return {
        name: _float(name, t, arch, config)
        for name, t in tensors.items()
        if name.removeprefix("model.") not in skip
    }


def _float(name: str, t: GGUFTensor, arch: Architecture, config: PretrainedConfig) -> torch.Tensor:
    w = t.dequantize()
    order = _row_order(name, w.shape[0], arch, config)
    if order is not None:
        w = w[order]
    if arch.norm_offset and name.endswith("norm.weight"):
        w = w - arch.norm_offset
    return w


def gguf_weight_reader(path: str | Path) -> Callable[[str], torch.Tensor | None]:
    """A float32 tensor by its name without `model.`, read when asked (None: no such
    tensor): the float copies a step size needs beside load_gguf_blocks' (hybrid's large
    steps where the blocks do not serve them), made one at a time. A part of a fused
    matrix (Phi-3's q_proj of qkv_proj) is cut from it."""
    config, arch, tensors = _hf_tensors(path)
    parts = {
        part: (name, lo, hi)
        for name, t in tensors.items()
        for part, lo, hi in _fused_parts(name.removeprefix("model."), t.shape[0], config)
    }

    def read(name: str) -> torch.Tensor | None:
        if name not in parts:
            return None
        source, lo, hi = parts[name]
        return _float(source, tensors[source], arch, config)[lo:hi]

    return read


def _fused_parts(name: str, rows: int, config: PretrainedConfig) -> list[tuple[str, int, int]]:
    """The projections a matrix holds, each with its rows: itself, or (Phi-3) q, k and v of
    qkv_proj and gate and up of gate_up_proj, as the layers name them."""
    if name.endswith("self_attn.qkv_proj.weight"):
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
        cuts = [("q", 0, q), ("k", q, q + kv), ("v", q + kv, q + 2 * kv)]
        return [(name.replace("qkv_proj", f"{p}_proj"), lo, hi) for p, lo, hi in cuts]
    if name.endswith("mlp.gate_up_proj.weight"):
        half = rows // 2
        return [
            (name.replace("gate_up_proj", "gate_proj"), 0, half),
            (name.replace("gate_up_proj", "up_proj"), half, rows),
        ]
    return [(name, 0, rows)]


_HEAD_NAMES = ("embed_tokens.weight", "lm_head.weight")


def load_gguf_blocks(path: str | Path) -> dict[str, BlockWeight]:
    """Every matrix in the engine's block objects, named as load_blocks names them (no
    `model.` prefix; a tied head shares the embedding's blocks), read one tensor at a time
    with no float copy of the whole model: the embedding and head as Q6_K where the file
    has them so, else Q8_0; each layer matrix as Q4_K, Q6_K, Q4_1 or Q8_0 (layer_formats:
    by its own type in the file).

    Q4_1, Q4_K, Q5_K, Q6_K and Q8_0 blocks are kept as they are; Q4_0 is Q4_1 exactly (its
    offset is -8 scales); a matrix fused with one of another format than its own (q with
    k, gate with up) is held in the widest of theirs (layer_formats); any other (the float
    types) is dequantized per tensor and quantized to the engine's format."""
    file = open_gguf(path)
    config, arch = gguf_config(file), architecture(file)
    formats = layer_formats(file)
    out: dict[str, BlockWeight] = {}
    for gguf_name, t in weights(file).items():
        name = hf_name(gguf_name, arch, file.path.name)
        key = name.removeprefix("model.")
        if len(t.shape) != 2:
            continue
        # The embedding and head go to the kernels' layout now, which an embedding lookup
        # reads too: their GGUF layout would be a second copy of the largest matrix.
        if key in _HEAD_NAMES:
            w: BlockWeight = _as_kernel_q6_k(t) if t.type.name == "Q6_K" else _as_kernel_q8_0(t)
        else:
            w = _HOLD[formats[gguf_name]](t)
        order = _row_order(name, t.shape[0], arch, config)
        if order is not None:
            w = w.take_rows(order)
        for part, lo, hi in _fused_parts(key, t.shape[0], config):
            out[part] = w if (lo, hi) == (0, t.shape[0]) else w.rows(lo, hi)
        file.release(t)
        return_freed_memory()
    if "lm_head.weight" not in out and "embed_tokens.weight" in out:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


# Types that 8-bit blocks hold with far less error than 4-bit ones: on a tiny llama, the
# next token agreed with llama-server's on the same file 9/24 (Q8_0) and 5/24 (Q5_K_M,
# Q6_K) with these layers at 4 bits, 19-22/24 at 8, as in exact mode; a Q4_K_M file's 15/24
# with its Q6_K matrices at 4 bits, 20/24 with them at 8 (tests/engine/test_gguf_models.py).
# Q5_K and Q6_K are held in their own blocks (held_as), at 8 bits only where fused with
# another format (layer_formats: q with k, gate with up). The float types go to 4 bits, as
# a float folder's layers are quantized at load.
# Q5_0 and Q5_1 are what llama-quantize writes, in a Q4_K_M or Q5_K_M file, for a matrix
# whose rows are not whole super-blocks of 256 (hidden 576, 896 or 960: SmolLM2's, Qwen2.5
# 0.5B's), and IQ4_NL in place of smaller K-quants: the kernels have no 5-bit format with a
# scale per 32, so Q8_0 holds them, Q5_0's and IQ4_NL's values exactly (a scale and an int8
# a weight: GGMLType.int8_blocks), Q5_1's within half an 8-bit step.
_HELD_AT_8_BITS = frozenset({"Q8_0", "Q5_0", "Q5_1", "IQ4_NL"})

# The matrices of a layer that the engine multiplies as one (layers/fused.py's table, which
# DecoderLayer fuses by), by their GGUF names: one product, one format. Except v: a q/k/v
# product may be two (q and k, then v: DecoderLayer's StackedLinear), so v keeps its own.
_GGUF_LAYER_NAMES = {hf: gguf for gguf, hf in _LAYER_NAMES.items()}
_FUSED = tuple(
    tuple(_GGUF_LAYER_NAMES[m] for m in group if m != QKV[-1]) for group in FUSED_PRODUCTS
)


LayerFormat = type[Q4_1] | type[Q4_K] | type[Q5_K] | type[Q6_K] | type[Q8_0]


def held_as(type_name: str) -> LayerFormat:
    """The blocks a layer matrix of this GGUF type is held in, where no fused product
    widens it (layer_formats)."""
    if type_name in _HELD_AT_8_BITS:
        return Q8_0
    return {"Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K}.get(type_name, Q4_1)


def layer_formats(file: GGUFFile) -> dict[str, LayerFormat]:
    """The blocks each layer matrix is held in, by GGUF name: Q8_0 where the file's type
    is Q8_0 (_HELD_AT_8_BITS), Q4_K's, Q5_K's and Q6_K's own where it is one of them, else
    Q4_1; the matrices of one fused product in one format. Where those differ it is the
    widest of theirs: Q8_0 where one is Q8_0 or Q6_K, or Q5_K beside Q4_1 (the product's
    kernels take one format, and Q6_K's values with Q4_K's or Q5_K's are no one block
    format's exactly: Q8_0 holds both within half an 8-bit step); Q5_K where the rest are
    Q4_K (which Q5_K holds exactly, its fifth bits 0); else Q4_1 (which holds Q4_K's values
    with its scales rounded to float16). v keeps its own format beside q's and k's (_FUSED).
    So a Q4_K_M file's Q6_K ffn_down, attn_v and head keep their own blocks, and the rest
    stays Q4_K."""
    formats: dict[str, LayerFormat] = {
        name: held_as(t.type.name)
        for name, t in file.tensors().items()
        if len(t.shape) == 2 and name.startswith("blk.")
    }
    for name in list(formats):
        blk, layer, module, suffix = name.split(".", 3)
        for group in _FUSED:
            if module not in group:
                continue
            names = [f"{blk}.{layer}.{other}.{suffix}" for other in group]
            kinds = {formats[n] for n in names if n in formats}
            if len(kinds) == 1:
                continue
            wide = _widest(kinds)
            for n in names:
                if n in formats:
                    formats[n] = wide
    return formats


def _widest(kinds: set[LayerFormat]) -> LayerFormat:
    """The one format that holds every kind of a fused product (layer_formats)."""
    if kinds & {Q8_0, Q6_K} or {Q5_K, Q4_1} <= kinds:
        return Q8_0
    return Q5_K if Q5_K in kinds else Q4_1


def gguf_matrix_names(path: str | Path) -> set[str]:
    """The names (without `model.`) of the tensors load_gguf_blocks turns into blocks."""
    file = open_gguf(path)
    arch = architecture(file)
    return {
        hf_name(n, arch, file.path.name).removeprefix("model.")
        for n, t in weights(file).items()
        if len(t.shape) == 2
    }


# Rows converted at once: ~4 MB of float32, so that a conversion's temporaries stay small
# beside the model (an embedding of 50M weights made ~1 GB of them in one go).
CHUNK_ELEMS = 1 << 18


def _by_rows(
    t: GGUFTensor,
    convert: Callable[[GGUFTensor], Any],
    arrays: Callable[[Any], tuple[torch.Tensor, ...]],
    out: tuple[torch.Tensor, ...],
    chunk: int = CHUNK_ELEMS,
) -> None:
    """`out` (arrays of t's rows) filled with convert's `arrays` about `chunk` weights at a
    time: no list of converted parts beside the whole, which joined held it twice."""
    step = max(1, chunk // t.shape[-1])
    for lo in range(0, t.shape[0], step):
        part = t.raw[lo : lo + step]
        done = convert(GGUFTensor(t.name, t.type, (len(part), *t.shape[1:]), part))
        for dst, src in zip(out, arrays(done), strict=True):
            dst[lo : lo + len(part)] = src


def _as_q4_1(t: GGUFTensor) -> Q4_1:
    rows, k = t.shape
    qs = torch.empty(rows, k // 2, dtype=torch.uint8)
    d, m = (
        torch.empty(rows, k // QK, dtype=torch.float16),
        torch.empty(rows, k // QK, dtype=torch.float16),
    )
    _by_rows(t, _rows_as_q4_1, lambda q: (q.qs, q.d, q.m), (qs, d, m))
    return Q4_1(qs, d, m)


def _as_q4_k(t: GGUFTensor) -> Q4_K:
    rows, k = t.shape
    qs = torch.empty(rows, k // 2, dtype=torch.uint8)
    d, m = (torch.empty(rows, k // QK_K, dtype=torch.float16) for _ in range(2))
    sc, mn = (torch.empty(rows, k // QK, dtype=torch.uint8) for _ in range(2))
    _by_rows(t, _rows_as_q4_k, lambda q: (q.qs, q.d, q.m, q.sc, q.mn), (qs, d, m, sc, mn))
    return Q4_K(qs, d, m, sc=sc, mn=mn)


def _rows_as_q4_k(t: GGUFTensor) -> Q4_K:
    """Q4_K blocks as they are: the nibbles in Q4_1's order, each 6-bit scale and minimum
    a byte, d and -dmin as float16."""
    b = t.raw.reshape(t.shape[0], -1, t.type.block_bytes)
    qs, d, m, sc, mn = _k_parts(b, 16)
    return Q4_K(qs, d, m, sc=sc, mn=mn)


def _k_parts(b: torch.Tensor, nibbles_at: int) -> tuple[torch.Tensor, ...]:
    """(qs, d, -dmin, sc, mn) of Q4_K's or Q5_K's super-blocks `b` (rows, blocks, bytes):
    the nibbles (128 bytes from `nibbles_at`) in Q4_1's order, each 6-bit scale and minimum
    a byte."""
    rows = b.shape[0]
    sc, mn = k_scales(b[..., 4:16])
    q = k_low_nibbles(b[..., nibbles_at : nibbles_at + 128]).reshape(rows, -1, 32)
    qs = (q[..., :16] | (q[..., 16:] << 4)).reshape(rows, -1)
    return qs, _half(b[..., 0:2]), -_half(b[..., 2:4]), sc.reshape(rows, -1), mn.reshape(rows, -1)


def _as_q5_k(t: GGUFTensor) -> Q5_K:
    """Q5_K blocks as they are, or a Q4_K tensor's as Q5_K's (fused with Q5_K ones: every
    fifth bit 0, the same values)."""
    if t.type.name == "Q4_K":
        return Q5_K.of_q4_k(_as_q4_k(t))
    rows, k = t.shape
    qs = torch.empty(rows, k // 2, dtype=torch.uint8)
    d, m = (torch.empty(rows, k // QK_K, dtype=torch.float16) for _ in range(2))
    sc, mn = (torch.empty(rows, k // QK, dtype=torch.uint8) for _ in range(2))
    qh = torch.empty(rows, k // 8, dtype=torch.uint8)
    _by_rows(t, _rows_as_q5_k, lambda q: (q.qs, q.d, q.m, q.sc, q.mn, q.qh), (qs, d, m, sc, mn, qh))
    return Q5_K(qs, d, m, sc=sc, mn=mn, qh=qh)


def _rows_as_q5_k(t: GGUFTensor) -> Q5_K:
    """Q5_K blocks as they are: Q4_K's parts (_rows_as_q4_k) from the same places past the
    32 bytes of fifth bits, which are kept as the file has them."""
    b = t.raw.reshape(t.shape[0], -1, t.type.block_bytes)
    qs, d, m, sc, mn = _k_parts(b, 48)
    return Q5_K(qs, d, m, sc=sc, mn=mn, qh=_qs(b[..., 16:48]))


def _rows_as_q4_1(t: GGUFTensor) -> Q4_1:
    rows = t.shape[0]
    b = t.raw.reshape(rows, -1, t.type.block_bytes)
    kind = t.type.name
    # Scales as float16, as the kernels hold them: float32 ones would make the blocks a fifth
    # larger until the layers take them over.
    if kind == "Q4_1":
        return Q4_1(_qs(b[..., 4:]), _half(b[..., 0:2]), _half(b[..., 2:4]))
    if kind == "Q4_0":
        d = _half(b[..., 0:2])
        return Q4_1(_qs(b[..., 2:]), d, -8 * d)
    if kind == "Q4_K":
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = k_scales(b[..., 4:16])
        # Q4_K's scale and minimum of each 32 (6 bits each, times its d and dmin), rounded
        # to float16: the one step here that is not exact (relative 2^-11 at most).
        scale = (d[..., None] * sc.float()).reshape(rows, -1)
        offset = (dmin[..., None] * mn.float()).reshape(rows, -1)
        q = k_low_nibbles(b[..., 16:144]).reshape(rows, -1, 32)
        return Q4_1.from_values(q, scale.half(), (-offset).half())
    q4 = Q4_1.quantize(t.dequantize())
    return Q4_1(q4.qs, q4.d.half(), q4.m.half())


def _as_q8_0(t: GGUFTensor) -> Q8_0:
    rows, k = t.shape
    qs, d = torch.empty(rows, k, dtype=torch.int8), torch.empty(rows, k // QK)
    # The search of each block's scale (_SEARCHED) holds ~6 float copies of its rows at
    # once: a quarter of the rows at a time keeps that beside a GGUF load's peak small.
    chunk = CHUNK_ELEMS // 4 if t.type.name in _SEARCHED else CHUNK_ELEMS
    _by_rows(t, _rows_as_q8_0, lambda q: (q.qs, q.d), (qs, d), chunk)
    return Q8_0(qs, d)


def _as_kernel_q8_0(t: GGUFTensor) -> Q8_0:
    """Q8_0 blocks in the kernels' layout, made a few rows at a time straight into their
    place: the layout keeps each group of 8 rows together, so whole groups convert alone."""
    rows, k = t.shape
    step = max(GROUP, CHUNK_ELEMS // k // GROUP * GROUP)
    padded = -(-rows // GROUP) * GROUP
    qs = huge_pages.empty((padded, k), torch.int8)
    d = torch.empty(padded, k // QK, dtype=torch.float32)
    for lo in range(0, rows, step):
        part = t.raw[lo : lo + step]
        q8 = _rows_as_q8_0(GGUFTensor(t.name, t.type, (len(part), k), part)).for_kernel()
        qs[lo : lo + q8.qs.shape[0]] = q8.qs
        d[lo : lo + q8.d.shape[0]] = q8.d
    return Q8_0(qs, d, kernel=True, n=rows)


def _rows_as_q8_0(t: GGUFTensor) -> Q8_0:
    if t.type.int8_blocks is not None:
        # A scale and an int8 a weight per 32 (Q8_0, Q5_0, IQ4_NL): Q8_0's blocks exactly.
        d, q = t.type.int8_blocks(t.raw.reshape(t.shape[0], -1, t.type.block_bytes))
        return Q8_0(_qs(q), d.contiguous())
    if t.type.name in _SEARCHED:
        # Each block's scale searched (K_QUANT_DIVISORS): with 127 alone, the Q6_K file's
        # next token agreed with llama-server's on 17/24 prompts in exact mode, 20 with
        # the search, as with the file's own values.
        return Q8_0.quantize(t.dequantize(), K_QUANT_DIVISORS)
    return Q8_0.quantize(t.dequantize())


def _as_q6_k(t: GGUFTensor) -> Q6_K:
    return _rows_as_q6_k(t.raw, t.shape[0])


def _rows_as_q6_k(raw: torch.Tensor, rows: int) -> Q6_K:
    """Q6_K blocks as they are: each 256's 192 bytes of values, 16 int8 scales and d."""
    b = raw.reshape(rows, -1, 210)
    sc = b[..., Q6_BYTES : Q6_BYTES + 16].contiguous().view(torch.int8).reshape(rows, -1)
    return Q6_K(_qs(b[..., :Q6_BYTES]), _half(b[..., Q6_BYTES + 16 :]), sc=sc)


def _as_kernel_q6_k(t: GGUFTensor) -> Q6_K:
    """Q6_K blocks in the kernels' layout, made a few whole groups of rows at a time
    straight into their place (as _as_kernel_q8_0)."""
    rows, k = t.shape
    step = max(GROUP, CHUNK_ELEMS // k // GROUP * GROUP)
    padded = -(-rows // GROUP) * GROUP
    qs = huge_pages.empty((padded, k * 3 // 4), torch.uint8)
    d = torch.empty(padded, k // QK_K, dtype=torch.float16)
    sc = torch.empty(padded, k // 16, dtype=torch.int8)
    for lo in range(0, rows, step):
        part = t.raw[lo : lo + step]
        q6 = _rows_as_q6_k(part, len(part)).for_kernel()
        for dst, src in ((qs, q6.qs), (d, q6.d), (sc, q6.sc)):
            dst[lo : lo + src.shape[0]] = src
    return Q6_K(qs, d, kernel=True, n=rows, sc=sc)


# How a layer matrix becomes the blocks layer_formats holds it in.
_HOLD: dict[LayerFormat, Callable[[GGUFTensor], BlockWeight]] = {
    Q4_1: _as_q4_1,
    Q4_K: _as_q4_k,
    Q5_K: _as_q5_k,
    Q6_K: _as_q6_k,
    Q8_0: _as_q8_0,
}


# The types whose Q8_0 scales are searched (_rows_as_q8_0).
_SEARCHED = frozenset({"Q5_K", "Q6_K", "Q5_1"})


def _qs(b: torch.Tensor) -> torch.Tensor:
    return b.reshape(b.shape[0], -1).contiguous()


def _half(b: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, blocks, 2] -> float16 [rows, blocks]."""
    return b.contiguous().view(torch.float16).squeeze(-1)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, blocks, 2] -> float32 [rows, blocks], as read_gguf holds scales."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()
