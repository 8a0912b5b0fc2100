"""Sampling filters do what their names say."""

from __future__ import annotations

import torch

from inference.engine.sampler import Sampler, apply_repetition_penalty, filter_logits
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence

LOGITS = torch.tensor([1.0, 3.0, 2.0, 0.5, 2.9])


def test_top_k_keeps_the_k_best():
    out = filter_logits(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert torch.isfinite(out).nonzero().flatten().tolist() == [1, 4]


def test_top_p_keeps_the_smallest_set_reaching_p():
    out = filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=0.5))
    assert torch.isfinite(out).nonzero().flatten().tolist() == [1, 4]
    out = filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=0.01))
    assert torch.isfinite(out).nonzero().flatten().tolist() == [1]


def test_min_p_drops_tokens_far_below_the_best():
    out = filter_logits(LOGITS, SamplingParams(temperature=1.0, min_p=0.3))
    assert torch.isfinite(out).nonzero().flatten().tolist() == [1, 2, 4]


def test_repetition_penalty_pushes_seen_tokens_down():
    logits = torch.tensor([2.0, -1.0, 3.0])
    apply_repetition_penalty(logits, [0, 1, 1], 2.0)
    assert logits.tolist() == [1.0, -2.0, 3.0]


def test_greedy_takes_the_argmax_and_seeded_draws_repeat():
    greedy = Sequence("g", [1], SamplingParams(temperature=0.0))
    assert Sampler()([greedy], LOGITS[None].clone()) == [1]
    draws = []
    for _ in range(2):
        seqs = [Sequence(str(i), [1], SamplingParams(temperature=1.5, seed=7)) for i in range(5)]
        draws.append(Sampler()(seqs, LOGITS.repeat(5, 1)))
    assert draws[0] == draws[1]
