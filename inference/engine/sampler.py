"""Pick each sequence's next token from its logits.

Greedy rows take the argmax in one batched call. Random rows go one by one: each applies
its own filters and draws with its own generator, so a seeded request gives the same
output whatever else shares its batch.
"""

from __future__ import annotations

import torch

from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence


def apply_repetition_penalty(logits: torch.Tensor, token_ids: list[int], penalty: float) -> None:
    """CTRL-style, as transformers does it: divide positive logits, multiply negative ones."""
    ids = torch.tensor(sorted(set(token_ids)), dtype=torch.long, device=logits.device)
    picked = logits[ids]
    logits[ids] = torch.where(picked > 0, picked / penalty, picked * penalty)


def filter_logits(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p masks: a 1-D tensor of scaled logits."""
    logits = logits / p.temperature
    if 0 < p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token once the mass before it already reaches top_p (the first stays).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= p.top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    if p.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


class Sampler:
    def __call__(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """logits: [len(seqs), vocab] float32. Returns one token id per sequence."""
        for i, seq in enumerate(seqs):
            if seq.sampling.repetition_penalty != 1.0:
                apply_repetition_penalty(logits[i], seq.token_ids, seq.sampling.repetition_penalty)
        tokens = logits.argmax(dim=-1).tolist()
        for i, seq in enumerate(seqs):
            if seq.sampling.greedy:
                continue
            probs = torch.softmax(filter_logits(logits[i], seq.sampling), dim=-1)
            tokens[i] = int(torch.multinomial(probs, 1, generator=seq.generator).item())
        return tokens
