"""Sampling filters do what their names say."""

from __future__ import annotations

import pytest
import torch

from inference.engine import kernels, sampler
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


def _rows() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    peaked = torch.randn(49152, generator=gen) * 2
    peaked[:6] += torch.tensor([12.0, 11.5, 11.0, 10.0, 9.0, 8.0])
    masked = torch.randn(49152, generator=gen) * 0.02
    masked[torch.rand(49152, generator=gen) < 0.9] = float("-inf")  # a grammar's mask
    few = torch.randn(3000, generator=gen)
    few[5:] = float("-inf")
    head = torch.randn(49152, generator=gen) * 1.5
    head[:300] += torch.linspace(18, 6, 300)  # 60-280 tokens within 1e-5 of the best
    return {
        "flat": torch.randn(49152, generator=gen) * 0.02,  # a random-weight model's
        "peaked": peaked,
        "head": head,
        "masked": masked,
        "few_allowed": few,
        "ties": torch.randint(0, 5, (5000,), generator=gen).float() * 0.1,
    }


ROWS = _rows()
FILTERS = [
    SamplingParams(temperature=0.7, top_p=0.95),  # the chat UI's defaults
    SamplingParams(temperature=1.0, top_p=0.5),
    SamplingParams(temperature=1.0, top_k=50),
    SamplingParams(temperature=1.0, top_k=3),
    SamplingParams(temperature=1.0, top_k=5000, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=3000, top_p=0.3),
    SamplingParams(temperature=1.3, min_p=0.2),
    SamplingParams(temperature=1.0, min_p=1e-7),
    SamplingParams(temperature=1.0, min_p=0.999),
    SamplingParams(temperature=0.7, min_p=0.95),
    SamplingParams(temperature=0.7, top_k=1000, top_p=0.9, min_p=0.95),
    SamplingParams(temperature=1.0, top_k=100000, top_p=0.8, min_p=0.5),
    SamplingParams(temperature=0.5, top_k=20, top_p=0.5, min_p=0.98),
    SamplingParams(temperature=1.0, top_k=100000),  # top_k >= vocab, top_p 1, min_p 0
]


def _name(p: SamplingParams) -> str:
    return f"t{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}"


@needs_kernels
@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("params", FILTERS, ids=_name)
def test_native_sampler_keeps_exactly_what_filter_logits_keeps(row, params):
    """The tokens the native sampler draws among are filter_logits' (in float64, so that
    neither side's rounding moves a boundary), on flat rows and long-tailed ones (more than
    MAX_CAND tokens within 1e-5 of the best: decided over the whole vocabulary), a row with
    a few hundred likely tokens (decided among them), rows a mask leaves mostly -inf, and
    tied weights (top-k keeps the k-th's ties, top-p takes ties by index). One token off at
    any boundary fails."""
    logits = ROWS[row]
    want = filter_logits(logits.double(), params)
    want = torch.isfinite(want) & (torch.softmax(want, dim=-1) > 0)
    got = kernels.sample_kept(
        kernels.load(), logits.contiguous(), params.temperature, params.top_k, params.top_p,
        params.min_p,
    )  # fmt: skip
    assert torch.equal(got, want), (int(got.sum()), int(want.sum()))


@needs_kernels
@pytest.mark.parametrize(
    "params", [*FILTERS[:3], FILTERS[6], SamplingParams(temperature=0.9)], ids=_name
)
def test_native_draws_follow_the_kept_weights(params):
    """Evenly spaced uniforms draw each kept token within two draws of n * p (an inverse CDF
    of the filtered distribution), over a nearly flat row: among its listed candidates
    (top-k, top-p) or over the whole row (min-p alone, no filter)."""
    gen = torch.Generator().manual_seed(3)
    vocab, n = 400, 8000
    logits = torch.randn(vocab, generator=gen) * 0.3
    probs = torch.softmax(filter_logits(logits.double(), params), dim=-1)
    one = torch.ones(n)
    picks = kernels.sample_rows(
        kernels.load(), logits.expand(n, vocab).contiguous(), one * params.temperature,
        torch.full((n,), params.top_k, dtype=torch.int32), one * params.top_p,
        one * params.min_p, (torch.arange(n) + 0.5) / n,
    )  # fmt: skip
    counts = torch.bincount(picks, minlength=vocab).double()
    assert (counts[probs == 0] == 0).all()
    assert (counts - n * probs).abs().max() <= 2


@needs_kernels
def test_flat_rows_are_decided_natively(monkeypatch):
    """A nearly flat row (a random-weight model's, or a real one's at a high temperature)
    is drawn in C too: the whole-vocabulary torch path is not taken."""
    monkeypatch.setattr(sampler, "_sample_one", None)
    p = SamplingParams(temperature=0.7, top_p=0.95)
    kept = torch.isfinite(filter_logits(ROWS["flat"], p))
    picks = sample_batch(ROWS["flat"].repeat(8, 1), [p] * 8)
    assert all(kept[t] for t in picks)


@needs_kernels
def test_a_rejected_guess_is_redrawn_from_the_filtered_distribution_without_it():
    """spec_sample (speculation's rule) on a nearly flat row: the guess stands exactly when
    u_accept < its filtered probability, and evenly spaced redraws follow p without it."""
    gen = torch.Generator().manual_seed(4)
    vocab, n = 6000, 12000
    logits = torch.randn(vocab, generator=gen) * 0.02
    p = SamplingParams(temperature=0.7, top_p=0.5)
    probs = torch.softmax(filter_logits(logits.double(), p), dim=-1)
    guess = int(probs.argmax())
    lib = kernels.load()

    def spec(u_accept: float, u_draw: float) -> int:
        return lib.spec_sample(
            logits.data_ptr(), vocab, p.temperature, p.top_k, p.top_p, p.min_p, guess,
            u_accept, u_draw,
        )  # fmt: skip

    p_guess = float(probs[guess])
    assert spec(p_guess * 0.99, 0.5) == guess
    picks = torch.tensor([spec(p_guess * 1.01, (j + 0.5) / n) for j in range(n)])
    rest = probs.clone()
    rest[guess] = 0.0
    counts = torch.bincount(picks, minlength=vocab).double()
    assert (counts - n * rest / rest.sum()).abs().max() <= 2


@needs_kernels
def test_nan_and_masked_logits_are_never_drawn():
    logits = torch.randn(1000) * 0.01
    logits[::3] = float("nan")
    logits[1::3] = float("-inf")
    for p in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.95)):
        picks = sample_batch(logits.repeat(200, 1), [p] * 200)
        assert all(t % 3 == 2 for t in picks)
    one = torch.full((1000,), float("-inf"))
    one[7] = 0.0
    assert sample_batch(one[None], [SamplingParams(temperature=1.0, top_k=5)]) == [7]


@needs_kernels
@pytest.mark.parametrize("vocab", [1, 7, 32, 33, 1000, 49152])
def test_native_greedy_picks_are_torchs_argmax(vocab):
    """sampler.greedy_picks (sample.c's argmax_rows) picks what torch.argmax picks on every
    row: the first of tied maxima, the first NaN where a row has one (torch ranks NaN above
    every number, wherever it lies), +inf, rows of -inf only, and any tail length."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(12, vocab, generator=gen)
    logits[1] = 0.0
    logits[2] = float("-inf")
    logits[3, vocab // 2 :] = float("inf")
    logits[4, -1] = float("nan")
    logits[5, :: max(1, vocab // 3)] = float("nan")
    logits[6] = torch.randint(0, 3, (vocab,), generator=gen).float()
    logits[7, vocab // 3] = float("nan")
    logits[7, 0] = float("inf")
    assert sampler.greedy_picks(logits) == logits.argmax(dim=-1).tolist()
    assert sampler.greedy_picks(logits[3:4]) == logits[3:4].argmax(dim=-1).tolist()


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
