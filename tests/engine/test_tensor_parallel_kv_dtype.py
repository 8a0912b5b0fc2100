"""Tensor parallelism over a float16 KV pool: the other ranks make their pool shards in the
type rank 0's pool has. A module of its own: one tensor-parallel model per process, and
test_tensor_parallel.py's module-wide pair stays up for all of that module's tests."""

from __future__ import annotations

from pathlib import Path

import torch

from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from tests.engine.test_tensor_parallel import SETTINGS, _logits_at_every_position


def test_two_ranks_over_float16_pools_follow_one(tiny_model_path: Path):
    """The logits agree to float16's rounding of K/V (values a few float32 ulps apart can
    round to neighbouring float16s), not to float32's."""
    engines = [
        LLMEngine(
            EngineConfig(model=str(tiny_model_path), dtype="float32", quantization="none",
                         kv_cache_memory_mb=8, kv_dtype="float16", tensor_parallel_size=size,
                         **SETTINGS)  # type: ignore[arg-type]
        )
        for size in (1, 2)
    ]  # fmt: skip
    try:
        assert all(e.runner.kv_caches[0].dtype == torch.float16 for e in engines)
        one, two = (_logits_at_every_position(e) for e in engines)
        torch.testing.assert_close(two, one, atol=2e-3, rtol=2e-3)
    finally:
        engines[1].runner.model.close()
