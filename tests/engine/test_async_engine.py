"""The asyncio front: streaming, early exit aborts, busy refusals, figures."""

from __future__ import annotations

import asyncio

import pytest
import torch

from inference.engine import AsyncEngine, EngineBusyError, EngineConfig, SamplingParams


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


@pytest.fixture
def engine(tiny_model_path):
    eng = AsyncEngine(
        EngineConfig(
            model=str(tiny_model_path), dtype="float32", quantization="none", kv_cache_memory_mb=8
        )
    )
    yield eng
    eng.shutdown()


async def _collect(engine, prompt, sampling, **kw):
    return [d async for d in engine.generate(prompt, sampling, **kw)]


async def test_concurrent_streams_each_end_with_figures(engine):
    sampling = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    results = await asyncio.gather(
        *[_collect(engine, _prompt(9 + i, i), sampling) for i in range(5)]
    )
    for deltas in results:
        assert [d.finished for d in deltas] == [False] * 11 + [True]
        final = deltas[-1]
        assert final.finish_reason == "length"
        m = final.figures
        assert m.output_tokens == 12 and len(m.token_times) == 12
        assert m.arrival_time <= m.scheduled_time <= m.first_token_time <= m.finish_time
    assert engine.tokenizer is not None and engine.eos_token_ids == [2]
    stats = engine.stats()
    assert stats["total_output_tokens"] == 60 and stats["running"] == 0


async def test_leaving_the_stream_early_aborts_and_frees_blocks(engine):
    sampling = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    stream = engine.generate(_prompt(40, 1), sampling, request_id="early")
    async for _ in stream:
        break
    await stream.aclose()
    for _ in range(100):
        if engine.stats()["running"] == 0:
            break
        await asyncio.sleep(0.02)
    stats = engine.stats()
    assert stats["running"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]


async def test_abort_ends_the_stream_with_abort(engine):
    sampling = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    deltas = []
    async for d in engine.generate(_prompt(20, 2), sampling, request_id="x"):
        deltas.append(d)
        if len(deltas) == 3:
            engine.abort("x")
    assert deltas[-1].finished and deltas[-1].finish_reason == "abort"
    assert len(deltas) < 500


async def test_busy_is_raised_before_any_delta(tiny_model_path):
    eng = AsyncEngine(
        EngineConfig(
            model=str(tiny_model_path),
            dtype="float32",
            max_waiting_requests=0,
            kv_cache_memory_mb=8,
        )
    )
    try:
        with pytest.raises(EngineBusyError):
            await _collect(eng, [1, 2, 3], SamplingParams(max_tokens=2))
    finally:
        eng.shutdown()


def test_startup_is_frozen_for_the_collector_and_a_shut_engine_can_be_collected(
    tiny_model_path,
):
    """A running engine's objects sit in the collector's permanent generation (a full pass
    walks none of them mid-step); once shut down and dropped, the engine and its model are
    collected like any other garbage, reference cycles included (a model switch)."""
    import gc
    import weakref

    eng = AsyncEngine(
        EngineConfig(model=str(tiny_model_path), dtype="float32", kv_cache_memory_mb=8)
    )
    model = weakref.ref(eng.engine.runner.model)
    assert gc.get_freeze_count() > 0
    eng.shutdown()
    assert gc.get_freeze_count() == 0
    cycle: list[object] = [eng]
    cycle.append(cycle)  # only a full collection frees it
    del eng, cycle
    gc.collect()
    assert model() is None
