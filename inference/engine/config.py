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
    # While any stream decodes, prefill chunks in one step add at most this many tokens
    # (or 4 per decoding stream, if more), so a long prompt arriving never stretches the
    # running streams' inter-token gap much. 0 means only max_num_batched_tokens applies.
    # 256, not the 64 of before: a step with a prompt's chunk pays the torch path's fixed
    # cost (~55 ms on one thread, a Xeon with AMX) whatever the chunk, so fewer, larger
    # chunks gave 16 users 1.13x the tok/s and 0.68-0.80x the TTFT p90, 64 users 1.1-1.2x
    # and 0.5x (docs/performance.md, the Xeon section). 384 since prompts' products run on
    # AMX's tiles there and the KV pool holds 64 users: against 256, TTFT p90 0.79x at 64
    # users and 0.92x at 16, the median 0.98x and 1.01x; 512 took p90 as far (0.59-0.78x)
    # but made the median 1.11-1.17x longer (the fifth session's Xeon section).
    max_prefill_tokens_during_decode: int = 384
    # Context window; 0 means the model's max_position_embeddings.
    max_model_len: int = 0
    # Paged KV cache: tokens per block and the memory budget for the block pool, in MB;
    # 0: by the machine (model_runner.kv_pool_mb: 2 GB, or an eighth of its memory).
    block_size: int = 16
    kv_cache_memory_mb: int = 0
    # The KV pool's element type. "auto": float16 where a float32 model with quantized
    # weights (hybrid, int4, int8, fp16) runs on a CPU whose native kernels build (attention
    # reads half the bytes over chats' scattered blocks, and the same memory holds twice the
    # tokens; docs/performance.md, "The KV pool"), else the model dtype (quantization "none"
    # stays exact). Or "float32", "float16", "bfloat16" (this one with a bfloat16 model
    # only on a CPU: the kernels read float32 or float16 pools).
    kv_dtype: str = "auto"
    enable_prefix_caching: bool = True
    # Bounded waiting queue: past either limit a request is refused as busy.
    max_waiting_requests: int = 256
    max_waiting_tokens: int = 262144
    # Torch intra-op threads on CPU. 0 means one fewer than the cores (at least 1): the
    # web side (event loop, tokenizing, the database) keeps a core, and OpenMP threads
    # never spin against it — with every core in the pool, one busy neighbour made each
    # decode step ~10x slower on a 2-core machine.
    num_threads: int = 0

    # Threads for steps of a few rows (those the 4-bit native path takes, when it is on)
    # and for torch-path steps of one or two streams (a prompt's chunk while nobody else
    # is served: model_runner.FEW_STREAMS): such steps come from few streams, whose web
    # side is light. The native steps run in the kernels'
    # own pool, whose workers sleep between steps, so they may take every core: 0 means
    # all of them (measured on 2 cores: one user's time per token 0.72x of one thread's
    # against llama-server; 16 and 64 users level, docs/performance.md).
    small_step_threads: int = 0

    def cpu_threads(self) -> int:
        if self.num_threads > 0:
            return self.num_threads
        return max(1, (os.cpu_count() or 1) - 1)

    def small_step_cpu_threads(self) -> int:
        if self.small_step_threads > 0:
            return self.small_step_threads
        return max(1, os.cpu_count() or 1)

    # With 4-bit weights ("hybrid", "int4"): steps of at most this many rows take the
    # 4-bit blocks and the native path, larger ones the float format. 0: the crossover
    # measured for this CPU's float format (model.default_native_max_rows).
    native_max_rows: int = 0
    # With the native path on: "on" runs a step that mixes prompts' chunks with decodes
    # (at least model_runner.SPLIT_MIN_ROWS rows of them) as two forwards, the decodes on
    # the native path (4-bit blocks, every core), the chunks on the float path, instead of
    # every row on the float path; "off" never; "auto": on, except on CPUs with AMX, whose
    # bf16 products take extra rows beside a chunk for less than the native path
    # (docs/performance.md, "Mixed steps").
    split_mixed_steps: str = "auto"

    seed: int = 0
    # The torch path's steps (those of more rows than the native small-step path takes) as
    # one compiled graph (compiled_step.py; docs/performance.md, "The compiled step"):
    # "on", "off", or "auto": on where it measured faster, see compiled_step.compile_wins.
    compile: str = "auto"
    # How linear weights are stored on CPU (fbgemm kernels; compute stays float32):
    #   "none": in `dtype`, exact (what the tests compare with transformers);
    #   "fp16": float16 weights, float32 activations: half the memory traffic per decode
    #           step, greedy output the same as float32 on ordinary prompts;
    #   "int8": int8 weights with 7-bit dynamic activations: fastest, visibly less accurate;
    #   "auto": on a CPU, "hybrid" where the 4-bit kernels build, else "fp16" for a float32
    #           model; "none" on a GPU, and "none" whenever `dtype` is set explicitly (not
    #           "auto"): an explicit dtype is the dtype the weights are held in.
    quantization: str = "auto"
    # The Redis tier of the KV cache (kv_tier/): full prefix blocks written back when a
    # request finishes and restored on a memory miss, across restarts and workers.
    # "" turns it off; a URL nobody answers runs memory-only and keeps retrying.
    kv_tier_url: str = ""
    kv_tier_ttl_s: int = 86400
    # Cap on the tier's stored bytes; the least recently used blocks go first.
    kv_tier_max_mb: int = 2048
    # "none", "zlib" or "lz4" (KV values are float noise: compression rarely pays).
    kv_tier_compression: str = "none"
    # Key prefix, so several deployments (or tests) can share one Redis database.
    kv_tier_namespace: str = "kvtier"
    # Split the model across this many ranks (tensor_parallel.py): heads and MLP width must
    # divide by it. 1 = one process; on CPU more ranks only share the same cores.
    tensor_parallel_size: int = 1
    # Speculative decoding (speculative.py, docs/speculative.md): "" off; "ngram" proposes
    # the continuation of the latest earlier match of the last n tokens (prompt lookup:
    # pays on edits, rewrites, code, quoting); "draft" asks a smaller model with the same
    # tokenizer. Lossless either way: greedy output is token-for-token the same, sampled
    # output keeps its distribution (rejection sampling).
    speculative_mode: str = ""
    # Tokens proposed per sequence and step; one forward checks them all.
    num_speculative_tokens: int = 4
    # n-gram sizes the "ngram" proposer tries, longest first.
    ngram_min: int = 1
    ngram_max: int = 4
    # "draft": a Hugging Face llama folder sharing the model's tokenizer.
    speculative_draft_model: str = ""
    # No speculation in a step with more decoding sequences than this: a big batch is
    # compute-bound already and verifying guesses stops paying.
    speculative_max_batch: int = 8
    # Per sequence: once it has 16 guesses checked at an acceptance rate below this, it
    # stops speculating for its next 32 tokens, then tries again.
    speculative_min_acceptance: float = 0.3
