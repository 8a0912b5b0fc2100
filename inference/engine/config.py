"""Engine settings: one dataclass, every field with a default that works on a laptop."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class EngineConfig:
    # A Hugging Face llama-family folder (config.json, tokenizer, safetensors).
    model: str = ""
    # "auto": bfloat16 where the device computes it natively (CUDA, CPUs with
    # avx512_bf16/AMX), else float32. Or "bfloat16", "float16", "float32".
    dtype: str = "auto"
    # "auto": cuda if available, else cpu.
    device: str = "auto"
    # Continuous batching limits per step.
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    # While any stream decodes, prefill chunks in one step add at most this many tokens,
    # so a long prompt arriving never stretches the running streams' inter-token gap much.
    # 0 means only max_num_batched_tokens applies.
    max_prefill_tokens_during_decode: int = 64
    # Context window; 0 means the model's max_position_embeddings.
    max_model_len: int = 0
    # Paged KV cache: tokens per block and the memory budget for the block pool.
    block_size: int = 16
    kv_cache_memory_mb: int = 512
    enable_prefix_caching: bool = True
    # Bounded waiting queue: past either limit a request is refused as busy.
    max_waiting_requests: int = 256
    max_waiting_tokens: int = 262144
    # Torch intra-op threads on CPU. 0 means one fewer than the cores (at least 1): the
    # web side (event loop, tokenizing, the database) keeps a core, and OpenMP threads
    # never spin against it — with every core in the pool, one busy neighbour made each
    # decode step ~10x slower on a 2-core machine.
    num_threads: int = 0

    def cpu_threads(self) -> int:
        if self.num_threads > 0:
            return self.num_threads
        return max(1, (os.cpu_count() or 1) - 1)

    seed: int = 0
    # How linear weights are stored on CPU (fbgemm kernels; compute stays float32):
    #   "none": in `dtype`, exact (what the tests compare with transformers);
    #   "fp16": float16 weights, float32 activations: half the memory traffic per decode
    #           step, greedy output the same as float32 on ordinary prompts;
    #   "int8": int8 weights with 7-bit dynamic activations: fastest, visibly less accurate;
    #   "auto": "fp16" when the model runs in float32 on a CPU, else "none".
    quantization: str = "auto"
