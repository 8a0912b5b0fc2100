"""The engine says at startup, in one line, what it resolved: device, dtype, how the weights
are held and why, threads, the KV pool and the tier (without its password). `auto`
quantization never overrides an explicitly set dtype."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pytest
import torch

from inference.client import engine_config_from_settings
from inference.engine import kernels
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.kv_budget import (
    KV_MEMORY_SHARE,
    MIN_POOL_BYTES,
    _cgroup_room,
    auto_pool_bytes,
    available_memory,
)
from inference.engine.model_runner import kv_pool_bytes, resolve_quantization

CPU = torch.device("cpu")


def test_auto_keeps_an_explicit_dtype_s_weights_and_the_default_keeps_the_fast_choice():
    for dtype in (torch.float32, torch.bfloat16):
        assert resolve_quantization("auto", CPU, dtype, True, dtype_explicit=True) == "none"
    # ENGINE_DTYPE unset: today's fastest choice, unchanged.
    fastest = "hybrid" if kernels.load() is not None else "fp16"
    assert resolve_quantization("auto", CPU, torch.float32, True) == fastest
    # An explicit quantization is honoured whatever the dtype.
    assert resolve_quantization("fp16", CPU, torch.float32, True, dtype_explicit=True) == "fp16"
    assert resolve_quantization("auto", torch.device("cuda"), torch.bfloat16, True) == "none"


def start(tiny_model_path: Path, caplog: pytest.LogCaptureFixture, **settings: object) -> tuple:
    """An engine built the way the app builds one (settings → EngineConfig), and the
    startup lines it logged."""
    overrides = {
        "MODEL": str(tiny_model_path),
        "KV_CACHE_MEMORY_MB": 8,
        "NUM_THREADS": 1,
        "KV_TIER_URL": "",
        **settings,
    }
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="inference.engine"):
        engine = LLMEngine(engine_config_from_settings(overrides))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine config:")]
    return engine, lines


def test_one_line_names_the_resolved_configuration_without_the_tier_password(
    tiny_model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A port nobody answers: the tier starts degraded and keeps retrying; serving is memory-only.
    url = "redis://:s3cret-pass@127.0.0.1:1/4"
    engine, lines = start(
        tiny_model_path,
        caplog,
        DTYPE="float32",
        QUANTIZATION="auto",
        KV_TIER_URL=url,
        KV_TIER_NAMESPACE=f"test-kvtier-{uuid.uuid4().hex[:8]}",
    )
    try:
        assert len(lines) == 1, lines
        line = lines[0]
        assert engine.runner.quantization == "none"
        assert "device=cpu" in line and "dtype=float32 (set)" in line
        assert "quantization=none (auto: kept in float32 as the dtype was set explicitly" in line
        assert "threads=1" in line
        pool = f"kv_pool={engine.runner.num_blocks} blocks x 16 tokens (8 MB, float32 auto)"
        assert pool in line
        assert "kv_tier=redis://:***@127.0.0.1:1/4" in line
        assert "s3cret" not in caplog.text
    finally:
        engine.close(flush_timeout=0)


def test_the_default_dtype_keeps_the_fastest_weights_and_says_auto(
    tiny_model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine, lines = start(tiny_model_path, caplog, DTYPE="auto", QUANTIZATION="auto")
    try:
        assert len(lines) == 1, lines
        q = engine.runner.quantization
        dtype = engine.runner.dtype
        fits = resolve_quantization("auto", CPU, dtype, True)
        assert q in {fits, resolve_quantization("auto", CPU, dtype, False)}
        assert f"quantization={q} (auto" in lines[0]
        assert "(set)" not in lines[0] and "kv_tier=off" in lines[0]
    finally:
        engine.close(flush_timeout=0)


def test_an_unsized_kv_pool_holds_every_sequence_at_full_context_within_a_share_of_memory():
    gib = 2**30
    # A small model: every sequence's whole context fits, and the pool is just that.
    assert auto_pool_bytes(23_040, 64 * 2048, 20 * gib) == 23_040 * 64 * 2048
    # A large one: the share of what is available, whatever the contexts would want.
    assert auto_pool_bytes(131_072, 64 * 131_072, 20 * gib) == int(KV_MEMORY_SHARE * 20 * gib)
    assert auto_pool_bytes(10, 1, 0) == MIN_POOL_BYTES
    # 64 chats' third turns (~3,000 tokens each) of the bundled model (float16 KV, 23 KB a
    # token) fit on a 24 GiB machine with ~20 GiB available: no preemption at 64 chats.
    assert auto_pool_bytes(23_040, 64 * 8192, 20 * gib) >= 23_040 * 64 * 3000
    # What is available: never more than the machine's memory.
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < available_memory(CPU) <= total


def test_a_containers_memory_limit_bounds_the_pool(tmp_path: Path):
    (tmp_path / "memory.max").write_text("4294967296\n")
    (tmp_path / "memory.current").write_text(str(3 * 2**30))
    assert _cgroup_room(tmp_path) == 2**30
    (tmp_path / "memory.max").write_text("max\n")
    assert _cgroup_room(tmp_path) is None
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(2**31))
    (v1 / "memory.usage_in_bytes").write_text(str(2**30))
    assert _cgroup_room(tmp_path / "v1") == 2**30
    assert _cgroup_room(tmp_path / "none") is None


def test_a_set_kv_pool_size_is_taken_as_it_is():
    assert kv_pool_bytes(EngineConfig(kv_cache_memory_mb=300), 1000, 10**9, CPU) == 300 * 2**20
    with pytest.raises(ValueError, match=r"must be 0 \(by the machine\) or more; got -1"):
        kv_pool_bytes(EngineConfig(kv_cache_memory_mb=-1), 1000, 1, CPU)
    unsized = kv_pool_bytes(EngineConfig(), 1000, 10**4, CPU)
    assert unsized == max(MIN_POOL_BYTES, min(10**7, int(KV_MEMORY_SHARE * available_memory(CPU))))
