"""Continuous batching: which sequences run in the next step, and how many tokens each.

Each step packs, under a token budget and a sequence cap:
  1. every running sequence that is decoding (one token each), oldest first;
  2. running sequences still prefilling, a chunk each (chunked prefill);
  3. waiting sequences, admitted in arrival order while budget, seats and blocks allow.
While any sequence decodes, prefill chunks are capped further (`max_prefill_tokens_during_decode`,
or 4 tokens per decoding stream if that is more) so a long prompt never stalls the running
streams for long: their inter-token gap stays within a small multiple of a plain decode step.
When the block pool runs dry the newest running sequence is preempted: its blocks are freed
and it goes back to the head of the queue to be recomputed later (its full blocks usually
survive in the prefix index, so the recompute is mostly a cache hit).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from inference.engine.config import EngineConfig
from inference.engine.kv_cache import KVCacheManager
from inference.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    # Tokens each sequence computes this step (1 for a decode, a chunk for a prefill).
    num_tokens: list[int] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def waiting_tokens(self) -> int:
        return sum(len(s) for s in self.waiting)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        decoding = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefilling = [s for s in self.running if s.num_uncomputed_tokens > 1]
        preempted = False

        for seq in decoding + prefilling:
            if seq.status != SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            if budget <= 0:
                break
            n = min(seq.num_uncomputed_tokens, self._prefill_cap(batch, budget))
            if n <= 0:
                break
            while not self.kv.allocate(seq, seq.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim, batch)
                preempted = True
                budget = self.config.max_num_batched_tokens - batch.total_tokens
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                continue
            batch.seqs.append(seq)
            batch.num_tokens.append(n)
            budget -= n

        # Admitting right after a preemption would only thrash the pool.
        while not preempted and self.waiting and len(self.running) < self.config.max_num_seqs:
            cap = self._prefill_cap(batch, budget)
            if cap <= 0:
                break
            seq = self.waiting[0]
            first_time = seq.metrics.scheduled_time is None
            cached = self.kv.match_prefix(seq)
            n = min(seq.num_uncomputed_tokens, cap)
            if not self.kv.allocate(seq, seq.num_computed_tokens + n):
                self.kv.free(seq)
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            if first_time:
                seq.metrics.scheduled_time = time.time()
                seq.metrics.cached_tokens = cached
            batch.seqs.append(seq)
            batch.num_tokens.append(n)
            budget -= n
        return batch

    def _prefill_cap(self, batch: ScheduledBatch, budget: int) -> int:
        """Tokens a prefill chunk may take now: the budget, capped further if others decode."""
        decodes = sum(1 for n in batch.num_tokens if n == 1)
        if decodes and self.config.max_prefill_tokens_during_decode > 0:
            # A step of many decodes is already long, so it can carry more prefill for the
            # same relative slowdown: the cap grows with the decodes (4 tokens each).
            cap = max(self.config.max_prefill_tokens_during_decode, 4 * decodes)
            budget = min(budget, cap - (batch.total_tokens - decodes))
        return budget

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        if seq in batch.seqs:
            i = batch.seqs.index(seq)
            del batch.seqs[i]
            del batch.num_tokens[i]
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.metrics.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Take a finished (or aborted) sequence out of the queues and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
