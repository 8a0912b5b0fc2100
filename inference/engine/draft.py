"""Draft-model speculation: a smaller model with the same tokenizer guesses k tokens.

The draft runs beside the target with its own paged KV pool (a ModelRunner and a
KVCacheManager of its own, no prefix index) and one shadow sequence per request. Each step,
for the sequences that speculate:

  1. catch up: the shadow takes the tokens the target emitted since last time; its KV is
     kept up to the last token both agree on (guesses the target rejected are rolled back
     by moving num_computed_tokens back: their slots get written over);
  2. guess: one batched forward over every shadow's new tokens gives guess 1, then k - 1
     batched single-token steps give the rest. Greedy requests take the draft's argmax;
     sampled ones draw from the draft's filtered distribution (the request's temperature,
     top-k, top-p, min-p), which goes to the rejection rule as q (seq.draft_probs).

It pays when the draft is much cheaper than the target and agrees with it often; on a
2-core CPU with a 135M target there is little room under the target for a draft.
"""

from __future__ import annotations

import dataclasses

import torch

from inference.engine.config import EngineConfig
from inference.engine.kv_cache import KVCacheManager
from inference.engine.model_runner import ModelRunner
from inference.engine.sampler import filter_logits
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence


class DraftProposer:
    def __init__(
        self, config: EngineConfig, num_tokens: int, vocab_size: int, kv_tokens: int | None = None
    ) -> None:
        if not config.speculative_draft_model:
            raise ValueError("speculative_mode='draft' needs speculative_draft_model (a folder)")
        draft_config = dataclasses.replace(
            config,
            model=config.speculative_draft_model,
            tensor_parallel_size=1,
            speculative_mode="",
            enable_prefix_caching=False,
        )
        self.runner = ModelRunner(
            draft_config, max_model_len=config.max_model_len or None, kv_tokens=kv_tokens
        )
        if self.runner.model.vocab_size != vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({self.runner.model.vocab_size}) differs from "
                f"the model's ({vocab_size}): it must share the tokenizer"
            )
        self.kv = KVCacheManager(self.runner.num_blocks, config.block_size, False)
        self.num_tokens = num_tokens
        self.shadows: dict[str, Sequence] = {}
        # Per shadow: the length up to which its tokens are the target's (set when guessing).
        self._base: dict[str, int] = {}

    @torch.inference_mode()
    def propose(self, wanted: list[tuple[Sequence, int]]) -> None:
        """Set draft_tokens (and draft_probs for sampled requests) on each (seq, limit)."""
        active: list[tuple[Sequence, Sequence, int]] = []
        for seq, limit in wanted:
            shadow = self._sync(seq)
            # Blocks for every position it computes: the target's tokens and limit - 1
            # guesses (the last guess is never fed back).
            if not self.kv.allocate(shadow, len(seq) + limit - 1):
                self.release(seq.request_id)  # pool full: no guesses for it this step
                continue
            self._base[seq.request_id] = len(seq)
            active.append((seq, shadow, limit))
        guesses: dict[str, list[int]] = {s.request_id: [] for s, _, _ in active}
        probs: dict[str, list[torch.Tensor]] = {s.request_id: [] for s, _, _ in active}
        while active:
            shadows = [sh for _, sh, _ in active]
            batch = ScheduledBatch(shadows, [sh.num_uncomputed_tokens for sh in shadows])
            sampling, logits = self.runner.run(batch)
            for sh, n in zip(batch.seqs, batch.num_tokens, strict=True):
                sh.num_computed_tokens += n
            for sh, row in zip(sampling, logits, strict=True):
                token, q = self._pick(sh, row)
                sh.append_token(token)
                guesses[sh.request_id].append(token)
                if q is not None:
                    probs[sh.request_id].append(q)
            active = [a for a in active if len(guesses[a[0].request_id]) < a[2]]
        for seq, _ in wanted:
            g = guesses.get(seq.request_id)
            if g:
                seq.draft_tokens = g
                p = probs[seq.request_id]
                seq.draft_probs = torch.stack(p) if p else None

    def _sync(self, seq: Sequence) -> Sequence:
        """The request's shadow, holding the target's tokens, its KV kept where they agree."""
        shadow = self.shadows.get(seq.request_id)
        if shadow is None:
            shadow = Sequence(seq.request_id, seq.token_ids, seq.sampling)
            self.shadows[seq.request_id] = shadow
            return shadow
        base = self._base.get(seq.request_id, 0)
        agree = base
        mine, theirs = shadow.token_ids, seq.token_ids
        while agree < min(len(mine), len(theirs)) and mine[agree] == theirs[agree]:
            agree += 1
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, agree)
        del mine[base:]
        mine.extend(theirs[base:])
        return shadow

    @staticmethod
    def _pick(shadow: Sequence, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        if shadow.sampling.greedy:
            return int(logits.argmax()), None
        q = torch.softmax(filter_logits(logits, shadow.sampling), dim=-1)
        return int(torch.multinomial(q, 1, generator=shadow.generator)), q

    def release(self, request_id: str) -> None:
        shadow = self.shadows.pop(request_id, None)
        self._base.pop(request_id, None)
        if shadow is not None:
            self.kv.free(shadow)
