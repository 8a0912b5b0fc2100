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
  is deterministic (q is one-hot on its guess), which reduces to: accept with p(x), else
  draw from p with x removed.
"""

from __future__ import annotations

import numpy as np
import torch


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
        k = self.num_tokens if limit is None else min(self.num_tokens, limit)
        if k <= 0 or len(token_ids) < self.min_n + 1:
            return []
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
                return proposal.tolist()
        return []


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
