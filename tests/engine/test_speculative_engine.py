"""Speculative decoding inside the engine: lossless, batched, counted."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from inference.engine.engine import LLMEngine
from inference.engine.sampling_params import SamplingParams
from tests.engine.conftest import greedy, run_to_completion, token_ids_of

# Prompts whose continuations repeat what they quote, so prompt lookup gets hits.
PROMPTS = [
    [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3],
    [100, 200, 300, 100, 200, 300, 100, 200],
    [4000 + (i * 7) % 50 for i in range(120)],
    [17, 9000, 17, 9000, 17],
]


def _generate(engine: LLMEngine, prompts: list[list[int]], sampling: list[SamplingParams]):
    for i, (p, s) in enumerate(zip(prompts, sampling, strict=True)):
        engine.add_request(p, s, request_id=f"r{i}")
    out = run_to_completion(engine)
    return [token_ids_of(out[f"r{i}"]) for i in range(len(prompts))], out


def test_greedy_ngram_output_is_token_for_token_the_plain_output(
    make_engine: Callable[..., LLMEngine],
) -> None:
    sampling = [greedy(40, ignore_eos=True) for _ in PROMPTS]
    plain, _ = _generate(make_engine(), PROMPTS, sampling)
    spec_engine = make_engine(speculative_mode="ngram", num_speculative_tokens=4)
    spec, _ = _generate(spec_engine, PROMPTS, sampling)
    assert spec == plain
    # A random-weight model never quotes its prompt: every guess is checked and rejected.
    assert spec_engine.stats()["spec_drafted_tokens"] > 0


def _replace_proposer(engine: LLMEngine, propose: Callable[..., list[int]]) -> None:
    """Make the prompt-lookup proposer guess with `propose(token_ids, limit)`."""

    def match(token_ids: list[int], limit: int | None = None) -> tuple[list[int], int]:
        return propose(token_ids, limit), 1

    engine.speculator.ngram.match = match  # type: ignore[union-attr,method-assign]


def _oracle(engine: LLMEngine, prompts: list[list[int]], plain: list[list[int]], wrong_every: int):
    """Replace the proposer with one that guesses the plain output, every
    `wrong_every`-th guess wrong: the engine must keep the right ones and roll back."""

    def propose(token_ids: list[int], limit: int | None = None) -> list[int]:
        for prompt, out in zip(prompts, plain, strict=True):
            n = len(prompt)
            if token_ids[:n] == prompt and token_ids[n:] == out[: len(token_ids) - n]:
                guess = out[len(token_ids) - n :][: limit or 4]
                return [
                    t if (len(token_ids) + i) % wrong_every else (t + 1) % 49152
                    for i, t in enumerate(guess)
                ]
        return []

    _replace_proposer(engine, propose)


@pytest.mark.parametrize("wrong_every", [3, 7, 1000])
def test_kept_and_rejected_guesses_leave_greedy_output_unchanged(
    make_engine: Callable[..., LLMEngine], wrong_every: int
) -> None:
    sampling = [greedy(37, ignore_eos=True) for _ in PROMPTS]
    plain, _ = _generate(make_engine(), PROMPTS, sampling)
    engine = make_engine(speculative_mode="ngram", num_speculative_tokens=5)
    _oracle(engine, PROMPTS, plain, wrong_every)
    spec, out = _generate(engine, PROMPTS, sampling)
    assert spec == plain
    stats = engine.stats()
    assert 0 < stats["spec_accepted_tokens"] <= stats["spec_drafted_tokens"]
    if wrong_every == 1000:  # nearly every guess right: ~5 tokens per forward
        assert stats["spec_acceptance_rate"] > 0.9
    m = out["r0"][-1].figures
    assert m.drafted_tokens > 0 and m.accepted_tokens > 0
    assert m.output_tokens == 37 == len(m.token_times)
    # The prefix index only ever holds computed, right tokens: a second run hits it.
    again, _ = _generate(engine, PROMPTS[:1], sampling[:1])
    assert again[0] == plain[0]


def test_a_stop_token_among_kept_guesses_ends_the_request_there(
    make_engine: Callable[..., LLMEngine],
) -> None:
    plain, _ = _generate(make_engine(), PROMPTS[:1], [greedy(30, ignore_eos=True)])
    stop = plain[0][12]
    cut = plain[0][: plain[0].index(stop) + 1]
    engine = make_engine(speculative_mode="ngram", num_speculative_tokens=4)
    _oracle(engine, PROMPTS[:1], plain[:1], wrong_every=1000)
    sampling = greedy(30, ignore_eos=True, stop_token_ids=[stop])
    spec, out = _generate(engine, PROMPTS[:1], [sampling])
    assert spec[0] == cut
    assert out["r0"][-1].finish_reason == "stop"
    # max_tokens cuts a run of kept guesses too.
    engine = make_engine(speculative_mode="ngram", num_speculative_tokens=4)
    _oracle(engine, PROMPTS[:1], plain[:1], wrong_every=1000)
    spec, out = _generate(engine, PROMPTS[:1], [greedy(11, ignore_eos=True)])
    assert spec[0] == plain[0][:11]
    assert out["r0"][-1].finish_reason == "length"
    assert engine.kv.num_used_blocks == 0


def test_draft_mode_with_the_model_as_its_own_draft_keeps_nearly_every_guess(
    make_engine: Callable[..., LLMEngine], tiny_model_path
) -> None:
    sampling = [greedy(33, ignore_eos=True) for _ in PROMPTS]
    plain, _ = _generate(make_engine(), PROMPTS, sampling)
    engine = make_engine(
        speculative_mode="draft",
        speculative_draft_model=str(tiny_model_path),
        num_speculative_tokens=4,
    )
    spec, _ = _generate(engine, PROMPTS, sampling)
    assert spec == plain
    stats = engine.stats()
    assert stats["spec_acceptance_rate"] > 0.95
    assert stats["spec_mean_accepted_length"] > 3.0
    assert not engine.speculator.draft.shadows  # type: ignore[union-attr]
    assert engine.speculator.draft.kv.num_used_blocks == 0  # type: ignore[union-attr]


TOP_K = 3
TEMPERATURE = 2.0


def _filtered_probs(hf_model, ids: list[int]) -> torch.Tensor:
    from inference.engine.sampler import filter_logits

    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0, -1].float()
    s = SamplingParams(temperature=TEMPERATURE, top_k=TOP_K)
    return torch.softmax(filter_logits(logits, s), dim=-1)


def _exact_joint(hf_model, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """P(t1, t2, t3) of plain sampling, from transformers' logits."""
    joint: dict[tuple[int, ...], float] = {}
    p1 = _filtered_probs(hf_model, prompt)
    for t1 in torch.nonzero(p1).flatten().tolist():
        p2 = _filtered_probs(hf_model, [*prompt, t1])
        for t2 in torch.nonzero(p2).flatten().tolist():
            p3 = _filtered_probs(hf_model, [*prompt, t1, t2])
            for t3 in torch.nonzero(p3).flatten().tolist():
                joint[(t1, t2, t3)] = float(p1[t1] * p2[t2] * p3[t3])
    return joint


def _chi_square(counts: dict[tuple[int, ...], int], joint: dict[tuple[int, ...], float]) -> float:
    n = sum(counts.values())
    assert set(counts) <= set(joint), "a sequence plain sampling can never produce"
    stat, pooled_obs, pooled_exp = 0.0, 0, 0.0
    for cell, p in joint.items():
        if n * p < 5:  # pool the rare cells
            pooled_obs += counts.get(cell, 0)
            pooled_exp += n * p
            continue
        stat += (counts.get(cell, 0) - n * p) ** 2 / (n * p)
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
    return stat


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_sampled_output_keeps_the_plain_distribution(
    make_engine: Callable[..., LLMEngine], tiny_model_path, hf_tiny, mode: str
) -> None:
    """600 seeded requests (so the test is deterministic) sample 4 tokens each: the first
    plainly, then two guesses are checked and a last token drawn. The first three tokens'
    joint law must be plain sampling's: a chi-square goodness-of-fit test against
    transformers' probabilities (27 cells at most; the bar is past the 0.001 critical
    value of ~54 for 26 degrees of freedom, and the test is deterministic)."""
    prompt = PROMPTS[0]
    joint = _exact_joint(hf_tiny, prompt)
    engine = make_engine(
        speculative_mode=mode,
        speculative_draft_model=str(tiny_model_path) if mode == "draft" else "",
        num_speculative_tokens=2,
        speculative_max_batch=64,
        speculative_min_acceptance=0.0,
    )
    if mode == "ngram":
        # A fixed guess per history: the second most likely next tokens (often rejected).
        def propose(token_ids: list[int], limit: int | None = None) -> list[int]:
            guess = []
            ids = list(token_ids)
            for _ in range(min(2, limit or 2)):
                p = _filtered_probs(hf_tiny, ids)
                guess.append(int(torch.topk(p, 2).indices[1]))
                ids.append(guess[-1])
            return guess

        cache: dict[tuple[int, ...], list[int]] = {}

        def cached(token_ids: list[int], limit: int | None = None) -> list[int]:
            key = (*token_ids, limit or 0)
            if key not in cache:
                cache[key] = propose(token_ids, limit)
            return cache[key]

        _replace_proposer(engine, cached)
    n = 600
    counts: dict[tuple[int, ...], int] = {}
    for start in range(0, n, 200):
        for i in range(start, start + 200):
            s = SamplingParams(
                max_tokens=4, temperature=TEMPERATURE, top_k=TOP_K, seed=i, ignore_eos=True
            )
            engine.add_request(prompt, s, request_id=f"s{i}")
        for deltas in run_to_completion(engine).values():
            cell = tuple(token_ids_of(deltas)[:3])
            counts[cell] = counts.get(cell, 0) + 1
    stats = engine.stats()
    assert stats["spec_drafted_tokens"] >= 2 * n  # every request checked two guesses
    if mode == "ngram":
        assert 0.05 < stats["spec_acceptance_rate"] < 0.95  # both branches of the rule
    chi = _chi_square(counts, joint)
    assert chi < 60.0


def test_auto_leaves_seeded_sampled_requests_to_plain_sampling(
    make_engine: Callable[..., LLMEngine],
) -> None:
    """The same seed gives the same text (docs/api.md): with `auto`, the server's default,
    a seeded sampled request never guesses, so its text is plain sampling's whatever the
    step times and the batch; greedy and unseeded requests beside it still guess."""
    seeded = [
        SamplingParams(max_tokens=30, temperature=0.8, top_p=0.9, seed=7 + i, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]
    plain, _ = _generate(make_engine(), PROMPTS, seeded)
    auto = make_engine(speculative_mode="auto", num_speculative_tokens=4)

    # A proposer with a guess for every history (the random model rarely repeats itself).
    def always(token_ids: list[int], limit: int | None = None) -> list[int]:
        return [token_ids[-1]] * (limit or 4)

    _replace_proposer(auto, always)
    again, _ = _generate(auto, PROMPTS, seeded)
    assert again == plain
    assert auto.stats()["spec_drafted_tokens"] == 0
    mixed = [greedy(30, ignore_eos=True), SamplingParams(max_tokens=30, ignore_eos=True)]
    _generate(auto, PROMPTS[:2], mixed)
    assert auto.stats()["spec_drafted_tokens"] > 0
