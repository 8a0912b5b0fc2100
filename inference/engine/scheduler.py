"""Continuous batching: which sequences run in the next step, and how many tokens each.

Each step packs, under a token budget and a sequence cap:
  1. every running sequence that is decoding (one token each, plus its speculative
     guesses when it has any: the step computes them too and the engine keeps what the
     model agrees with), oldest first;
  2. prefill chunks: running sequences still prefilling and waiting sequences that have a
     seat, shortest remaining prompt first (what is left to compute: a waiting prompt's
     part past its cached prefix, so a conversation's next turn counts its new tokens),
     so a short request arriving under load gets its whole prompt into the very next step;
     a preempted sequence goes first.
A waiting prompt whose next full blocks a chunk of this step computes (the same system
prompt, document or question, arriving in a burst) waits a step if they are at least half
of what it would compute: the next step finds them in the prefix index (SGLang's in-batch
prefix caching). While any sequence decodes, prefill chunks are capped further
(`max_prefill_tokens_during_decode`, or 4 tokens per decoding stream if that is more); a
prompt too long for that allowance is sliced at half of it, and not at all in a step that
already carries a whole short prompt, so a long prompt never stretches the running streams'
inter-token gap much. A waiting sequence is admitted only if its whole prompt fits beside
room for every running one's next tokens (no preemption halfway through its prompt).
A waiting sequence whose prefix is being looked up in the Redis tier waits for that lookup
(only it: the others carry on); at admission, the blocks found there beyond the memory hit
are allocated, entered in the prefix index, and handed to the engine to copy into the pool.
When the block pool runs dry the newest running sequence is preempted: its blocks are freed
and it goes back to the head of the queue to be recomputed later (its full blocks usually
survive in the prefix index, so the recompute is mostly a cache hit).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from inference.engine.config import EngineConfig
from inference.engine.kv_cache import KVCacheManager
from inference.engine.sequence import Sequence, SequenceStatus

# Room kept for each running sequence when a waiting one is admitted: its next tokens.
GROWTH_TOKENS = 32


@dataclass
class RestoreCopy:
    """Blocks admitted with KV restored from the Redis tier: copy `kv` into them."""

    block_ids: list[int]
    kv: list[torch.Tensor]  # per layer [2 * kv_heads, len(block_ids), block_size, head_dim]
    lookup_seconds: float


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    # Tokens each sequence computes this step (1 for a decode, or 1 + its guesses; a
    # chunk for a prefill).
    num_tokens: list[int] = field(default_factory=list)
    # Restored blocks to fill before the forward (they are already in the prefix index).
    restores: list[RestoreCopy] = field(default_factory=list)
    # The first num_decodes sequences decode (with their speculative guesses, if any).
    num_decodes: int = 0

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

    @property
    def lookups_pending(self) -> bool:
        return any(s.kv_lookup_pending for s in self.waiting)

    def waiting_tokens(self) -> int:
        return sum(len(s) for s in self.waiting)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        preemptions_before = self.num_preemptions

        for seq in [s for s in self.running if s.num_uncomputed_tokens == 1]:
            if seq.status != SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            if budget <= 0:
                seq.clear_draft()  # not this step: its guesses would go stale
                continue
            # A decode carrying speculative guesses computes them too: 1 + len(guesses);
            # guesses are dropped rather than let them cost a preemption or the budget.
            n = 1 + len(seq.draft_tokens)
            if n > 1 and (
                n > budget
                or self.kv.blocks_needed(seq, seq.num_computed_tokens + n) > self.kv.num_free_blocks
            ):
                seq.clear_draft()
                n = 1
            if not self._allocate_or_preempt(seq, n, batch):
                continue
            batch.seqs.append(seq)
            batch.num_tokens.append(n)
            batch.num_decodes += 1
            budget = self.config.max_num_batched_tokens - batch.total_tokens

        # Prefill chunks: running prefills and the waiting requests that have a seat compete
        # for what is left, shortest remaining prompt first. A short request arriving while
        # a long prompt is prefilled so gets its whole prompt into the very next step (low
        # TTFT under load), and the long prompt takes the rest of the allowance every step.
        seats = self.config.max_num_seqs - len(self.running)
        candidates: list[tuple[int, int, Sequence, int]] = [
            (s.num_uncomputed_tokens, 0, s, 0) for s in self.running if s.num_uncomputed_tokens > 1
        ]
        if seats > 0:
            ready = (s for s in self.waiting if not s.kv_lookup_pending)
            for i, seq in enumerate(itertools.islice(ready, seats)):
                cached = self._prefix_tokens(seq)
                # Preempted sequences (back at the head of the queue) keep their turn.
                key = 0 if seq.figures.preemptions else len(seq) - cached
                candidates.append((key, 1 + i, seq, cached))
        candidates.sort(key=lambda c: (c[0], c[1]))
        whole_prompts = 0
        # Chain hashes of the full blocks this step's chunks complete so far.
        computing: set[int] = set()
        for _, order, seq, cached in candidates:
            cap = self._prefill_cap(batch, budget)
            if cap <= 0:
                break
            if order and computing and self._shares_this_step(seq, cached, computing):
                continue
            # What it computes: a waiting sequence's prompt beyond its cached prefix (a
            # follow-up turn's history is mostly cached: counted whole, every follow-up
            # of a long conversation was taken for a long prompt and waited behind any
            # short one, seconds at 64 chats: python -m inference.bench.chat_engine).
            todo = seq.num_uncomputed_tokens if order == 0 else len(seq) - cached
            if todo > cap and batch.num_decodes:
                # A prompt that does not fit goes in thinner slices beside the decodes, so
                # the running streams' inter-token gap stays within ~2x a plain step; and
                # not at all in a step that already carries a whole short prompt (strict
                # shortest-first: that request's first token comes after one short step).
                if whole_prompts:
                    break
                cap = max(1, cap // 2)
            if order == 0:  # running, mid-prefill
                if seq.status != SequenceStatus.RUNNING:
                    continue
                n = min(seq.num_uncomputed_tokens, cap)
                if not self._allocate_or_preempt(seq, n, batch):
                    continue
            else:
                # Admitting right after a preemption would only thrash the pool.
                if self.num_preemptions > preemptions_before:
                    continue
                if len(self.running) >= self.config.max_num_seqs:
                    continue
                n = self._admit(seq, cap, batch)
                if n == 0:
                    continue
            batch.seqs.append(seq)
            batch.num_tokens.append(n)
            budget = self.config.max_num_batched_tokens - batch.total_tokens
            whole_prompts += n == seq.num_uncomputed_tokens
            if self.kv.enable_prefix_caching:
                computing.update(self.kv.block_hashes_ahead(seq, seq.num_computed_tokens + n))
        return batch

    def _shares_this_step(self, seq: Sequence, cached: int, computing: set[int]) -> bool:
        """Whether a waiting sequence should wait a step for blocks of its prompt that a
        chunk of this step computes: at least a block, and at least half of what it would
        compute now. Next step it finds them in the prefix index instead of computing the
        same tokens a second time beside them (a burst of prompts that share a system
        prompt or a document, or the same question)."""
        if seq.kv_restore is not None:
            return False  # its blocks come from the Redis tier
        bs = self.kv.block_size
        shared = 0
        # Hashed one by one, up to the first block this step does not compute: a long
        # prompt sharing nothing costs no more than its cache lookup did.
        hashes = self.kv.block_hashes_ahead(seq, len(seq) - 1)
        for h in itertools.islice(hashes, cached // bs, None):
            if h not in computing:
                break
            shared += bs
        return shared > 0 and 2 * shared >= len(seq) - cached

    def _allocate_or_preempt(self, seq: Sequence, n: int, batch: ScheduledBatch) -> bool:
        """Blocks for n more tokens of a running sequence, preempting the newest running
        sequences (possibly this one) until they fit. False if `seq` itself was preempted."""
        while not self.kv.allocate(seq, seq.num_computed_tokens + n):
            victim = self.running[-1]
            self._preempt(victim, batch)
            if victim is seq:
                return False
        return True

    def _prefix_tokens(self, seq: Sequence) -> int:
        """Prompt tokens admission would not compute: the memory hit, or the Redis one."""
        cached = self.kv.peek_prefix(seq)
        r = seq.kv_restore
        if r is not None and cached >= r.first_block * self.kv.block_size:
            cached = max(cached, (r.first_block + r.num_blocks) * self.kv.block_size)
        return cached

    def _restorable(
        self, seq: Sequence, cached: int
    ) -> tuple[list[torch.Tensor], int, float] | None:
        """The Redis tier's blocks that continue the memory hit: (their KV, count, seconds)."""
        r = seq.kv_restore
        have = cached // self.kv.block_size
        if r is None or not r.first_block <= have < r.first_block + r.num_blocks:
            return None
        skip = have - r.first_block
        return [t[:, skip:] for t in r.kv], r.num_blocks - skip, r.seconds

    def _admit(self, seq: Sequence, cap: int, batch: ScheduledBatch) -> int:
        """Move a waiting sequence to running with its first chunk; 0 if it does not fit.

        Keeps a block in reserve for every running sequence, so that admitting does not
        force a preemption at the next decode step (that would only thrash the pool)."""
        first_time = seq.figures.scheduled_time is None
        # A Redis restore continues at a block boundary: no partial tail before it.
        cached = self.kv.match_prefix(seq, tails=seq.kv_restore is None)
        restore = self._restorable(seq, cached)
        restored = restore[1] * self.kv.block_size if restore else 0
        seq.num_computed_tokens = cached + restored
        n = min(seq.num_uncomputed_tokens, cap)
        # Admitted only if its whole prompt fits beside the running sequences' next
        # GROWTH_TOKENS each: admitting on its first chunk alone, a long prompt ran the pool
        # dry chunks later, and every preemption threw away a history that then had to be
        # computed again (64 chats on a pool of 1456 blocks: on the first chunk, 61
        # preemptions and 3.6x an unbounded pool's prompt rows; on the whole prompt, none
        # and 1.7x: python -m inference.bench.scheduler_sim).
        reserve = sum(
            max(1, self.kv.blocks_needed(s, len(s) + GROWTH_TOKENS)) for s in self.running
        )
        needed = self.kv.blocks_needed(seq, len(seq))
        if needed + reserve > self.kv.num_free_blocks or not self.kv.allocate(
            seq, seq.num_computed_tokens + n
        ):
            self.kv.free(seq)
            seq.num_computed_tokens = 0
            return 0
        if restore:
            kv, count, seconds = restore
            first = cached // self.kv.block_size
            block_ids = seq.block_table[first : first + count]
            self.kv.commit_full_blocks(seq)
            self.kv.mark_persisted(block_ids, seq.block_digests[first : first + count])
            batch.restores.append(RestoreCopy(block_ids, kv, seconds))
        seq.kv_restore = None
        self.waiting.remove(seq)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        if first_time:
            seq.figures.scheduled_time = time.time()
            seq.figures.cached_tokens = cached
            seq.figures.cached_tokens_redis = restored
        return n

    def _prefill_cap(self, batch: ScheduledBatch, budget: int) -> int:
        """Tokens a prefill chunk may take now: the budget, capped further if others decode."""
        decodes = batch.num_decodes
        if decodes and self.config.max_prefill_tokens_during_decode > 0:
            # A step of many decodes is already long, so it can carry more prefill for the
            # same relative slowdown: the cap grows with the decodes (4 tokens each).
            cap = max(self.config.max_prefill_tokens_during_decode, 4 * decodes)
            decode_tokens = sum(batch.num_tokens[:decodes])
            budget = min(budget, cap - (batch.total_tokens - decode_tokens))
        return budget

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        if seq in batch.seqs:
            i = batch.seqs.index(seq)
            del batch.seqs[i]
            del batch.num_tokens[i]
            batch.num_decodes -= i < batch.num_decodes
        seq.clear_draft()
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.figures.preemptions += 1
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
