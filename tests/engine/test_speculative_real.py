"""Speculative decoding on the default model: greedy output unchanged, guesses kept. Slow."""

from __future__ import annotations

import pytest

from inference.bench.speculative import CHAT, GROUNDED, chat_prompt
from inference.engine import EngineConfig
from inference.engine.engine import LLMEngine

from .conftest import greedy, run_to_completion, token_ids_of

pytestmark = pytest.mark.slow


def _run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    for i, p in enumerate(prompts):
        engine.add_request(p, greedy(max_tokens), request_id=f"r{i}")
    out = run_to_completion(engine)
    return [token_ids_of(out[f"r{i}"]) for i in range(len(prompts))]


@pytest.fixture(scope="module")
def engines(real_model_path):
    def make(**kw: object) -> LLMEngine:
        return LLMEngine(
            EngineConfig(
                model=str(real_model_path),
                dtype="float32",
                quantization="none",
                kv_cache_memory_mb=512,
                **kw,
            )  # type: ignore[arg-type]
        )

    return make


def test_ngram_on_the_default_model_is_lossless_and_pays_on_quoting_tasks(engines) -> None:
    plain_engine = engines()
    spec_engine = engines(speculative_mode="ngram")
    prompts = [chat_prompt(plain_engine, t) for t in GROUNDED[:2] + CHAT[:2]]
    plain = _run(plain_engine, prompts, 64)
    # Alone (one stream at a time: a quoting task and a chat one, each kind once) and as
    # one batch of all four.
    alone = [_run(spec_engine, [p], 64)[0] for p in prompts[::2]]
    together = _run(spec_engine, prompts, 64)
    assert alone == plain[::2]
    assert together == plain
    stats = spec_engine.stats()
    assert stats["spec_acceptance_rate"] > 0.3
    assert stats["spec_mean_accepted_length"] > 1.0


def test_the_default_model_as_its_own_draft_keeps_its_guesses(engines, real_model_path) -> None:
    plain_engine = engines()
    prompts = [chat_prompt(plain_engine, t) for t in CHAT[:3]]
    plain = _run(plain_engine, prompts, 32)
    spec_engine = engines(speculative_mode="draft", speculative_draft_model=str(real_model_path))
    assert _run(spec_engine, prompts, 32) == plain
    assert spec_engine.stats()["spec_acceptance_rate"] > 0.9


def test_auto_on_the_default_native_path_keeps_plain_decodings_text(real_model_path) -> None:
    """The default engine (4-bit blocks, the native path) with speculation `auto` against
    off, one stream at a time, greedy: the same tokens. The steps that check guesses give
    each row the bits a step without them gives (their products picked for the rows without
    the guesses, their attention row by row); otherwise three of these eight replies part
    from plain decoding's at a near-tie."""

    def make(mode: str) -> LLMEngine:
        return LLMEngine(
            EngineConfig(model=str(real_model_path), kv_cache_memory_mb=512, speculative_mode=mode)
        )

    plain_engine, spec_engine = make(""), make("auto")
    assert spec_engine.runner.model.native is not None
    prompts = [chat_prompt(plain_engine, t) for t in GROUNDED + CHAT[:4]]
    for p in prompts:
        assert _run(spec_engine, [p], 96) == _run(plain_engine, [p], 96)
    assert spec_engine.stats()["spec_accepted_tokens"] > 100
