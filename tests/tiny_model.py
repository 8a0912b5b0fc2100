"""A tiny random-weight llama with the default model's tokenizer: the real engine and web
code run on it in milliseconds. Tests about what a model says use the real model."""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def build_tiny_llama(
    folder: Path,
    tokenizer_source: Path,
    seed: int = 0,
    max_position_embeddings: int = 2048,
    initializer_range: float = 0.02,
) -> Path:
    """Save a 2-layer llama (hidden 64, 4 heads, 2 KV heads, vocab 49152) in `folder`.

    A larger `initializer_range` keeps next-token distributions peaked, so greedy decoding
    has clear winners that float32 rounding cannot flip.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=49152,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer_source / name).is_file():
            shutil.copy(tokenizer_source / name, folder / name)
    return folder
