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
from inference.engine.engine import LLMEngine
from inference.engine.model_runner import (
    KV_POOL_AUTO_MB,
    kv_pool_mb,
    resolve_quantization,
)

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


def test_the_kv_pool_is_sized_by_the_machine_unless_set(monkeypatch):
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert kv_pool_mb(0, CPU) == max(64, min(KV_POOL_AUTO_MB, memory // 8 // 2**20))
    assert kv_pool_mb(300, CPU) == 300
    with pytest.raises(ValueError, match=r"must be 0 \(by the machine\) or more; got -1"):
        kv_pool_mb(-1, CPU)
    # a small machine: an eighth of its memory
    monkeypatch.setattr(os, "sysconf", lambda name: 4096 if name == "SC_PAGE_SIZE" else 2**18)
    assert kv_pool_mb(0, CPU) == 128
