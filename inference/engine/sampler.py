"""Pick each sequence's next token from its logits.

Before the draw, in this order and only on the rows that ask for them: the raw
log-probabilities (logprobs, kept from the model's own distribution), the repetition
penalty, the frequency and presence penalties and the logit bias (batched over the rows
that have them), and a structured output's grammar mask. A batch without them pays a few
list comprehensions.

Greedy rows take the argmax in one batched call (`greedy_picks`), and unseeded random rows
are filtered and drawn together (`sample_batch`): in the native kernels where they build
(sample.c: for random rows a few passes over the vocabulary and a selection instead of its
sort, ~10x fewer microseconds than the torch ops, ~100x fewer on a nearly flat row), else
in a few tensor ops. Seeded rows go one by one, each with its own generator, so a seeded
request gives the same output whatever else shares its batch.
"""

from __future__ import annotations

import ctypes

import torch
from torch.nn.utils.rnn import pad_sequence

from inference.engine import kernels
from inference.engine.outputs import TokenLogprob
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence
from inference.engine.structured import GrammarMasks


def apply_repetition_penalty(logits: torch.Tensor, token_ids: list[int], penalty: float) -> None:
    """CTRL-style, as transformers does it: divide positive logits, multiply negative ones."""
    ids = torch.tensor(sorted(set(token_ids)), dtype=torch.long, device=logits.device)
    picked = logits[ids]
    logits[ids] = torch.where(picked > 0, picked / penalty, picked * penalty)


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence], rows: list[int]) -> None:
    """OpenAI's frequency and presence penalties over each row's output tokens, and its
    logit_bias, in place on logits[rows]: mu[j] -= c[j] * frequency + (c[j] > 0) * presence
    + bias[j], for all the rows at once."""
    vocab = logits.shape[1]
    counted = [i for i in rows if seqs[i].num_output_tokens and _penalty(seqs[i].sampling)]
    if counted:
        outs = [torch.tensor(seqs[i].output_token_ids, dtype=torch.long) for i in counted]
        # Padding goes to an extra column, dropped after counting.
        ids = pad_sequence(outs, batch_first=True, padding_value=vocab)
        counts = torch.zeros(len(counted), vocab + 1, dtype=logits.dtype)
        counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=logits.dtype))
        counts = counts[:, :vocab]
        freq = torch.tensor([seqs[i].sampling.frequency_penalty for i in counted])
        pres = torch.tensor([seqs[i].sampling.presence_penalty for i in counted])
        penalty = counts * freq[:, None] + (counts > 0).to(logits.dtype) * pres[:, None]
        logits[counted] -= penalty
    biased = [(i, t, b) for i in rows for t, b in seqs[i].sampling.logit_bias if 0 <= t < vocab]
    if biased:
        r, t, b = zip(*biased, strict=True)
        logits.index_put_(
            (torch.tensor(r), torch.tensor(t)), torch.tensor(b, dtype=logits.dtype), accumulate=True
        )


def _penalty(p: SamplingParams) -> bool:
    return bool(p.frequency_penalty or p.presence_penalty)


def raw_logprobs(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """log-softmax of logits[rows] as the model gave them (before any processing)."""
    return torch.log_softmax(logits[rows].float(), dim=-1)


def token_logprobs(
    logprobs: torch.Tensor, tokens: list[int], tops: list[int]
) -> list[TokenLogprob]:
    """Each row's sampled token's logprob and its top[row] most likely tokens'."""
    picked = logprobs.gather(1, torch.tensor(tokens)[:, None]).flatten().tolist()
    k = max(tops)
    best = torch.topk(logprobs, k, dim=-1) if k else None
    out = []
    for r, (token, lp) in enumerate(zip(tokens, picked, strict=True)):
        top: list[tuple[int, float]] = []
        if best is not None and tops[r]:
            ids = best.indices[r, : tops[r]].tolist()
            top = list(zip(ids, best.values[r, : tops[r]].tolist(), strict=True))
        out.append(TokenLogprob(token, lp, top))
    return out


def filter_logits(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p masks: a 1-D tensor of scaled logits.
    top-k keeps every token tied with its k-th; top-p takes tied tokens by index."""
    logits = logits / p.temperature
    if 0 < p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        # Stable: tied tokens go by index, as the native sampler (kernels/sample.c) orders them.
        sorted_logits, order = torch.sort(logits, descending=True, stable=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token once the mass before it already reaches top_p (the first stays).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= p.top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    if p.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


# Candidates per row for batched top-k / top-p: a row whose best CANDIDATES tokens already
# hold top_p of the mass is filtered exactly among them (the rest could never be kept);
# another row is filtered over the whole vocabulary, as filter_logits does.
CANDIDATES = 256


def draw(weights: torch.Tensor) -> torch.Tensor:
    """One index per row of non-negative weights [B, n], in proportion to them: inverse CDF
    (torch.multinomial cost ~1.5 ms a row over a 49k vocabulary; this ~0.1 ms)."""
    cdf = weights.cumsum(-1)
    u = torch.rand(weights.shape[0], 1, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=weights.shape[1] - 1)


def _native(logits: torch.Tensor) -> ctypes.CDLL | None:
    """The kernels' library where sample.c takes these logits (float32 on the CPU)."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        return None
    return kernels.load()


def greedy_picks(logits: torch.Tensor) -> list[int]:
    """argmax of each row of logits [B, vocab]: in the native kernels where they build (torch's
    argmax runs on one thread, ~5 ms for 64 rows of 49k logits), else torch's."""
    lib = _native(logits)
    if lib is not None:
        picks: list[int] = kernels.argmax_rows(lib, logits.contiguous()).tolist()
        return picks
    out: list[int] = logits.argmax(dim=-1).tolist()
    return out


def sample_batch(logits: torch.Tensor, params: list[SamplingParams]) -> list[int]:
    """One draw per row of logits [B, vocab] with each row's temperature, top-k, top-p and
    min-p: the same distribution as filter_logits + softmax, row by row."""
    lib = _native(logits)
    if lib is not None:
        return _sample_native(lib, logits, params)
    return _sample_torch(logits, params)


def _sample_native(
    lib: ctypes.CDLL, logits: torch.Tensor, params: list[SamplingParams]
) -> list[int]:
    picks: list[int] = kernels.sample_rows(
        lib,
        logits.contiguous(),
        torch.tensor([p.temperature for p in params], dtype=torch.float32),
        torch.tensor([p.top_k for p in params], dtype=torch.int32),
        torch.tensor([p.top_p for p in params], dtype=torch.float32),
        torch.tensor([p.min_p for p in params], dtype=torch.float32),
        torch.rand(len(params)),
    ).tolist()
    return picks


def _sample_torch(logits: torch.Tensor, params: list[SamplingParams]) -> list[int]:
    vocab = logits.shape[1]
    temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype)
    probs = torch.softmax(logits / temps[:, None], dim=-1)
    picks = [0] * len(params)
    plain = [i for i, p in enumerate(params) if not _filters(p, vocab)]
    if plain:
        for i, token in zip(plain, draw(_rows(probs, plain)).flatten().tolist(), strict=True):
            picks[i] = token
    rows = [i for i, p in enumerate(params) if _filters(p, vocab)]
    if rows:
        drawn = _sample_filtered(_rows(probs, rows), [params[i] for i in rows])
        for i, token in zip(rows, drawn, strict=True):
            picks[i] = token if token >= 0 else _sample_one(logits[i], params[i])
    return picks


def _rows(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """t[rows] without the copy when rows are all of t's, in order (the usual batch)."""
    return t if len(rows) == t.shape[0] else t[rows]


def _filters(p: SamplingParams, vocab: int) -> bool:
    return 0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0


def _sample_one(logits: torch.Tensor, p: SamplingParams) -> int:
    return int(torch.multinomial(torch.softmax(filter_logits(logits, p), dim=-1), 1).item())


def _sample_filtered(probs: torch.Tensor, params: list[SamplingParams]) -> list[int]:
    """Draws among each row's CANDIDATES most likely tokens; -1 for a row whose filters
    those candidates do not decide (it is drawn over the whole vocabulary instead)."""
    b, vocab = probs.shape
    k = min(vocab, CANDIDATES)
    top, idx = torch.topk(probs, k, dim=-1)  # descending
    cand = top.clone()
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params])
    cand[torch.arange(k)[None, :] >= top_k[:, None]] = 0.0
    top_p = torch.tensor([p.top_p for p in params], dtype=probs.dtype)
    # filter_logits takes top-p of what top-k left, renormalized.
    kept_mass = torch.where(top_k <= k, cand.sum(-1), torch.ones(b, dtype=probs.dtype))
    mass_before = torch.cumsum(cand, dim=-1) - cand
    cand[mass_before >= (top_p * kept_mass)[:, None]] = 0.0
    min_p = torch.tensor([p.min_p for p in params], dtype=probs.dtype)
    cand[top < (min_p * top[:, 0])[:, None]] = 0.0
    # Exact among the candidates when top-k cut inside them, top-p was reached there, or
    # min-p drops everything past them.
    covered = (top_k <= k) | (top.sum(-1) >= top_p) | (min_p * top[:, 0] > top[:, -1])
    picks = idx.gather(1, draw(cand)).flatten()
    return torch.where(covered, picks, -1).tolist()


class Sampler:
    # The model's logits are inference tensors: changed in place only in inference mode.
    @torch.inference_mode()
    def __call__(
        self, seqs: list[Sequence], logits: torch.Tensor, masks: GrammarMasks | None = None
    ) -> list[int]:
        """logits: [len(seqs), vocab] float32, changed in place by penalties and masks.
        Returns one token id per sequence; a request that asked for logprobs finds its
        token's in seq.last_logprob, and a structured one's grammar has taken the token."""
        wants_logprobs = [i for i, s in enumerate(seqs) if s.sampling.logprobs is not None]
        raw = raw_logprobs(logits, wants_logprobs) if wants_logprobs else None
        for i, seq in enumerate(seqs):
            if seq.sampling.repetition_penalty != 1.0:
                apply_repetition_penalty(logits[i], seq.token_ids, seq.sampling.repetition_penalty)
        adjusted = [i for i, s in enumerate(seqs) if s.sampling.penalized]
        if adjusted:
            apply_penalties(logits, seqs, adjusted)
            structured = [i for i in adjusted if seqs[i].grammar is not None]
            if structured:
                if masks is None:
                    raise RuntimeError("a structured request reached the sampler without masks")
                masks.apply(logits, seqs, structured)
        tokens = self._pick(seqs, logits)
        if raw is not None:
            picked = [tokens[i] for i in wants_logprobs]
            tops = [seqs[i].sampling.logprobs or 0 for i in wants_logprobs]
            for i, lp in zip(wants_logprobs, token_logprobs(raw, picked, tops), strict=True):
                seqs[i].last_logprob = lp
        for i in adjusted:
            grammar = seqs[i].grammar
            if grammar is not None and not grammar.accept(tokens[i]):
                raise RuntimeError(f"the grammar refused token {tokens[i]} its own mask allowed")
        return tokens

    def _pick(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        greedy = [i for i, s in enumerate(seqs) if s.sampling.greedy]
        tokens = [0] * len(seqs)
        if greedy:
            for i, token in zip(greedy, greedy_picks(_rows(logits, greedy)), strict=True):
                tokens[i] = token
        batched = [i for i, s in enumerate(seqs) if not s.sampling.greedy and s.generator is None]
        if batched:
            draws = sample_batch(_rows(logits, batched), [seqs[i].sampling for i in batched])
            for i, token in zip(batched, draws, strict=True):
                tokens[i] = token
        for i, seq in enumerate(seqs):
            if seq.sampling.greedy or seq.generator is None:
                continue
            probs = torch.softmax(filter_logits(logits[i], seq.sampling), dim=-1)
            tokens[i] = int(torch.multinomial(probs, 1, generator=seq.generator).item())
        return tokens
