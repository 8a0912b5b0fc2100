"""Speculative decoding's proposer and verification rules, without a model."""

from __future__ import annotations

import torch

from inference.engine.speculative import NgramProposer, verify_greedy, verify_sampled


def test_ngram_proposes_what_followed_the_latest_match() -> None:
    p = NgramProposer(num_tokens=3, min_n=1, max_n=3)
    # "1 2 3 4 5 ... 1 2 3" -> the earlier "1 2 3" was followed by 4 5 9.
    assert p.propose([1, 2, 3, 4, 5, 9, 7, 1, 2, 3]) == [4, 5, 9]
    # The most recent occurrence wins.
    assert p.propose([1, 2, 8, 1, 2, 6, 1, 2]) == [6, 1, 2]


def test_ngram_prefers_longer_matches_and_respects_limits() -> None:
    p = NgramProposer(num_tokens=4, min_n=1, max_n=2)
    # Last 2 tokens (5, 6) occur once, followed by 7; the 1-gram 6 alone is more recent.
    assert p.propose([5, 6, 7, 8, 6, 0, 5, 6])[:1] == [7]
    assert p.propose([5, 6, 7, 8, 6, 0, 5, 6], limit=1) == [7]
    assert p.propose([1, 2, 3]) == []  # no earlier occurrence
    assert p.propose([4]) == []
    assert NgramProposer(num_tokens=2, min_n=2, max_n=2).propose([1, 2, 3, 1, 2]) == [3, 1]


def test_greedy_verification_keeps_matching_guesses_then_the_models_token() -> None:
    assert verify_greedy([4, 5, 6, 7], [4, 5, 6]) == [4, 5, 6, 7]  # all accepted + bonus
    assert verify_greedy([4, 9, 6, 7], [4, 5, 6]) == [4, 9]  # second guess replaced
    assert verify_greedy([8, 5, 6, 7], [4, 5, 6]) == [8]
    assert verify_greedy([3], []) == [3]


def _empirical(draws: list[int], vocab: int) -> torch.Tensor:
    counts = torch.bincount(torch.tensor(draws), minlength=vocab).float()
    return counts / counts.sum()


def test_sampled_verification_keeps_the_target_distribution() -> None:
    """The first emitted token must follow p exactly, whatever the fixed guess (one-hot q),
    or with guesses drawn from a draft distribution q; 20k draws per case (TV < 0.02)."""
    vocab = 6
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(2, vocab, generator=gen), dim=-1)
    q = torch.softmax(torch.randn(1, vocab, generator=gen) * 2, dim=-1)
    for guess, draft_probs in [(0, None), (int(p[0].argmin()), None), (None, q)]:
        first = []
        for _ in range(20000):
            g = guess if guess is not None else int(torch.multinomial(q[0], 1, generator=gen))
            first.append(verify_sampled(p, [g], gen, draft_probs)[0])
        tv = 0.5 * float((_empirical(first, vocab) - p[0]).abs().sum())
        assert tv < 0.02, (guess, tv)


def test_sampled_verification_accepts_a_sure_guess_and_adds_a_bonus() -> None:
    probs = torch.zeros(3, 4)
    probs[0, 2] = 1.0
    probs[1, 1] = 1.0
    probs[2, 3] = 1.0
    assert verify_sampled(probs, [2, 1], torch.Generator().manual_seed(0)) == [2, 1, 3]
    assert verify_sampled(probs, [0, 1], torch.Generator().manual_seed(0)) == [2]
