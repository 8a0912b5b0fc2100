"""Text decoded by the consumer (LLMEngine.defer_text) streams exactly as text decoded in
the step: the same deltas, the same chunks, the same ends."""

from __future__ import annotations

import asyncio

from inference.engine.async_engine import AsyncEngine
from inference.engine.config import EngineConfig
from inference.engine.outputs import Delta
from inference.engine.sampling_params import SamplingParams
from tests.engine.conftest import run_to_completion

# Greedy, stopped by length, a stop string, stop tokens, and a seeded sampled request.
REQUESTS = [
    ([1, 2, 3, 4], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)),
    ([5, 6, 7], SamplingParams(max_tokens=7, temperature=0)),
    ([9, 10, 11, 12, 13], SamplingParams(max_tokens=30, temperature=0, stop=["e"])),
    ([14, 15], SamplingParams(max_tokens=25, temperature=0, stop_token_ids=[300, 301])),
    ([16, 17, 18], SamplingParams(max_tokens=33, temperature=0.8, seed=5)),
]


def _streams(engine, defer: bool) -> dict[str, list[tuple[str, list[int], bool, str | None]]]:
    engine.defer_text = defer
    for i, (prompt, params) in enumerate(REQUESTS):
        engine.add_request(prompt, params, request_id=f"r{i}")
    out = run_to_completion(engine)
    return {rid: [_view(d.resolve_text()) for d in deltas] for rid, deltas in out.items()}


def _view(d: Delta) -> tuple[str, list[int], bool, str | None]:
    assert d.text_job is None
    return d.text, d.token_ids, d.finished, d.finish_reason


def test_deferred_text_streams_the_same_deltas_as_text_decoded_in_the_step(make_engine):
    inline = _streams(make_engine(), defer=False)
    deferred = _streams(make_engine(), defer=True)
    assert deferred == inline
    assert any(len(v) > 5 and "".join(t for t, *_ in v) for v in inline.values())


def test_deferred_text_is_decoded_only_when_taken(make_engine):
    engine = make_engine()
    engine.defer_text = True
    prompt, params = REQUESTS[0]
    engine.add_request(prompt, params, request_id="a")
    deltas = [d for _ in range(4) for d in engine.step()]
    assert all(d.text == "" and d.text_job is not None for d in deltas)
    assert "".join(d.resolve_text().text for d in deltas)


def test_speculative_deltas_keep_their_text_when_deferred(make_engine):
    """A checked sequence's tokens come merged into one delta; their texts merge too."""
    settings = {"speculative_mode": "ngram", "num_speculative_tokens": 3}
    inline = _streams(make_engine(**settings), defer=False)
    deferred = _streams(make_engine(**settings), defer=True)
    assert deferred == inline


def test_the_async_engine_yields_decoded_text(tiny_model_path, make_engine):
    expected = _streams(make_engine(), defer=False)
    config = EngineConfig(
        model=str(tiny_model_path), dtype="float32", quantization="none", kv_cache_memory_mb=8
    )
    engine = AsyncEngine(config)

    async def one(i: int) -> list[tuple[str, list[int], bool, str | None]]:
        prompt, params = REQUESTS[i]
        return [_view(d) async for d in engine.generate(prompt, params, request_id=f"r{i}")]

    async def every() -> list[list[tuple[str, list[int], bool, str | None]]]:
        return await asyncio.gather(*(one(i) for i in range(len(REQUESTS))))

    try:
        got = asyncio.run(every())
    finally:
        engine.shutdown()
    # Requests arrive one by one here, so batches differ from the synchronous run's; each
    # request's stream is the same all the same (greedy, or seeded).
    assert {f"r{i}": stream for i, stream in enumerate(got)} == expected
