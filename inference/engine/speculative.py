"""Speculative decoding's two halves that do not touch the model: proposing and verifying.

A proposer guesses the next k tokens of a sequence cheaply. The engine then runs the
model once over [last token, guess_1 .. guess_k] and this module decides, from the model's
k+1 next-token distributions, how many guesses stand and which token follows them:

- greedy: a guess stands while it equals the model's argmax at its position; the first
  disagreement is replaced by the argmax (so the output is exactly the non-speculative one);
- sampled: the standard rejection rule (Leviathan et al. 2023; Chen et al. 2023): guess x
  with draft probability q(x) stands with probability min(1, p(x) / q(x)); on rejection the
  token is drawn from max(0, p - q) renormalised. After k accepted guesses a bonus token is
  drawn from p at position k+1. The output distribution is exactly p's. The n-gram proposer
  and the suffix store (suffix_index.py) are deterministic (q is one-hot on the guess),
  which reduces to: accept with p(x), else draw from p with x removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from inference.engine import kernels
from inference.engine.sampler import filter_logits
from inference.engine.suffix_index import MAX_MATCH, SuffixStore

if TYPE_CHECKING:
    from inference.engine.config import EngineConfig
    from inference.engine.draft import DraftProposer
    from inference.engine.sampling_params import SamplingParams
    from inference.engine.sequence import Sequence

# "auto" proposes only what follows an earlier match of at least this many tokens: in
# open-ended text a single matching token (a "the", a comma) is common and its continuation
# rarely right, so its guesses only cost: with single-token matches a story at one user
# lost against plain decoding, with two it wins, as a rewrite does either way (`python -m
# inference.bench.vs_llama --no-llama --concurrency 1 --workload story|rewrite --variant off
# ENGINE_SPECULATIVE_MODE= --variant auto ENGINE_SPECULATIVE_MODE=auto`).
AUTO_NGRAM_MIN = 2
# A sequence's acceptance is judged once this many of its guesses were checked; below the
# bar it decodes plainly for PAUSE_TOKENS tokens, then tries again.
JUDGE_AFTER = 16
PAUSE_TOKENS = 32


class NgramProposer:
    """Prompt lookup: find the most recent earlier occurrence of the sequence's last n
    tokens (n from max_n down to min_n) and propose the tokens that followed it.

    Pays off when the output quotes its context: edits, rewrites, code refactors, answers
    that repeat the question. Costs one vectorised scan of the sequence per step.
    """

    def __init__(self, num_tokens: int, min_n: int = 1, max_n: int = 4, window: int = 4096):
        if num_tokens < 1 or not 1 <= min_n <= max_n:
            raise ValueError("ngram speculation needs num_tokens >= 1 and 1 <= min_n <= max_n")
        self.num_tokens = num_tokens
        self.min_n = min_n
        self.max_n = max_n
        # Only the most recent `window` tokens are searched, so a step never scans a
        # whole long conversation.
        self.window = window

    def propose(self, token_ids: list[int], limit: int | None = None) -> list[int]:
        return self.match(token_ids, limit)[0]

    def match(self, token_ids: list[int], limit: int | None = None) -> tuple[list[int], int]:
        """(guess, n): the guess and the length of the match it follows; ([], 0) if none."""
        k = self.num_tokens if limit is None else min(self.num_tokens, limit)
        if k <= 0 or len(token_ids) < self.min_n + 1:
            return [], 0
        arr = np.asarray(token_ids[-self.window :], dtype=np.int64)
        length = len(arr)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = arr[length - n :]
            # Every earlier window of n tokens with at least one token after it.
            windows = np.lib.stride_tricks.sliding_window_view(arr[: length - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size == 0:
                continue
            start = int(hits[-1]) + n  # the most recent match's continuation
            proposal = arr[start : start + k]
            if proposal.size:
                tokens: list[int] = proposal.tolist()
                return tokens, n
        return [], 0


def verify_greedy(target_argmax: list[int], draft: list[int]) -> list[int]:
    """Tokens to emit: the guesses that match the model's argmax, then the model's own
    token at the first mismatch (or after the last guess). Always at least one token."""
    out: list[int] = []
    for guess, target in zip(draft, target_argmax, strict=False):
        if guess != target:
            break
        out.append(guess)
    out.append(target_argmax[len(out)])
    return out


def verify_sampled(
    probs: torch.Tensor,
    draft: list[int],
    generator: torch.Generator | None = None,
    draft_probs: torch.Tensor | None = None,
) -> list[int]:
    """Rejection sampling over `probs` [len(draft)+1, vocab], the model's (filtered,
    temperature-scaled) distributions at each guess's position and one past the last.

    draft_probs [len(draft), vocab] is the proposer's distribution; None means a
    deterministic proposer (one-hot on each guess).
    """
    out: list[int] = []
    for i, guess in enumerate(draft):
        p = probs[i]
        q_guess = 1.0 if draft_probs is None else float(draft_probs[i, guess])
        p_guess = float(p[guess])
        u = float(torch.rand((), generator=generator))
        if q_guess > 0 and u < min(1.0, p_guess / q_guess):
            out.append(guess)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[guess] = 0.0
        else:
            residual = torch.clamp(p - draft_probs[i], min=0.0)
        total = float(residual.sum())
        if total <= 0.0:  # p == q: any draw from p is right
            residual, total = p, float(p.sum())
        out.append(int(torch.multinomial(residual / total, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(draft)], 1, generator=generator)))
    return out


def verify_sampled_guesses(
    logits: torch.Tensor,
    draft: list[int],
    sampling: SamplingParams,
    generator: torch.Generator | None = None,
) -> list[int]:
    """verify_sampled for a deterministic proposer, from the raw logits [len(draft)+1,
    vocab]: in the native kernels where they build (kernels/sample.c filters each row as
    the sampler does and applies the rule there: ~0.1 ms a row, against ~1.5 ms for
    filter_logits' sort of the vocabulary), else through filter_logits."""
    lib = kernels.load() if logits.device.type == "cpu" else None
    if lib is None or logits.dtype != torch.float32:
        probs = torch.softmax(torch.stack([filter_logits(r, sampling) for r in logits]), -1)
        return verify_sampled(probs, draft, generator)
    rows = logits.contiguous()
    vocab = rows.shape[1]
    p = sampling
    out: list[int] = []
    for i, guess in enumerate([*draft, -1]):
        u_accept = float(torch.rand((), generator=generator)) if guess >= 0 else 0.0
        token = int(
            lib.spec_sample(
                rows[i].data_ptr(), vocab, p.temperature, p.top_k, p.top_p, p.min_p, guess,
                u_accept, float(torch.rand((), generator=generator)),
            )
        )  # fmt: skip
        if token == -2:
            raise MemoryError("spec_sample: out of memory")
        out.append(token)
        if token != guess:
            return out
    return out


class Speculator:
    """The engine's side of speculation: who guesses this step, and what the model keeps.

    Before a step it gives each decoding sequence up to k guesses (seq.draft_tokens: prompt
    lookup's, or with a cache salt its owner's earlier requests' where they match longer); the
    scheduler runs them with the sequence's last token, the model runner returns k + 1 rows
    of logits, and `verify` turns them into the tokens to emit. Speculation is skipped:
      - in a step with more than speculative_max_batch decoding sequences (a big batch is
        compute-bound: checking guesses costs about as much as decoding them);
      - for a sequence whose acceptance stayed below speculative_min_acceptance (paused
        for PAUSE_TOKENS tokens), or with a repetition penalty (it depends on every
        earlier token, guesses included: one more case to get exactly right for little);
      - where fewer than two tokens are left under max_tokens or the context window;
      - with "auto", for a sampled request with a seed (its text must not depend on timing).
    """

    def __init__(
        self,
        config: EngineConfig,
        max_model_len: int,
        vocab_size: int,
        row_budget: int | None = None,
        kv_tokens: int | None = None,
    ) -> None:
        if config.speculative_mode not in ("ngram", "draft", "auto"):
            raise ValueError(
                "speculative_mode must be '', 'auto', 'ngram' or 'draft'; "
                f"got {config.speculative_mode!r}"
            )
        self.config = config
        # "auto": prompt lookup, and only while a step's rows (decodes plus guesses) stay
        # within row_budget: the rows a step can take at the cost of about one row (the
        # native small-step path, where reading the weights dominates). Beyond it a guess
        # costs nearly as much as the token it may save.
        self.row_budget = row_budget if config.speculative_mode == "auto" else None
        self.auto = config.speculative_mode == "auto"
        self.max_model_len = max_model_len
        self.k = config.num_speculative_tokens
        self.ngram: NgramProposer | None = None
        # Suffix decoding (suffix_index.py): guesses from the same owner's earlier requests.
        self.store: SuffixStore | None = None
        self.draft: DraftProposer | None = None
        if config.speculative_mode in ("ngram", "auto"):
            ngram_min = config.ngram_min
            if config.speculative_mode == "auto":
                ngram_min = max(ngram_min, AUTO_NGRAM_MIN)
            self.ngram = NgramProposer(self.k, ngram_min, config.ngram_max)
            if config.suffix_max_tokens > 0:
                self.store = SuffixStore(
                    config.suffix_max_tokens,
                    max(config.suffix_max_tokens, config.suffix_total_tokens),
                )
        else:
            from inference.engine.draft import DraftProposer

            self.draft = DraftProposer(config, self.k, vocab_size, kv_tokens)
        # "auto" judges a sequence by what its guesses buy against what they cost: the
        # mean duration of steps with and without guesses (exponential averages).
        self.step_seconds = {False: 0.0, True: 0.0}
        self.drafted = 0  # guesses checked
        self.accepted = 0  # guesses kept
        self.verifications = 0  # sequence-checks (one per sequence per step with guesses)
        self.steps = 0  # forwards that checked guesses
        self.store_drafted = 0  # of which guessed from the suffix store
        self.store_accepted = 0
        self._from_store: set[str] = set()  # requests whose guesses this step are the store's

    def propose(self, running: list[Sequence]) -> None:
        """Set draft_tokens on the decoding sequences that speculate this step."""
        decoding = [s for s in running if s.num_uncomputed_tokens == 1]
        for seq in decoding:
            seq.clear_draft()
            self._from_store.discard(seq.request_id)
        if not decoding or len(decoding) > self.config.speculative_max_batch:
            return
        spare = None if self.row_budget is None else self.row_budget - len(decoding)
        if spare is not None and spare <= 0:
            return
        if spare is not None and any(s.num_uncomputed_tokens > 1 for s in running):
            # A prompt's chunk in the same step puts it on the torch path, where each guess
            # row costs about what a token does: "auto" waits for a step of decodes alone.
            return
        wanted: list[tuple[Sequence, int]] = []
        for seq in decoding:
            p = seq.sampling
            # The checked rows' logits skip the sampler's penalties, masks and logprobs.
            if p.repetition_penalty != 1.0 or p.penalized or p.logprobs is not None:
                continue
            if self.auto and seq.generator is not None and not seq.sampling.greedy:
                # A seeded sampled request promises the same text for the same seed. A kept
                # guess draws from its generator otherwise than plain sampling does, and
                # whether "auto" guesses depends on measured step times and on the batch:
                # so such a request samples plainly. (ngram, chosen explicitly, keeps the
                # rule's "same distribution, another text".)
                continue
            if seq.num_output_tokens < seq.spec_resume_at:
                continue
            # Emitting k + 1 tokens must stay within max_tokens, and computing the guesses'
            # positions within the context window.
            room = min(seq.max_tokens - seq.num_output_tokens, self.max_model_len - len(seq) + 1)
            limit = min(self.k, room - 1)
            if spare is not None:
                limit = min(limit, spare // len(decoding))
            if limit > 0:
                wanted.append((seq, limit))
        if self.ngram is not None:
            for seq, limit in wanted:
                seq.draft_tokens = self._lookup(self.ngram, seq, limit)
        elif self.draft is not None and wanted:
            self.draft.propose(wanted)

    def _lookup(self, ngram: NgramProposer, seq: Sequence, limit: int) -> list[int]:
        """The guess that follows the longer match: in the sequence itself, or in its
        owner's earlier requests (a tie goes to the sequence, the likelier context)."""
        guess, n = ngram.match(seq.token_ids, limit)
        owner = seq.cache_scope.salt
        if self.store is None or owner is None:  # unsalted: nobody's text but its own
            return guess
        theirs, m = self.store.propose(owner, seq.token_ids, limit)
        if m <= n or not theirs:
            return guess
        self._from_store.add(seq.request_id)
        return theirs

    def record_step(self, seconds: float, with_guesses: bool) -> None:
        old = self.step_seconds[with_guesses]
        self.step_seconds[with_guesses] = seconds if old == 0.0 else 0.9 * old + 0.1 * seconds

    def _pays(self, seq: Sequence) -> bool:
        """Whether the sequence's last window of guesses paid for themselves."""
        if self.row_budget is None:
            rate = seq.spec_window_accepted / seq.spec_window_drafted
            return rate >= self.config.speculative_min_acceptance
        plain, spec = self.step_seconds[False], self.step_seconds[True]
        # A checked step emits 1 + accepted tokens for spec / plain steps' time.
        tokens_per_check = 1 + seq.spec_window_accepted / max(1, seq.spec_window_checks)
        return plain == 0.0 or tokens_per_check >= spec / plain

    def verify(self, seq: Sequence, logits: torch.Tensor) -> list[int]:
        """The tokens to emit, from the model's logits at [last token, *guesses]."""
        draft = seq.draft_tokens
        if seq.sampling.greedy:
            out = verify_greedy(logits.argmax(dim=-1).tolist(), draft)
        elif seq.draft_probs is None:
            out = verify_sampled_guesses(logits, draft, seq.sampling, seq.generator)
        else:
            filtered = torch.stack([filter_logits(row, seq.sampling) for row in logits])
            probs = torch.softmax(filtered, dim=-1)
            out = verify_sampled(probs, draft, seq.generator, seq.draft_probs)
        accepted = len(out) - 1
        self.drafted += len(draft)
        self.accepted += accepted
        self.verifications += 1
        if seq.request_id in self._from_store:
            self._from_store.discard(seq.request_id)
            self.store_drafted += len(draft)
            self.store_accepted += accepted
        m = seq.figures
        m.drafted_tokens += len(draft)
        m.accepted_tokens += accepted
        seq.spec_window_drafted += len(draft)
        seq.spec_window_accepted += accepted
        seq.spec_window_checks += 1
        if seq.spec_window_drafted >= JUDGE_AFTER:
            if not self._pays(seq):
                seq.spec_resume_at = seq.num_output_tokens + len(out) + PAUSE_TOKENS
            seq.spec_window_drafted = seq.spec_window_accepted = seq.spec_window_checks = 0
        seq.clear_draft()
        return out

    def release(self, seq: Sequence) -> None:
        """The request ended: drop its draft-model state, and keep its text for its owner's
        later requests' guesses."""
        seq.clear_draft()
        self._from_store.discard(seq.request_id)
        owner = seq.cache_scope.salt
        if self.store is not None and owner is not None:
            # A prompt's cached prefix is text the owner sent before (or public text): the
            # store keeps what is new, with enough of what came before to match into it.
            cached = seq.figures.cached_tokens + seq.figures.cached_tokens_redis
            start = max(0, min(cached, seq.num_prompt_tokens) - MAX_MATCH)
            self.store.add(owner, seq.token_ids[start:])
        if self.draft is not None:
            self.draft.release(seq.request_id)

    def stats(self) -> dict[str, float | int]:
        return {
            "spec_drafted_tokens": self.drafted,
            "spec_accepted_tokens": self.accepted,
            "spec_steps": self.steps,
            "spec_verifications": self.verifications,
            "spec_acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            # Guesses kept per sequence-check; each check also emits the model's own token.
            "spec_mean_accepted_length": (
                self.accepted / self.verifications if self.verifications else 0.0
            ),
            "spec_suffix_drafted_tokens": self.store_drafted,
            "spec_suffix_accepted_tokens": self.store_accepted,
            "spec_suffix_tokens": len(self.store) if self.store is not None else 0,
            "spec_suffix_owners": len(self.store.owners) if self.store is not None else 0,
        }


# What stats() reports with speculation off.
DISABLED_STATS: dict[str, float | int] = {
    "spec_drafted_tokens": 0,
    "spec_accepted_tokens": 0,
    "spec_steps": 0,
    "spec_verifications": 0,
    "spec_acceptance_rate": 0.0,
    "spec_mean_accepted_length": 0.0,
    "spec_suffix_drafted_tokens": 0,
    "spec_suffix_accepted_tokens": 0,
    "spec_suffix_tokens": 0,
    "spec_suffix_owners": 0,
}
