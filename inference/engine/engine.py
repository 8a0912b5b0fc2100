"""The step loop: requests in, one batched model step at a time, text deltas out.

Not thread-safe by itself except for `add_request` and `abort_request`, which only touch an
inbox under a lock; `step()` is meant to be called from one thread (see async_engine.py).

With the Redis tier on (kv_tier/), the step thread also starts a lookup for each new
prompt whose prefix memory does not hold, copies found blocks into the pool at admission,
and hands finished requests' new blocks (and blocks about to be evicted) to the tier's
writer as snapshots; the network work happens on the tier's threads. While more than
WRITE_BACK_BUSY_SEQS requests are in, a finished request's blocks wait in memory instead
(`_deferred`) and are written when the engine is that quiet again, when they are about to
be evicted, or at close: the copies and the writer thread cost a loaded step loop time.

With speculation on (speculative.py), each step first gives the decoding sequences their
guesses; the step computes them with the last token, and a checked sequence emits the
guesses the model agrees with plus the model's own next token, in one delta.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from transformers import GenerationConfig

from inference.engine.config import EngineConfig
from inference.engine.detokenizer import IncrementalDetokenizer, decoder_of
from inference.engine.errors import EngineBusyError, InvalidRequestError, PromptTooLongError
from inference.engine.fingerprint import model_fingerprint
from inference.engine.kv_cache import Block, CacheScope, KVCacheManager
from inference.engine.kv_codec import row_width
from inference.engine.kv_tier import (
    DISABLED_STATS,
    LAYOUT_VERSION,
    BlockEntry,
    BlockLayout,
    RestoredPrefix,
    start_tier,
)
from inference.engine.layers.linear import HYBRID_MAX_ROWS
from inference.engine.model_runner import ModelRunner, dtype_name
from inference.engine.models import check_model
from inference.engine.models.loader import load_tokenizer
from inference.engine.outputs import Delta
from inference.engine.sampler import Sampler
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import ScheduledBatch, Scheduler
from inference.engine.sequence import Sequence
from inference.engine.speculative import DISABLED_STATS as SPEC_DISABLED_STATS
from inference.engine.speculative import Speculator
from inference.engine.structured import GrammarMasks, StructuredOutputs

if TYPE_CHECKING:  # redis: loaded by start_tier when the tier is on
    from inference.engine.kv_tier.tier import KVTier

log = logging.getLogger(__name__)

# How long a step waits for the Redis tier lookups of requests that just arrived.
LOOKUP_GRACE_S = 0.005
# Up to this many requests in (running or waiting), a finished request's new blocks go to
# the Redis tier at once; beyond it they wait for a quieter step, their eviction or close.
# At 64 users, writing each at once cost 7% of the tok/s and put TTFT p90 1.23x up against
# writing none (docs/kv-tier.md; `python -m inference.bench.vs_llama --concurrency 64
# --workload chat`).
WRITE_BACK_BUSY_SEQS = 4
# Blocks a quiet step hands the writer at most (~47 MB of the bundled model's K/V).
WRITE_BACK_CHUNK = 64

# Upper bounds of the tokens-per-step histogram (vLLM's iteration_tokens_total); the last
# bucket takes everything above the one before it.
STEP_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 1 << 62)
# A step's kind: decodes only (with their guesses, if any), decodes beside prompt chunks,
# prompt chunks only.
STEP_KINDS = ("decode", "mixed", "prompt")


def step_kind(batch: ScheduledBatch) -> str:
    """Which of STEP_KINDS a scheduled batch is."""
    if batch.num_decodes == len(batch.seqs):
        return "decode"
    return "mixed" if batch.num_decodes else "prompt"


def eos_ids_of(folder: str, tokenizer: object) -> list[int]:
    ids: set[int] = set()
    if os.path.isfile(os.path.join(folder, "generation_config.json")):
        eos = GenerationConfig.from_pretrained(folder).eos_token_id
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.add(tok_eos)
    return sorted(ids)


def _text_job(detok: IncrementalDetokenizer, token: int | None, final: bool) -> Callable[[], str]:
    """The text _on_token would have put into the delta: the token's (none for a stop
    token), then, as the request ends, whatever was held back."""

    def job() -> str:
        text = detok.add_token(token) if token is not None else ""
        if final and not detok.stopped:
            text += detok.flush()
        return text

    return job


def _joined(a: Callable[[], str] | None, b: Callable[[], str] | None) -> Callable[[], str] | None:
    if a is None or b is None:
        return a or b
    return lambda: a() + b()


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        if not config.model:
            raise ValueError("EngineConfig.model must name a Hugging Face model folder")
        torch.set_num_threads(config.cpu_threads())
        torch.manual_seed(config.seed)
        self.config = config
        # A model the engine cannot serve is refused by name before anything is loaded.
        check_model(config.model)
        self.tokenizer = load_tokenizer(config.model)
        self.eos_token_ids = eos_ids_of(config.model, self.tokenizer)
        self._decode = decoder_of(self.tokenizer)
        # True: a delta of a request without stop strings leaves step() with its text still
        # to decode (Delta.text_job), for the consumer to run off the step's path (the
        # async front does). Its text is the same either way; a request with stop strings
        # needs its text to know when it ends, so it is always decoded in the step.
        self.defer_text = False
        self.runner = ModelRunner(config, max_model_len=config.max_model_len or None)
        # One sequence must always fit the whole pool, or preemption could never make room.
        self.max_model_len = min(self.runner.model_len, self.runner.num_blocks * config.block_size)
        self.kv = KVCacheManager(
            self.runner.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(config, self.kv)
        # Under tensor parallelism each rank holds a shard of the pool; the tier reads and
        # writes rank 0's pool only, so it stays off there.
        use_tier = bool(config.kv_tier_url) and config.tensor_parallel_size == 1
        if config.kv_tier_url and not use_tier:
            log.warning("the Redis KV tier is off: it does not support tensor_parallel_size > 1")
        self.kv_tier = self._start_kv_tier() if use_tier else None
        self._tier_epoch = 0
        self._evicted: list[tuple[int, BlockEntry]] = []  # blocks taken this step, unsaved
        # Finished requests' blocks not written yet, by block id (WRITE_BACK_BUSY_SEQS).
        self._deferred: dict[int, BlockEntry] = {}
        self.sampler = Sampler()
        # Structured outputs' grammars (structured.py): made on the first such request.
        self.structured: StructuredOutputs | None = None
        self._structured_lock = threading.Lock()
        self.step_tokens_counts = [0] * len(STEP_TOKEN_BUCKETS)
        self.step_tokens_sum = 0
        # Step time by kind (step_kind): where a chat workload's time goes.
        self.step_seconds = dict.fromkeys(STEP_KINDS, 0.0)
        self.speculator = self._speculator(config)
        self.seqs: dict[str, Sequence] = {}  # live requests, by id
        self._lock = threading.Lock()
        self._inbox: list[Sequence] = []
        self._aborts: list[str] = []
        self._waiting_reqs = 0  # inbox + waiting queue, as of the last step
        self._waiting_tokens = 0
        self.last_step: dict[str, float | int] = {"batch_size": 0, "tokens": 0, "seconds": 0.0}
        self.totals = {
            "requests": 0,
            "finished": 0,
            "refused": 0,
            "prompt_tokens": 0,
            "output_tokens": 0,
            "steps": 0,
            "step_errors": 0,
        }

    # -- requests in ------------------------------------------------------------------

    def _speculator(self, config: EngineConfig) -> Speculator | None:
        if not config.speculative_mode:
            return None
        native = getattr(self.runner.model, "native", None)
        # Guess rows are nearly free only while reading the weights dominates a step: the
        # first few rows of the native path (HYBRID_MAX_ROWS), however many rows it takes.
        budget = min(native.max_rows, HYBRID_MAX_ROWS) if native is not None else None
        pool_tokens = self.runner.num_blocks * config.block_size
        return Speculator(
            config, self.max_model_len, self.runner.model.vocab_size, budget, pool_tokens
        )

    def reconfigure(self, config: EngineConfig) -> None:
        """Take another config's batching limits and speculation, starting cold (a fresh
        scheduler and speculator, an empty memory prefix cache): what an idle engine can
        change without reloading its model or KV pool (the tuning job's trials)."""
        if self.has_work():
            raise RuntimeError("the engine must be idle to change its configuration")
        self.config = config
        self.scheduler = Scheduler(config, self.kv)
        self.speculator = self._speculator(config)
        self.kv.reset_prefix_cache()

    def add_request(
        self,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        request_id: str | None = None,
        session_id: str | None = None,
        cache_salt: str | None = None,
        shared_prefix_tokens: int = 0,
    ) -> str:
        """Queue a request; raise at once if it is invalid, too long, or the queue is full.

        With a `cache_salt` (vLLM's name), the request's KV blocks are found only by requests
        with the same salt, in memory and in the Redis tier, except its first
        `shared_prefix_tokens` tokens' whole blocks, which stay shared (public text)."""
        sampling.validate()
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise InvalidRequestError("cache_salt must be a non-empty string")
        if isinstance(shared_prefix_tokens, bool) or not isinstance(shared_prefix_tokens, int):
            raise InvalidRequestError("shared_prefix_tokens must be an integer")
        request_id = request_id or uuid.uuid4().hex
        n = len(prompt_token_ids)
        if n == 0:
            raise InvalidRequestError("the prompt is empty")
        vocab = self.runner.model.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in prompt_token_ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})")
        if n >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {n} tokens; this engine takes fewer than {self.max_model_len}"
            )
        # A seeded request's rows are batch-invariant where the runner computes such rows:
        # the same text cold, from the prefix cache, alone or in a busy batch.
        invariant = sampling.seed is not None and self.runner.invariant_rows
        scope = CacheScope(
            cache_salt, max(0, shared_prefix_tokens) // self.config.block_size, invariant
        )
        seq = Sequence(request_id, prompt_token_ids, sampling, session_id, cache_scope=scope)
        seq.max_tokens = min(sampling.max_tokens, self.max_model_len - n)
        seq.stop_token_ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            seq.stop_token_ids.update(self.eos_token_ids)
        seq.detokenizer = IncrementalDetokenizer(
            self.tokenizer, prompt_token_ids, sampling.stop, self._decode
        )
        if sampling.structured is not None:
            seq.grammar = self._grammars().start(sampling.structured, sampling.structured_spec)
            given = sampling.structured_given
            if given > n or not all(seq.grammar.accept(t) for t in prompt_token_ids[n - given :]):
                raise InvalidRequestError("the output so far does not follow its grammar")
        with self._lock:
            if request_id in self.seqs:
                raise InvalidRequestError(f"request id {request_id!r} is already running")
            if (
                self._waiting_reqs + 1 > self.config.max_waiting_requests
                or self._waiting_tokens + n > self.config.max_waiting_tokens
            ):
                self.totals["refused"] += 1
                raise EngineBusyError("the engine is busy: too many requests waiting, try again")
            self._waiting_reqs += 1
            self._waiting_tokens += n
            self.seqs[request_id] = seq
            self._inbox.append(seq)
            self.totals["requests"] += 1
        return request_id

    def abort_request(self, request_id: str) -> None:
        """Ask the next step to drop this request (thread-safe)."""
        with self._lock:
            self._aborts.append(request_id)

    def has_work(self) -> bool:
        return bool(self._inbox or self._aborts or self.scheduler.has_work or self._deferred)

    def close(self, flush_timeout: float = 5.0) -> None:
        """Finish queued write-backs to the Redis tier (at most flush_timeout s) and stop it;
        stop the tensor-parallel ranks. Call only once no step runs any more."""
        if self.kv_tier is not None:
            deadline = time.monotonic() + flush_timeout
            while self._deferred and time.monotonic() < deadline:
                self._save_deferred(self.kv_tier)
            self.kv_tier.close(max(0.0, deadline - time.monotonic()))
        self.runner.model.close()

    # -- one step ---------------------------------------------------------------------

    def step(self) -> list[Delta]:
        tier = self.kv_tier
        if tier is not None:
            tier.lookup_done.clear()  # before the scheduler looks at pending lookups
            self._sync_tier_epoch(tier)
        deltas = self._drain_inbox()
        if tier is not None:
            self._await_new_lookups(tier)
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        batch = self.scheduler.schedule()
        if tier is not None:
            self._save_evicted(tier)
            self._apply_restores(tier, batch)
            if not batch.seqs and self.scheduler.lookups_pending:
                tier.wait_for_lookups(0.05)  # nothing to run until a lookup answers
            if self._deferred and not self._busy():
                self._save_deferred(tier)
        if batch.seqs:
            guessed = any(s.draft_tokens for s in batch.seqs[: batch.num_decodes])
            start = time.perf_counter()
            try:
                self._run(batch, deltas)
            except Exception as exc:
                deltas.extend(self._fail(batch, exc))
            if self.speculator is not None:
                self.speculator.record_step(time.perf_counter() - start, guessed)
            self.last_step = {
                "batch_size": len(batch),
                "tokens": batch.total_tokens,
                "seconds": time.perf_counter() - start,
            }
            self.step_seconds[step_kind(batch)] += self.last_step["seconds"]
            self.totals["steps"] += 1
            # Tokens per step, as vLLM's iteration_tokens histogram counts them.
            i = bisect.bisect_left(STEP_TOKEN_BUCKETS, batch.total_tokens)
            self.step_tokens_counts[min(i, len(STEP_TOKEN_BUCKETS) - 1)] += 1
            self.step_tokens_sum += batch.total_tokens
        with self._lock:
            self._waiting_reqs = len(self._inbox) + len(self.scheduler.waiting)
            self._waiting_tokens = sum(len(s) for s in self._inbox) + sum(
                len(s) for s in self.scheduler.waiting
            )
        return deltas

    def _drain_inbox(self) -> list[Delta]:
        with self._lock:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
        for seq in inbox:
            if self.kv_tier is not None:
                self._start_lookup(self.kv_tier, seq)
            self.scheduler.add(seq)
        deltas = []
        for request_id in aborts:
            aborted = self.seqs.get(request_id)
            if aborted is not None and not aborted.is_finished:
                deltas.append(self._finish(aborted, "abort"))
        return deltas

    def prepare_structured(self, sampling: SamplingParams) -> None:
        """Compile a structured request's grammar ahead of add_request, on any thread
        (xgrammar lets go of the GIL while it compiles): the async front runs it on a
        worker thread, so a compile of a second never stalls the loop that streams every
        other request's deltas. Raises InvalidRequestError as add_request would."""
        if sampling.structured is not None:
            self._grammars().compiled(sampling.structured, sampling.structured_spec)

    def _grammars(self) -> StructuredOutputs:
        # Locked: the first structured requests may arrive on several threads at once,
        # and reading the vocabulary into xgrammar takes a while (about half a second).
        with self._structured_lock:
            if self.structured is None:
                vocab = self.runner.model.vocab_size
                self.structured = StructuredOutputs(self.tokenizer, vocab, self.eos_token_ids)
            return self.structured

    def _start_masks(self, batch: ScheduledBatch) -> GrammarMasks | None:
        """Structured requests' grammar masks, filled on their own thread while the model
        runs: those of the sequences that sample a token in this step."""
        seqs = [
            seq
            for seq, n in zip(batch.seqs, batch.num_tokens, strict=True)
            if seq.grammar is not None and seq.num_computed_tokens + n >= len(seq)
        ]
        return self._grammars().fill_async(seqs) if seqs else None

    def _run(self, batch: ScheduledBatch, deltas: list[Delta]) -> None:
        """Model, sampler, detokenizer. Deltas go into `deltas` one by one, so that if a later
        request fails, the ones already finished still reach their streams."""
        masks = self._start_masks(batch) if self.structured is not None else None
        sampling_seqs, logits = self.runner.run(batch)
        # Sequences that carried speculative guesses got 1 + len(guesses) rows each.
        plain: list[Sequence] = []
        plain_rows: list[int] = []
        checks: list[tuple[Sequence, torch.Tensor]] = []
        row = 0
        for seq in sampling_seqs:
            k = len(seq.draft_tokens)
            if k:
                checks.append((seq, logits[row : row + k + 1]))
            else:
                plain.append(seq)
                plain_rows.append(row)
            row += k + 1
        if checks:
            logits = logits[plain_rows]
        tokens = self.sampler(plain, logits, masks) if plain else []
        for seq, n in zip(batch.seqs, batch.num_tokens, strict=True):
            if not seq.draft_tokens:  # a checked sequence advances by what it keeps
                seq.num_computed_tokens += n
                self.kv.commit_full_blocks(seq)
        now = time.time()
        for seq, token in zip(plain, tokens, strict=True):
            delta = self._on_token(seq, token, now)
            if seq.last_logprob is not None:
                delta.logprobs, seq.last_logprob = [seq.last_logprob], None
            deltas.append(delta)
        if checks:
            speculator = self.speculator
            assert speculator is not None  # only a speculator puts guesses into a batch
            speculator.steps += 1
            for seq, seq_logits in checks:
                emitted = speculator.verify(seq, seq_logits)
                deltas.append(self._on_tokens(seq, emitted, now))

    def _on_tokens(self, seq: Sequence, tokens: list[int], now: float) -> Delta:
        """Emit a checked sequence's tokens one by one (a stop or max_tokens ends it there;
        the rest are dropped), as one delta. Its KV holds the last token and the kept guesses:
        the rejected guesses' slots are simply written over by later steps (the rollback)."""
        merged: Delta | None = None
        for token in tokens:
            # The token before this one now has its KV in the cache.
            seq.num_computed_tokens += 1
            self.kv.commit_full_blocks(seq)
            delta = self._on_token(seq, token, now)
            if merged is None:
                merged = delta
            else:
                merged.text += delta.text
                merged.text_job = _joined(merged.text_job, delta.text_job)
                merged.token_ids += delta.token_ids
                merged.finished, merged.finish_reason = delta.finished, delta.finish_reason
                merged.figures = delta.figures
            if seq.is_finished:
                break
        assert merged is not None
        return merged

    def _on_token(self, seq: Sequence, token: int, now: float) -> Delta:
        seq.append_token(token)
        m = seq.figures
        if m.first_token_time is None:
            m.first_token_time = now
        m.token_times.append(now)
        m.output_tokens = seq.num_output_tokens
        detok = seq.detokenizer
        assert detok is not None  # set when the request was added
        if self.defer_text and not detok.stop:
            return self._on_token_deferred(seq, token, detok)
        reason = None
        text = ""
        if token in seq.stop_token_ids:
            reason = "stop"
        else:
            text = detok.add_token(token)
            if detok.stopped:
                reason = "stop"
        if reason is None and seq.num_output_tokens >= seq.max_tokens:
            reason = "length"
        if reason is None:
            return Delta(seq.request_id, text=text, token_ids=[token])
        if not detok.stopped:
            text += detok.flush()
        delta = self._finish(seq, reason)
        delta.text = text
        delta.token_ids = [token]
        return delta

    def _on_token_deferred(self, seq: Sequence, token: int, detok: IncrementalDetokenizer) -> Delta:
        """_on_token's outcome for a request without stop strings, whose text decides
        nothing: the same delta, its text decoded later by Delta.resolve_text."""
        stop = token in seq.stop_token_ids
        reason = "stop" if stop else None
        if reason is None and seq.num_output_tokens >= seq.max_tokens:
            reason = "length"
        job = _text_job(detok, None if stop else token, reason is not None)
        if reason is None:
            return Delta(seq.request_id, token_ids=[token], text_job=job)
        delta = self._finish(seq, reason)
        delta.token_ids = [token]
        delta.text_job = job
        return delta

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> Delta:
        if self.kv_tier is not None and reason != "error":
            self._write_back(self.kv_tier, seq)
        self.scheduler.finish(seq)
        if self.speculator is not None:
            self.speculator.release(seq)
        seq.finish_reason = reason
        seq.error = error
        seq.figures.finish_time = time.time()
        seq.figures.output_tokens = seq.num_output_tokens
        self.seqs.pop(seq.request_id, None)
        self.totals["finished"] += 1
        self.totals["prompt_tokens"] += seq.num_prompt_tokens
        self.totals["output_tokens"] += seq.num_output_tokens
        return Delta(
            seq.request_id,
            finished=True,
            finish_reason=reason,
            error=error,
            figures=seq.figures,
        )

    def _fail(self, batch: ScheduledBatch, exc: Exception) -> list[Delta]:
        """A step blew up: end its requests with an error; everyone else carries on."""
        self.totals["step_errors"] += 1
        log.error("engine step failed: %s", "".join(traceback.format_exception(exc)))
        message = f"{type(exc).__name__}: {exc}"
        return [self._finish(s, "error", message) for s in batch.seqs if not s.is_finished]

    # -- the Redis tier ---------------------------------------------------------------

    def _start_kv_tier(self) -> KVTier:
        m, runner, c = self.runner.model, self.runner, self.config
        layout = BlockLayout(
            m.num_layers,
            m.num_kv_heads,
            c.block_size,
            row_width(m.head_dim, runner.kv_dtype),
            runner.kv_dtype,
        )
        fingerprint = model_fingerprint(
            c.model,
            dtype=dtype_name(runner.dtype),
            # The blocks' bytes are the pool's: another element type is another layout.
            kv_dtype=dtype_name(runner.kv_dtype),
            quantization=runner.quantization,
            device=runner.device.type,
            block_size=c.block_size,
            layers=m.num_layers,
            kv_heads=m.num_kv_heads,
            head_dim=m.head_dim,
            layout=LAYOUT_VERSION,
        )
        self.kv.on_evict = self._on_evict
        return start_tier(
            c.kv_tier_url,
            fingerprint=fingerprint,
            layout=layout,
            namespace=c.kv_tier_namespace,
            ttl_s=c.kv_tier_ttl_s,
            max_mb=c.kv_tier_max_mb,
            compression=c.kv_tier_compression,
        )

    def _await_new_lookups(self, tier: KVTier) -> None:
        """Give lookups just started a moment to answer (a miss takes well under a
        millisecond) so their requests are scheduled in this step, not the next: admitting
        every new request a step late cost running streams ~10% of their decode rate in
        the write-back benchmark. Bounded, so a slow Redis never holds a step long."""
        deadline = time.perf_counter() + LOOKUP_GRACE_S
        while self.scheduler.lookups_pending and time.perf_counter() < deadline:
            tier.lookup_done.wait(0.001)
            tier.lookup_done.clear()

    def _sync_tier_epoch(self, tier: KVTier) -> None:
        # Redis came back after an outage: it may have lost anything, so write again.
        if tier.epoch != self._tier_epoch:
            self._tier_epoch = tier.epoch
            for block in self.kv.blocks:
                block.persisted = False

    def _start_lookup(self, tier: KVTier, seq: Sequence) -> None:
        """Ask the tier for the prompt's full blocks past the memory hit (not the last token:
        its logits pick the next token). The scheduler holds the sequence until it answers."""
        if not tier.available or not self.kv.enable_prefix_caching:
            return
        bs = self.kv.block_size
        wanted = min((len(seq) - 1) // bs, self.kv.num_blocks // 2)
        first = self.kv.peek_prefix(seq) // bs
        if wanted <= first:
            return

        def done(restored: RestoredPrefix | None) -> None:
            seq.kv_restore = restored
            seq.kv_lookup_pending = False

        seq.kv_lookup_pending = True
        tier.lookup(seq.token_ids[: wanted * bs], first, done, seq.cache_scope)

    def _apply_restores(self, tier: KVTier, batch: ScheduledBatch) -> None:
        for r in batch.restores:
            start = time.perf_counter()
            self.runner.write_blocks(r.block_ids, r.kv)
            seconds = r.lookup_seconds + time.perf_counter() - start
            tier.record_restore(len(r.block_ids) * self.kv.block_size, seconds)

    def _busy(self) -> bool:
        return len(self.scheduler.running) + len(self.scheduler.waiting) > WRITE_BACK_BUSY_SEQS

    def _write_back(self, tier: KVTier, seq: Sequence) -> None:
        """Queue the finished sequence's full blocks the tier lacks (or, while the engine
        is busy, keep them for later: `_deferred`); refresh the others."""
        if not tier.available:
            return
        entries: list[BlockEntry] = []
        ids: list[int] = []
        touches: list[bytes] = []
        for block_id, digest in zip(seq.block_table, seq.block_digests, strict=False):
            block = self.kv.blocks[block_id]
            if block.digest == digest:  # else a private twin: the indexed copy is saved
                if block.persisted:
                    touches.append(digest)
                else:
                    # The parent as indexed: the salted link for a scope's first salted block.
                    entries.append(BlockEntry(digest, block.parent_digest, block.token_ids))
                    ids.append(block_id)
        if entries and self._busy():
            self._deferred.update(zip(ids, entries, strict=True))
            entries, ids = [], []
        if (entries or touches) and tier.save(
            entries, lambda: self.runner.read_blocks(ids), touches
        ):
            self.kv.mark_persisted(ids, [e.digest for e in entries])

    def _save_deferred(self, tier: KVTier) -> None:
        """Hand the writer up to WRITE_BACK_CHUNK deferred blocks that are still the
        indexed, unwritten copies (an evicted one was saved on its way out)."""
        if not tier.available:
            tier.count(write_drops=len(self._deferred))
            self._deferred.clear()
            return
        ids: list[int] = []
        entries: list[BlockEntry] = []
        for block_id in list(self._deferred)[:WRITE_BACK_CHUNK]:
            entry = self._deferred.pop(block_id)
            block = self.kv.blocks[block_id]
            if block.digest == entry.digest and not block.persisted:
                ids.append(block_id)
                entries.append(entry)
        if not entries:
            return
        if tier.save(entries, lambda: self.runner.read_blocks(ids)):
            self.kv.mark_persisted(ids, [e.digest for e in entries])
        elif tier.available:  # the writer's queue is full: keep them, give it a moment
            self._deferred.update(zip(ids, entries, strict=True))
            tier.flush(0.01)

    def _on_evict(self, block: Block) -> None:
        # Called inside the scheduler's allocation; the KV stays intact until the forward.
        if self.kv_tier is not None and self.kv_tier.available and block.digest is not None:
            entry = BlockEntry(block.digest, block.parent_digest, block.token_ids)
            self._evicted.append((block.block_id, entry))

    def _save_evicted(self, tier: KVTier) -> None:
        if self._evicted:
            evicted, self._evicted = self._evicted, []
            ids = [block_id for block_id, _ in evicted]
            tier.save([e for _, e in evicted], lambda: self.runner.read_blocks(ids))

    # -- stats ------------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        kv = self.kv
        return {
            "running": len(self.scheduler.running),
            "waiting": self._waiting_reqs,
            "last_step_batch_size": self.last_step["batch_size"],
            "last_step_tokens": self.last_step["tokens"],
            "last_step_seconds": self.last_step["seconds"],
            "kv_blocks_used": kv.num_used_blocks,
            "kv_blocks_free": kv.num_free_blocks,
            "kv_blocks_total": kv.num_blocks,
            "kv_block_size": kv.block_size,
            "prefix_cache_queries": kv.query_tokens,
            "prefix_cache_hits": kv.hit_tokens,
            "prefix_cache_hit_rate": kv.hit_tokens / kv.query_tokens if kv.query_tokens else 0.0,
            "preemptions": self.scheduler.num_preemptions,
            "dtype": dtype_name(self.runner.dtype),
            "kv_dtype": dtype_name(self.runner.kv_dtype),
            "device": str(self.runner.device),
            "quantization": self.runner.quantization,
            "max_model_len": self.max_model_len,
            **(self.kv_tier.stats() if self.kv_tier is not None else DISABLED_STATS),
            **{f"total_{k}": v for k, v in self.totals.items()},
            # Flat numbers, so that the workers' stats add up (inference/backends/remote.py).
            **{
                f"step_tokens_le_{bound}": n
                for bound, n in zip(STEP_TOKEN_BUCKETS[:-1], self.step_tokens_counts, strict=False)
            },
            "step_tokens_le_inf": self.step_tokens_counts[-1],
            "step_tokens_sum": self.step_tokens_sum,
            **{f"step_seconds_{kind}": v for kind, v in self.step_seconds.items()},
            "speculative_mode": self.config.speculative_mode,
            **(self.speculator.stats() if self.speculator is not None else SPEC_DISABLED_STATS),
            "tensor_parallel_size": self.config.tensor_parallel_size,
            **{f"tp_{k}": v for k, v in getattr(self.runner.model, "tp_stats", dict)().items()},
        }
