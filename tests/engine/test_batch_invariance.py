"""Seeded requests are batch-invariant on the default engine (4-bit blocks, the native
path): the same text when the prompt is computed cold, when its prefix comes from the
cache, and when other requests (decoding and prefilling) share its steps. Slow: the real
model."""

from __future__ import annotations

import pytest

from inference.bench.speculative import CHAT, GROUNDED, chat_prompt
from inference.engine import EngineConfig
from inference.engine.cache_scope import CacheScope
from inference.engine.engine import LLMEngine
from inference.engine.sampling_params import SamplingParams

from .conftest import run_to_completion, token_ids_of

pytestmark = pytest.mark.slow


def test_a_seeded_reply_is_the_same_cold_warm_and_in_a_busy_batch(real_model_path) -> None:
    """Where seeded rows are not batch-invariant, the first of these replies parts from its
    cold self at its third token when served warm."""
    engine = LLMEngine(EngineConfig(model=str(real_model_path), kv_cache_memory_mb=512))
    assert engine.runner.invariant_rows
    prompts = [chat_prompt(engine, t) for t in CHAT[:3] + GROUNDED[:1]]

    for prompt in prompts:
        engine.kv.reset_prefix_cache()
        engine.add_request(prompt, SamplingParams(max_tokens=48, seed=7), request_id="s")
        cold = token_ids_of(run_to_completion(engine)["s"])
        engine.add_request(prompt, SamplingParams(max_tokens=48, seed=7), request_id="s")
        out = run_to_completion(engine)["s"]
        assert out[-1].figures is not None and out[-1].figures.cached_tokens > 0  # warm
        assert token_ids_of(out) == cold
        # Busy: twelve sampled replies decoding around it, four prompts prefilled beside it.
        for j, other in enumerate(prompts * 3):
            engine.add_request(other, SamplingParams(max_tokens=40), request_id=f"o{j}")
        engine.add_request(prompt, SamplingParams(max_tokens=48, seed=7), request_id="s")
        for j, other in enumerate(prompts):
            engine.add_request([*other[:-2], 13], SamplingParams(max_tokens=8), f"p{j}")
        assert token_ids_of(run_to_completion(engine)["s"]) == cold


def test_invariant_blocks_are_a_chain_of_their_own() -> None:
    """A batch-invariant request's blocks hold other bits than the same tokens computed in a
    batch: neither finds the other's, in memory (hashes) or in the Redis tier (digests);
    an owner's salt still applies on top."""
    tokens = list(range(64))
    plain, invariant = CacheScope(), CacheScope(invariant=True)
    salted = CacheScope("alice", invariant=True)
    chains = [s.digest_chain(tokens, 16, 4) for s in (plain, invariant, salted)]
    assert len({c[0][1] for c in chains}) == 3
    assert plain.link_hash(0, None) != invariant.link_hash(0, None)
    assert invariant.link_hash(1, 5) == plain.link_hash(1, 5) == 5


def test_batch_invariant_off_or_unknown(real_model_path) -> None:
    engine = LLMEngine(
        EngineConfig(model=str(real_model_path), kv_cache_memory_mb=64, batch_invariant="off")
    )
    assert not engine.runner.invariant_rows
    with pytest.raises(ValueError, match="batch_invariant must be one of seeded, off; got 'x'"):
        LLMEngine(
            EngineConfig(model=str(real_model_path), kv_cache_memory_mb=64, batch_invariant="x")
        )


def test_seeded_rows_beside_speculation(real_model_path) -> None:
    """A seeded request beside a greedy one that guesses (`auto`): the steps they share run
    as one invariant forward, the guesses' rows checked there; each keeps its own text (the
    greedy one its plain decoding's). With `ngram` the seeded one guesses too, its guesses
    checked in its invariant forward."""
    greedy_prompt, seeded_prompt = GROUNDED[0], CHAT[0]

    def run(mode: str, both: bool) -> dict[str, list[int]]:
        engine = LLMEngine(
            EngineConfig(model=str(real_model_path), kv_cache_memory_mb=256, speculative_mode=mode)
        )
        engine.add_request(
            chat_prompt(engine, greedy_prompt), SamplingParams(max_tokens=48, temperature=0), "g"
        )
        if both:
            seeded = SamplingParams(max_tokens=32, seed=3)
            engine.add_request(chat_prompt(engine, seeded_prompt), seeded, "s")
        return {k: token_ids_of(v) for k, v in run_to_completion(engine).items()}

    alone = run("", False)
    together = run("auto", True)
    assert together["g"] == alone["g"]
    ngram = run("ngram", True)
    assert len(ngram["s"]) == 32 and ngram["g"] == alone["g"]
