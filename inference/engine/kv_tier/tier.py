"""KVTier: the tier as the engine uses it. Lookups run on a reader thread (one MGET for all
candidate blocks of a prompt), writes on a writer thread (a pipeline of the keys.py
scripts); neither ever blocks the engine's step thread. When Redis stops answering the
tier logs one warning and reports itself unavailable (the engine then runs memory-only);
the writer thread pings every few seconds and logs when Redis is back."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
import redis
import torch

from inference.engine.cache_scope import UNSALTED, CacheScope
from inference.engine.kv_tier.blocks import BlockEntry, BlockLayout, RestoredPrefix
from inference.engine.kv_tier.connection import connect
from inference.engine.kv_tier.counters import COUNTERS
from inference.engine.kv_tier.keys import TierKeys
from inference.engine.kv_tier.redaction import redacted
from inference.engine.kv_tier.wire import COMPRESSIONS, encode, verify

log = logging.getLogger(__name__)

RETRY_EVERY_S = 3.0
# Linux nice value of the writer thread (threads are scheduled on their own there).
WRITER_NICENESS = 10
# Snapshots waiting for the writer; past this a write-back is dropped (and counted).
MAX_PENDING_BYTES = 256 * 2**20


@dataclass
class _Lookup:
    token_ids: list[int]
    first_block: int
    on_done: Callable[[RestoredPrefix | None], None]
    scope: CacheScope


@dataclass
class _Write:
    entries: list[BlockEntry]
    kv: list[torch.Tensor] | None  # per layer [2 * kv_heads, len(entries), block, head_dim]
    touches: list[bytes]
    nbytes: int
    queued_by_save: bool = False  # counted in the pending saves flush() waits on


class KVTier:
    def __init__(
        self,
        url: str,
        *,
        fingerprint: str,
        layout: BlockLayout,
        namespace: str,
        ttl_s: int,
        max_mb: int,
        compression: str,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"kv_tier_compression must be one of {', '.join(COMPRESSIONS)}")
        if compression == "lz4":
            import lz4.frame  # noqa: F401  (fail at start, not in the writer thread)
        self.url = url
        self.fingerprint = fingerprint
        self.fp_bytes = bytes.fromhex(fingerprint)[:12].ljust(12, b"\0")
        self.layout = layout
        self.namespace = namespace
        self.ttl_s = max(1, ttl_s)
        self.max_bytes = max_mb * 2**20
        self.compression = compression
        self.redis = connect(url)
        self.keys = TierKeys(self.redis, namespace, fingerprint)
        self.epoch = 0  # +1 each time Redis comes back: what it held may be gone
        self.lookup_done = threading.Event()
        self._lock = threading.Lock()
        self._counts: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self._degraded = False
        self._closed = False
        self._pending_bytes = 0
        self._pending_jobs = 0
        self._idle = threading.Condition(self._lock)
        self._lookups: queue.Queue[_Lookup | None] = queue.Queue()
        self._writes: queue.Queue[_Write | None] = queue.Queue()
        self._last_probe = 0.0
        try:
            self.redis.ping()
        except redis.RedisError as exc:
            self._failed(exc)
            self._last_probe = time.monotonic()
        self._threads = [
            threading.Thread(target=self._read_loop, name="kv-tier-reader", daemon=True),
            threading.Thread(target=self._write_loop, name="kv-tier-writer", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # -- state and stats --------------------------------------------------------------

    @property
    def available(self) -> bool:
        return not self._degraded and not self._closed

    def count(self, **amounts: float) -> None:
        with self._lock:
            for name, n in amounts.items():
                self._counts[name] += n

    def record_restore(self, tokens: int, seconds: float) -> None:
        """A lookup's blocks went into the pool (the engine calls this at admission)."""
        self.count(hits=1, hit_tokens=tokens, restore_seconds_total=seconds)

    def stats(self) -> dict[str, object]:
        with self._lock:
            counts = dict(self._counts)
        out: dict[str, object] = {"kv_tier_enabled": True, "kv_tier_degraded": self._degraded}
        for name, value in counts.items():
            out[f"kv_tier_{name}"] = value if name.endswith("seconds_total") else int(value)
        return out

    def _failed(self, exc: Exception) -> None:
        self.count(errors=1)
        if not isinstance(exc, redis.ConnectionError | redis.TimeoutError):
            log.warning("KV tier: Redis error: %s", exc)
            return
        with self._lock:
            was, self._degraded = self._degraded, True
        if not was:
            log.warning(
                "KV tier: Redis at %s is unreachable (%s); serving from the memory tier only, "
                "retrying every %.0f s",
                redacted(self.url),
                exc,
                RETRY_EVERY_S,
            )

    def _probe(self) -> None:
        self._last_probe = time.monotonic()
        try:
            self.redis.ping()
        except redis.RedisError:
            return
        with self._lock:
            self._degraded = False
            self.epoch += 1
        log.info("KV tier: Redis at %s answers again; the tier is back", redacted(self.url))

    # -- lookups ----------------------------------------------------------------------

    def lookup(
        self,
        token_ids: list[int],
        first_block: int,
        on_done: Callable[[RestoredPrefix | None], None],
        scope: CacheScope = UNSALTED,
    ) -> None:
        """Find blocks first_block.. of token_ids (whole blocks) in Redis, in the background,
        under the request's cache scope (its chain of digests).

        on_done runs on the reader thread with the longest valid run found (or None);
        lookup_done is set after it."""
        self._lookups.put(_Lookup(token_ids, first_block, on_done, scope))

    def wait_for_lookups(self, timeout: float) -> None:
        self.lookup_done.wait(timeout)

    def _read_loop(self) -> None:
        while (job := self._lookups.get()) is not None:
            restored: RestoredPrefix | None = None
            try:
                if self.available:
                    restored = self._fetch(job.token_ids, job.first_block, job.scope)
            except redis.RedisError as exc:
                self._failed(exc)
            except Exception:
                log.exception("KV tier: lookup failed")
            finally:
                job.on_done(restored)
                self.lookup_done.set()
            if restored is not None:
                self._touch_restored(job.token_ids, restored, job.scope)

    def _fetch(
        self, token_ids: list[int], first_block: int, scope: CacheScope
    ) -> RestoredPrefix | None:
        start = time.perf_counter()
        bs = self.layout.block_size
        blocks = [tuple(token_ids[i : i + bs]) for i in range(0, len(token_ids) - bs + 1, bs)]
        chain = scope.digest_chain(token_ids, bs, len(blocks))
        wanted = range(first_block, len(blocks))
        keys = [self.keys.entry(chain[i][1]) for i in wanted]
        values = cast("list[bytes | None]", self.redis.mget(keys))
        self.count(lookups=1)
        found: list[memoryview] = []
        for i, key, value in zip(wanted, keys, values, strict=True):
            if value is None:
                break
            payload = verify(value, blocks[i], chain[i][0], self.layout, self.fp_bytes)
            if payload is None:
                self.count(rejected=1)
                log.warning("KV tier: deleting a corrupt or mismatched entry %s", key)
                self.keys.forget(keys=[*self.keys.meta, key], args=["delete"])
                break
            found.append(payload)
        self.count(
            bytes_read=sum(len(v) for v in values if v is not None),
            miss_tokens=(len(keys) - len(found)) * bs,
        )
        if not found:
            return None
        return RestoredPrefix(first_block, self._assemble(found), time.perf_counter() - start)

    def _assemble(self, payloads: list[memoryview]) -> list[torch.Tensor]:
        """Per-block payloads [layers, heads, ...] to per-layer tensors [heads, blocks, ...]
        (the shape model_runner.write_blocks copies into the pool in one op per layer)."""
        lay = self.layout
        heads = 2 * lay.num_kv_heads
        row = lay.block_size * lay.head_dim * lay.dtype.itemsize
        layers = [torch.empty((heads, len(payloads), row), dtype=torch.uint8)
                  for _ in range(lay.num_layers)]  # fmt: skip
        dst = [t.numpy() for t in layers]
        for i, payload in enumerate(payloads):
            src = np.frombuffer(payload, dtype=np.uint8).reshape(lay.num_layers, heads, row)
            for layer, d in enumerate(dst):
                d[:, i, :] = src[layer]
        shape = (heads, len(payloads), lay.block_size, lay.head_dim)
        return [t.view(lay.dtype).view(shape) for t in layers]

    def _touch_restored(
        self, token_ids: list[int], restored: RestoredPrefix, scope: CacheScope
    ) -> None:
        bs = self.layout.block_size
        chain = scope.digest_chain(token_ids, bs, restored.first_block + restored.num_blocks)
        digests = [digest for _, digest in chain[restored.first_block :]]
        self._writes.put(_Write([], None, digests, 0))

    # -- write-back -------------------------------------------------------------------

    def save(
        self,
        entries: list[BlockEntry],
        snapshot: Callable[[], list[torch.Tensor]],
        touches: list[bytes] | None = None,
    ) -> bool:
        """Queue blocks to write (snapshot() copies their K/V now, on the caller's thread)
        and written blocks to refresh. False if the queue is full: nothing was queued."""
        nbytes = len(entries) * self.layout.nbytes
        with self._lock:
            if not self.available or self._pending_bytes + nbytes > MAX_PENDING_BYTES:
                self._counts["write_drops"] += len(entries)
                return False
            self._pending_bytes += nbytes
            self._pending_jobs += 1
        kv = snapshot() if entries else None
        self._writes.put(_Write(entries, kv, list(touches or ()), nbytes, queued_by_save=True))
        return True

    def flush(self, timeout: float) -> bool:
        """Wait until every queued write is done (or timeout); True if the queue drained."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending_jobs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout: float = 5.0) -> None:
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._lookups.put(None)
        self._writes.put(None)
        for t in self._threads:
            t.join(timeout=1.0)
        self.redis.close()

    def _write_loop(self) -> None:
        # Write-back is never urgent: on a busy machine the step thread gets the CPU first.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)
        while True:
            try:
                job = self._writes.get(timeout=1.0)
            except queue.Empty:
                if self._degraded and time.monotonic() - self._last_probe >= RETRY_EVERY_S:
                    self._probe()
                continue
            if job is None:
                return
            try:
                if self.available:
                    self._write(job)
                elif job.entries:
                    self.count(write_drops=len(job.entries))
            except redis.RedisError as exc:
                self._failed(exc)
            except Exception:
                log.exception("KV tier: write-back failed")
            finally:
                if job.queued_by_save:
                    with self._idle:
                        self._pending_bytes -= job.nbytes
                        self._pending_jobs -= 1
                        self._idle.notify_all()

    def _write(self, job: _Write) -> None:
        pipe = self.redis.pipeline(transaction=False)
        now = time.time()
        written = 0
        if job.kv is not None:
            n = len(job.entries)
            layers = [t.contiguous().view(torch.uint8).numpy().reshape(t.shape[0], n, -1)
                      for t in job.kv]  # fmt: skip
            for i, entry in enumerate(job.entries):
                value = encode(
                    entry,
                    [layer[:, i] for layer in layers],
                    self.layout,
                    self.fp_bytes,
                    self.compression,
                )
                written += len(value)
                self.keys.write(
                    keys=[self.keys.entry(entry.digest), self.keys.lru, self.keys.sizes,
                          self.keys.total],
                    args=[value, self.ttl_s, now],
                    client=pipe,
                )  # fmt: skip
        if job.touches:
            keys = [self.keys.lru, *(self.keys.entry(d) for d in job.touches)]
            self.keys.touch(keys=keys, args=[self.ttl_s, now], client=pipe)
        if job.entries:
            self.keys.evict(keys=self.keys.meta, args=[self.max_bytes], client=pipe)
        pipe.execute()
        self.count(bytes_written=written, blocks_written=len(job.entries))
