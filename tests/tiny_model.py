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


# Text to learn a small tokenizer's merges from: everyday English, as chat turns use.
_CORPUS = (
    "Hello! How are you today? I am fine, thank you. What is the capital of France? "
    "The capital of France is Paris. Tell me a joke about caches. Why did the cache miss "
    "the party? It was evicted. Please write a short poem about the sea and the sky. "
    "You are a helpful assistant. Answer in one sentence. Two plus two is four. "
)


def build_tiny_llama_own_tokenizer(folder: Path, template_source: Path, seed: int = 0) -> Path:
    """A tiny llama like build_tiny_llama's, with a tokenizer of its own: a byte-level BPE
    of 512 ids learnt here (the default model's has 49152), the same ChatML template and
    end-of-turn token. Another model's token ids mean nothing to it, or are out of its
    vocabulary altogether."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([_CORPUS] * 50, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    tokenizer.chat_template = (template_source / "chat_template.jinja").read_text()
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        initializer_range=0.02,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
