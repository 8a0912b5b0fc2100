"""Engine settings: one dataclass, every field with a default that works on a laptop.

The string under each field is its meaning: docs/settings.md is written from them
(`python -m chatapp.settings.reference`), as ENGINE_<FIELD>.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class EngineConfig:
    model: str = ""
    """The model: a Hugging Face folder (config.json, tokenizer, safetensors) or a GGUF file."""
    dtype: str = "auto"
    """`auto`: float32 on a CPU whose weights are 4-bit (`hybrid`, `int4`), else bfloat16
    where the device computes it natively (CUDA, AVX512-BF16, AMX), else float32; or
    `bfloat16`, `float16`, `float32`."""
    device: str = "auto"
    """`auto`: `cuda` if available, else `cpu`."""
    max_num_seqs: int = 64
    """Most sequences decoded together in one step."""
    max_num_batched_tokens: int = 512
    """Token budget of one step (prompts' chunks plus decodes)."""
    # A step with a prompt's chunk pays the torch path's fixed cost whatever the chunk, so
    # fewer, larger chunks serve waiting prompts sooner. Measured (TTFT p50 and p90 against
    # 256 and 512) with `python -m inference.bench.vs_llama --workload chat --no-llama --concurrency
    # 16 64 --variant p384 ENGINE_MAX_PREFILL_TOKENS_DURING_DECODE=384 --variant p512 ...=512`.
    max_prefill_tokens_during_decode: int = 384
    """While any stream decodes, prompts' chunks add at most this many tokens to a step (or
    4 per decoding stream, if more), so a prompt arriving stretches the others' inter-token
    gap by one bounded step; 0: only the step's budget applies."""
    max_model_len: int = 0
    """Context window; 0: the model's `max_position_embeddings` (capped by the KV pool)."""
    block_size: int = 16
    """Tokens per paged KV block."""
    kv_cache_memory_mb: int = 0
    """Memory of the paged KV pool in MB, held (zeroed) from start; 0: room for every
    sequence (`max_num_seqs`) at its full context, within 40% of the memory available once
    the model is loaded (a container's memory limit counts; on CUDA the GPU's free memory)."""
    kv_dtype: str = "auto"
    """The KV pool's element type: `auto` is float16 for a float32 model with quantized
    weights on a CPU where the native kernels load (half the bytes for attention to read,
    twice the tokens in the same memory), else the model dtype (`quantization=none` stays
    exact); or `float32`, `float16`, `bfloat16` (on a CPU with a bfloat16 model only), or
    `int8` (a CPU where the native kernels load: each position's head as int8 values and
    their scale, ~half float16's bytes for attention to read over long contexts, with a
    rounding error of at most half a step of 1/127 of the row's largest value). The Redis
    tier's blocks are in this type."""
    enable_prefix_caching: bool = True
    """Reuse cached KV blocks of identical prefixes (across a conversation's turns, shared
    system prompts)."""
    max_waiting_requests: int = 256
    """Past this many waiting requests a new one is refused at once as busy."""
    max_waiting_tokens: int = 262144
    """Past this many waiting prompt tokens a new request is refused at once as busy."""
    # One core stays with the web side (event loop, tokenizing, the database): with every
    # core in torch's OpenMP team, a busy neighbour made each decode step many times slower.
    num_threads: int = 0
    """Torch's threads for the large steps; 0: one fewer than the cores (at least 1)."""
    # The native steps run in the kernels' own pool, whose workers sleep between steps, so
    # they may take every core: such steps come from few streams, whose web side is light.
    small_step_threads: int = 0
    """Threads of the steps the native path takes, of torch-path steps of one or two
    streams, and of those whose products run in the kernels' pool as 16-bit activations;
    0: every core."""

    def cpu_threads(self) -> int:
        if self.num_threads > 0:
            return self.num_threads
        return max(1, (os.cpu_count() or 1) - 1)

    def small_step_cpu_threads(self) -> int:
        if self.small_step_threads > 0:
            return self.small_step_threads
        return max(1, os.cpu_count() or 1)

    native_max_rows: int = 0
    """With 4-bit weights (`hybrid`, `int4`), steps of at most this many rows take the
    4-bit blocks on the native path, larger ones the float format; 0: the crossover measured
    for this CPU (64 with `hybrid`, 8 with `int4`; docs/performance.md)."""
    # A step's decodes on the native path cost less than the same rows on the float path
    # beside a chunk; with AMX one forward pays the tiles' unpacking once for both
    # (`python -m inference.bench.mixed_step`).
    split_mixed_steps: str = "auto"
    """A step mixing prompts' chunks with 8 or more decoding rows: `on` runs it as two
    forwards (decodes native, chunks on the float path), `off` as one; `auto`: on, except on
    CPUs with AMX."""
    seed: int = 0
    """torch's global seed, set when the engine starts."""
    compile: str = "auto"
    """The torch path's steps as one compiled graph (compiled_step.py): `on`, `off`, or
    `auto`: on where it measured a clear win (CUDA, with CUDA graphs), off on a CPU."""
    quantization: str = "auto"
    """How linear weights are held: `none` (the model dtype, exact), `fp16` (float16-stored,
    float32 compute), `int8`, `int4` (4-bit blocks), `hybrid` (4-bit blocks for steps of up
    to `native_max_rows` rows, the float format above); `auto`: `hybrid` on a CPU where the
    kernels load and the widths are multiples of 64, else `fp16` for a float32 CPU model,
    else `none`; `none` on a GPU or when `dtype` is set explicitly."""
    kv_tier_url: str = ""
    """The Redis tier of the KV cache (docs/kv-tier.md); empty: off; while nobody answers
    there the engine runs memory-only and keeps retrying."""
    kv_tier_ttl_s: int = 86400
    """How long a block stored in the Redis tier lives."""
    kv_tier_max_mb: int = 2048
    """The Redis tier's size cap; the least recently used blocks go first."""
    kv_tier_compression: str = "none"
    """`none`, `zlib` or `lz4` (KV values are float noise: compression rarely pays)."""
    kv_tier_namespace: str = "kvtier"
    """The Redis tier's key prefix, so several deployments (or test runs) share one Redis."""
    tensor_parallel_size: int = 1
    """Split the model over this many ranks (docs/tensor-parallel.md): heads and MLP width
    must divide by it; on a CPU more ranks only share the same cores."""
    speculative_mode: str = ""
    """Speculative decoding, lossless (docs/speculative.md): empty: off; `ngram`: prompt
    lookup every step; `auto`: prompt lookup only while a step stays small, paused for a
    sequence whose guesses do not pay, never for a seeded sampled request; `draft`: a
    smaller model with the same tokenizer."""
    batch_invariant: str = "seeded"
    """`seeded`: a request with a `seed` gives the same text whatever the cache holds and
    whatever else is in the batch, where the native 4-bit path runs (its rows on the
    one-row products, prompts too, and its KV blocks apart: about 2x a seeded prompt's
    prefill, and up to ~1.4x the steps it shares; docs/api.md); `off`: not (the same seed
    repeats only in the same cache state and batch)."""
    num_speculative_tokens: int = 4
    """Tokens guessed per sequence and step; one forward checks them all."""
    ngram_min: int = 1
    """Shortest n-gram prompt lookup matches."""
    ngram_max: int = 4
    """Longest n-gram prompt lookup matches (tried first)."""
    speculative_draft_model: str = ""
    """`draft`: the draft model's folder, sharing the model's tokenizer."""
    # A big batch is compute-bound already: verifying guesses stops paying.
    speculative_max_batch: int = 8
    """No speculation in a step with more decoding sequences than this."""
    speculative_min_acceptance: float = 0.3
    """A sequence whose acceptance over 16 checked guesses falls below this stops guessing
    for its next 32 tokens."""
    suffix_max_tokens: int = 16384
    """`ngram` and `auto` also guess from the same owner's (cache salt's) earlier prompts
    and replies (suffix decoding, docs/speculative.md): the tokens kept per owner (about
    150 bytes each); 0: off."""
    suffix_total_tokens: int = 262144
    """The suffix store's tokens over all owners; the least recently seen owners go first."""
