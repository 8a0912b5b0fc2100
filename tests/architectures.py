"""Tiny random-weight models of every registered architecture, made with transformers from a
config, with the default model's tokenizer: what the architecture tests compare against."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.tiny_model import TOKENIZER_FILES

# A window shorter than the test prompts, so windowed layers really drop positions.
WINDOW = 16

_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 49152,
    "max_position_embeddings": 1024,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}

# name -> (transformers config class, model class, the family's own settings)
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": WINDOW,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
            },
        },
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"tie_word_embeddings": False}),
}


def build_tiny(
    name: str,
    folder: Path,
    tokenizer_source: Path,
    seed: int = 0,
    initializer_range: float = 0.2,
    **overrides: Any,
) -> Path:
    """Save a 3-layer random `name` model (hidden 64, 4 heads, 2 KV heads) in `folder`.

    A larger `initializer_range` than the default keeps next-token distributions peaked, so
    greedy decoding has clear winners that float32 rounding cannot flip."""
    import torch
    import transformers

    config_name, model_name, own = ARCHITECTURES[name]
    torch.manual_seed(seed)
    settings = {**_COMMON, "initializer_range": initializer_range, **own, **overrides}
    config = getattr(transformers, config_name)(**settings)
    getattr(transformers, model_name)(config).save_pretrained(folder)
    for file in TOKENIZER_FILES:
        if (tokenizer_source / file).is_file():
            shutil.copy(tokenizer_source / file, folder / file)
    return folder
