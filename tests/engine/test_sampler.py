"""Sampling filters do what their names say."""

from __future__ import annotations

import pytest
import torch

from inference.engine import kernels
from inference.engine.sampler import Sampler, apply_repetition_penalty, filter_logits, sample_batch
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence
from tests.engine.conftest import needs_kernels

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


def _kept(logits: torch.Tensor, p: SamplingParams, draws: int = 4000) -> dict[int, float]:
    """Frequencies of sample_batch's picks over many identical rows."""
    picks = sample_batch(logits.repeat(draws, 1), [p] * draws)
    return {t: picks.count(t) / draws for t in set(picks)}


def test_batched_draws_follow_the_filtered_distribution():
    """sample_batch keeps exactly the tokens filter_logits keeps, in the same proportions,
    whether the filter is decided among its candidates or over the whole vocabulary."""
    gen = torch.Generator().manual_seed(0)
    for logits in (LOGITS, torch.randn(1000, generator=gen) * 0.1):  # peaked; nearly flat
        for p in (
            SamplingParams(temperature=0.7, top_p=0.95),
            SamplingParams(temperature=0.9),
            SamplingParams(temperature=1.0, top_k=3),
            SamplingParams(temperature=1.0, top_k=3, top_p=0.6),
            SamplingParams(temperature=1.3, min_p=0.2),
        ):
            want = torch.softmax(filter_logits(logits, p), dim=-1)
            got = _kept(logits, p)
            assert set(got) <= set(want.nonzero().flatten().tolist())
            for token, freq in got.items():
                assert abs(freq - want[token].item()) < 0.05, (p, token)


def test_a_batch_mixes_greedy_seeded_and_unseeded_rows():
    seqs = [
        Sequence("g", [1], SamplingParams(temperature=0.0)),
        Sequence("s", [1], SamplingParams(temperature=1.0, seed=3)),
        Sequence("u", [1], SamplingParams(temperature=0.5, top_k=1)),
    ]
    tokens = Sampler()(seqs, LOGITS.repeat(3, 1))
    assert tokens[0] == 1 and tokens[2] == 1
    alone = Sampler()([Sequence("s", [1], SamplingParams(temperature=1.0, seed=3))], LOGITS[None])
    assert tokens[1] == alone[0]


@needs_kernels
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_p=0.5),  # top-p's mass not among the likely few
        SamplingParams(temperature=1.0, top_k=5000, top_p=0.9),  # top-k beyond them
        SamplingParams(temperature=1.0, min_p=1e-7),  # min-p keeps the unlikely ones too
    ],
)
def test_rows_the_likely_tokens_do_not_decide_are_drawn_over_the_whole_vocabulary(params):
    """The native sampler decides among the tokens within 1e-5 of the most likely one; a
    nearly flat row whose filters reach past them is handed back (-1) and drawn the slow
    way, so what is kept is still exactly what filter_logits keeps."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6000, generator=gen) * 0.01
    one = torch.ones(1)
    handed_back = kernels.sample_rows(
        kernels.load(), logits[None].contiguous(), one * params.temperature,
        torch.tensor([params.top_k], dtype=torch.int32), one * params.top_p,
        one * params.min_p, torch.rand(1),
    )  # fmt: skip
    assert handed_back.tolist() == [-1]
    kept = set(torch.isfinite(filter_logits(logits, params)).nonzero().flatten().tolist())
    assert set(sample_batch(logits.repeat(50, 1), [params] * 50)) <= kept


@needs_kernels
def test_native_draws_match_the_torch_ops_on_a_real_sized_vocabulary():
    """Over 49k tokens with a peaked head (as a model's logits are), the native draws keep
    the tokens filter_logits keeps, in its proportions."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(49152, generator=gen) * 2
    logits[:6] += torch.tensor([12.0, 11.5, 11.0, 10.0, 9.0, 8.0])
    for p in (SamplingParams(temperature=0.7, top_p=0.95), SamplingParams(temperature=1.0)):
        want = torch.softmax(filter_logits(logits, p), dim=-1)
        got = _kept(logits, p, draws=1500)
        assert set(got) <= set(want.nonzero().flatten().tolist())
        for token in range(6):
            assert abs(got.get(token, 0.0) - want[token].item()) < 0.05, (p, token)


def test_frequency_and_presence_penalties_count_each_rows_own_output_tokens():
    prompt = [4]  # prompt tokens are not penalized, as OpenAI and vLLM do it
    seqs = [
        Sequence("f", prompt, SamplingParams(temperature=0.0, frequency_penalty=0.5)),
        Sequence("p", prompt, SamplingParams(temperature=0.0, presence_penalty=0.5)),
        Sequence("plain", prompt, SamplingParams(temperature=0.0)),
    ]
    for s in seqs:
        s.token_ids += [1, 1, 2]  # token 1 sampled twice, token 2 once
    logits = LOGITS.repeat(3, 1)
    Sampler()(seqs, logits)
    assert logits[0].tolist() == pytest.approx([1.0, 2.0, 1.5, 0.5, 2.9])
    assert logits[1].tolist() == pytest.approx([1.0, 2.5, 1.5, 0.5, 2.9])
    assert logits[2].tolist() == LOGITS.tolist()


def test_logit_bias_moves_only_its_rows_tokens():
    biased = SamplingParams(temperature=0.0, logit_bias=[(0, 100.0), (1, -100.0)])
    seqs = [Sequence("b", [1], biased), Sequence("plain", [1], SamplingParams(temperature=0.0))]
    assert Sampler()(seqs, LOGITS.repeat(2, 1)) == [0, 1]


def test_logprobs_come_from_the_raw_logits_with_the_top_alternatives():
    seqs = [
        Sequence("lp", [1], SamplingParams(temperature=0.0, logprobs=2, presence_penalty=2.0)),
        Sequence("none", [1], SamplingParams(temperature=0.0)),
    ]
    seqs[0].token_ids.append(1)  # the penalty moves the pick from 1 to 4...
    assert Sampler()(seqs, LOGITS.repeat(2, 1)) == [4, 1]
    raw = torch.log_softmax(LOGITS, -1)  # ...but the logprobs are the model's own
    lp = seqs[0].last_logprob
    assert lp is not None and lp.token_id == 4 and lp.logprob == pytest.approx(raw[4].item())
    assert [t for t, _ in lp.top] == [1, 4]
    assert [v for _, v in lp.top] == pytest.approx([raw[1].item(), raw[4].item()])
    assert seqs[1].last_logprob is None
