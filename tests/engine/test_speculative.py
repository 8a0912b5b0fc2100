"""Speculative decoding's proposer and verification rules, without a model."""

from __future__ import annotations

import torch

from inference.engine.sampler import filter_logits
from inference.engine.sampling_params import SamplingParams
from inference.engine.speculative import (
    NgramProposer,
    verify_greedy,
    verify_sampled,
    verify_sampled_guesses,
)


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


def test_sampled_guesses_from_raw_logits_keep_the_filtered_distribution() -> None:
    """verify_sampled_guesses (the native path where the kernels build) filters each row as
    the sampler does: the first emitted token follows the filtered p whatever the guess
    (a likely one, one the filters drop), and after a kept guess the next follows row 2's."""
    vocab = 40
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, vocab, generator=gen) * 2
    params = SamplingParams(temperature=0.8, top_p=0.9)
    p = [torch.softmax(filter_logits(row, params), dim=-1) for row in logits]
    for guess in (int(p[0].argmax()), int(p[0].argmin())):
        first, second = [], []
        for _ in range(20000):
            out = verify_sampled_guesses(logits, [guess], params, gen)
            first.append(out[0])
            if out[0] == guess and len(out) == 2:
                second.append(out[1])
        tv = 0.5 * float((_empirical(first, vocab) - p[0]).abs().sum())
        assert tv < 0.02, (guess, tv)
        if len(second) > 2000:
            tv = 0.5 * float((_empirical(second, vocab) - p[1]).abs().sum())
            assert tv < 0.04, (guess, tv)


def test_sampled_verification_accepts_a_sure_guess_and_adds_a_bonus() -> None:
    probs = torch.zeros(3, 4)
    probs[0, 2] = 1.0
    probs[1, 1] = 1.0
    probs[2, 3] = 1.0
    assert verify_sampled(probs, [2, 1], torch.Generator().manual_seed(0)) == [2, 1, 3]
    assert verify_sampled(probs, [0, 1], torch.Generator().manual_seed(0)) == [2]


def _repeating_seq(request_id: str, max_tokens: int = 100):
    from inference.engine.sampling_params import SamplingParams
    from inference.engine.sequence import Sequence

    prompt = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    seq = Sequence(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    seq.num_computed_tokens = len(seq) - 1  # decoding
    return seq


def _auto_speculator(row_budget: int):
    from inference.engine.config import EngineConfig
    from inference.engine.speculative import Speculator

    config = EngineConfig(speculative_mode="auto", num_speculative_tokens=4)
    return Speculator(config, max_model_len=1024, vocab_size=100, row_budget=row_budget)


def test_auto_keeps_a_steps_rows_within_the_small_step_budget() -> None:
    spec = _auto_speculator(row_budget=8)
    alone = [_repeating_seq("a")]
    spec.propose(alone)
    assert len(alone[0].draft_tokens) == 4  # 1 + 4 rows fit
    three = [_repeating_seq(str(i)) for i in range(3)]
    spec.propose(three)
    assert sum(1 + len(s.draft_tokens) for s in three) <= 8
    eight = [_repeating_seq(str(i)) for i in range(8)]
    spec.propose(eight)
    assert all(not s.draft_tokens for s in eight)


def test_auto_guesses_only_after_a_match_of_two_tokens_or_more() -> None:
    """In open-ended text one matching token is common and its continuation rarely
    right: auto skips what ngram would propose after it."""
    from inference.engine.config import EngineConfig
    from inference.engine.sampling_params import SamplingParams
    from inference.engine.sequence import Sequence
    from inference.engine.speculative import Speculator

    # The last token (9) occurred before, followed by 10, 11, ...; its last two never did.
    prompt = [9, 10, 11, 12, 13, 20, 21, 22, 9]
    for mode, guesses in (("ngram", [10, 11, 12, 13]), ("auto", [])):
        seq = Sequence(mode, prompt, SamplingParams(max_tokens=50, temperature=0.0))
        seq.num_computed_tokens = len(seq) - 1
        config = EngineConfig(speculative_mode=mode, num_speculative_tokens=4)
        Speculator(config, max_model_len=1024, vocab_size=100, row_budget=8).propose([seq])
        assert seq.draft_tokens == guesses, mode
    # Two matching tokens (21, 22 ... 21, 22) are enough.
    seq = Sequence("two", [21, 22, 30, 31, 32, 33, 21, 22], SamplingParams(max_tokens=50))
    seq.num_computed_tokens = len(seq) - 1
    _auto_speculator(row_budget=8).propose([seq])
    assert seq.draft_tokens == [30, 31, 32, 33]


def test_auto_does_not_guess_in_a_step_that_prefills_a_prompt() -> None:
    """A prompt's chunk makes the step a large one (the torch path), where guesses cost
    about a token each: auto proposes only in steps of decodes alone; ngram still does."""
    spec = _auto_speculator(row_budget=8)
    decoding = _repeating_seq("d")
    prefilling = _repeating_seq("p")
    prefilling.num_computed_tokens = 0
    spec.propose([decoding, prefilling])
    assert not decoding.draft_tokens
    spec.propose([decoding])
    assert len(decoding.draft_tokens) == 4


def test_auto_pauses_a_sequence_whose_guesses_do_not_pay_for_their_step() -> None:
    """A checked step emits 1 + accepted tokens; auto keeps guessing only while that beats
    how much longer such steps take than plain ones."""
    import torch

    from inference.engine.speculative import JUDGE_AFTER

    def judge(accepted_per_check: int) -> bool:
        spec = _auto_speculator(row_budget=8)
        spec.record_step(0.010, with_guesses=False)
        spec.record_step(0.025, with_guesses=True)  # guessing steps take 2.5x
        seq = _repeating_seq("s", max_tokens=1000)
        for _ in range(JUDGE_AFTER // 4):  # one judging window of 4-guess checks
            seq.draft_tokens = [9, 9, 9, 9]
            target = [9] * accepted_per_check + [0] * (5 - accepted_per_check)
            logits = torch.nn.functional.one_hot(torch.tensor(target), 100).float()
            seq.token_ids.extend(spec.verify(seq, logits))
        return seq.spec_resume_at <= seq.num_output_tokens  # still speculating

    assert judge(accepted_per_check=2)  # 3 tokens per 2.5x step: pays
    assert not judge(accepted_per_check=1)  # 2 tokens per 2.5x step: pauses
