"""The Redis tier of the KV cache: full prefix blocks kept across restarts and shared by workers.

One Redis entry per full KV block, under

    {namespace}:{fingerprint}:{chain digest}

The fingerprint covers the model's weights, dtype, quantization, device type, block size and
cache layout (fingerprint.py); the chain digest is blake2b over the previous block's digest
and this block's exact token ids (kv_cache.chain_digest), the link into a request's first
salted block salted with its owner (kv_cache.CacheScope), so one owner's keys never name
another's blocks. The value is a header (magic,
version, compression, fingerprint, parent digest, lengths) and the block's token ids, then
the block's K and V for every layer in the pool dtype, byte for byte (or compressed), then a
crc32 of all that. A reader checks
every field against what it expects and the crc over the whole value; anything off is
deleted and counted, never used.

Lookups run on a reader thread (one MGET for all candidate blocks of a prompt), writes on a
writer thread (a pipeline of small Lua scripts that also keep a last-use sorted set and a
byte counter, so the tier stays under its size cap, least recently used out first). Neither
ever blocks the engine's step thread. When Redis stops answering the tier logs one warning
and reports itself unavailable (the engine then runs memory-only); the writer thread pings
every few seconds and logs when Redis is back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import struct
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import numpy as np
import redis
import torch
from redis.backoff import NoBackoff
from redis.retry import Retry

from inference.engine.kv_cache import UNSALTED, CacheScope

log = logging.getLogger(__name__)

LAYOUT_VERSION = 1
MAGIC = b"KVTB"
# magic, version, compression, block size, fingerprint, parent digest,
# stored payload length, raw payload length, crc32 of everything but this field.
HEADER = struct.Struct("<4sBBH12s16sII")
CRC = struct.Struct("<I")
COMPRESSIONS = {"none": 0, "zlib": 1, "lz4": 2}
# Short socket timeouts: a dead Redis costs a lookup at most this long.
SOCKET_TIMEOUT_S = 0.5
RETRY_EVERY_S = 3.0
# Linux nice value of the writer thread (threads are scheduled on their own there).
WRITER_NICENESS = 10
# Snapshots waiting for the writer; past this a write-back is dropped (and counted).
MAX_PENDING_BYTES = 256 * 2**20

# KEYS: entry, lru zset, sizes hash, byte counter. ARGV: value, ttl, now.
_WRITE = """
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
local n = string.len(ARGV[1])
local old = tonumber(redis.call('HGET', KEYS[3], KEYS[1]) or 0)
redis.call('HSET', KEYS[3], KEYS[1], n)
redis.call('INCRBY', KEYS[4], n - old)
redis.call('ZADD', KEYS[2], ARGV[3], KEYS[1])
return n
"""
# KEYS: lru zset, then entries. ARGV: ttl, now. Refreshes TTL and last use of live entries.
_TOUCH = """
local missing = 0
for i = 2, #KEYS do
  if redis.call('EXPIRE', KEYS[i], ARGV[1]) == 1 then
    redis.call('ZADD', KEYS[1], ARGV[2], KEYS[i])
  else
    missing = missing + 1
  end
end
return missing
"""
# KEYS: lru zset, sizes hash, byte counter. ARGV: cap in bytes. Oldest out until under cap.
_EVICT = """
local total = tonumber(redis.call('GET', KEYS[3]) or 0)
local cap = tonumber(ARGV[1])
local evicted = 0
while total > cap do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 63)
  if #oldest == 0 then break end
  for _, k in ipairs(oldest) do
    total = total - tonumber(redis.call('HGET', KEYS[2], k) or 0)
    redis.call('UNLINK', k)
    redis.call('ZREM', KEYS[1], k)
    redis.call('HDEL', KEYS[2], k)
    evicted = evicted + 1
    if total <= cap then break end
  end
end
if evicted > 0 then redis.call('SET', KEYS[3], total) end
return evicted
"""
# KEYS: lru zset, sizes hash, byte counter, then entries. ARGV: 'delete' (all of them) or
# 'gone' (only those whose key expired). Drops them and their bookkeeping.
_FORGET = """
local removed, freed = 0, 0
for i = 4, #KEYS do
  local k = KEYS[i]
  if ARGV[1] == 'delete' or redis.call('EXISTS', k) == 0 then
    redis.call('UNLINK', k)
    local n = tonumber(redis.call('HGET', KEYS[2], k) or 0)
    if redis.call('HDEL', KEYS[2], k) == 1 then freed = freed + n end
    redis.call('ZREM', KEYS[1], k)
    removed = removed + 1
  end
end
if freed > 0 then redis.call('DECRBY', KEYS[3], freed) end
return {removed, freed}
"""


@dataclass(frozen=True)
class BlockLayout:
    """What one block's payload is: [layers, 2 * kv_heads, block_size, head_dim] of dtype."""

    num_layers: int
    num_kv_heads: int
    block_size: int
    head_dim: int
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        heads = 2 * self.num_kv_heads
        return self.num_layers * heads * self.block_size * self.head_dim * self.dtype.itemsize


class BlockEntry(NamedTuple):
    """A full block to write: its chain digest, its parent's, and its token ids."""

    digest: bytes
    parent: bytes
    token_ids: tuple[int, ...]


@dataclass
class RestoredPrefix:
    """Blocks [first_block, first_block + num_blocks) of a prompt, found in Redis."""

    first_block: int
    kv: list[torch.Tensor]  # per layer [2 * kv_heads, num_blocks, block_size, head_dim]
    seconds: float

    @property
    def num_blocks(self) -> int:
        return int(self.kv[0].shape[1])


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
    queued_by_save: bool = False  # counted in the pending figures flush() waits on


_COUNTERS = (
    "lookups",
    "hits",
    "hit_tokens",
    "miss_tokens",
    "bytes_written",
    "bytes_read",
    "blocks_written",
    "restore_seconds_total",
    "rejected",
    "write_drops",
    "errors",
)
DISABLED_STATS: dict[str, object] = {
    "kv_tier_enabled": False,
    "kv_tier_degraded": False,
    **{f"kv_tier_{name}": 0 for name in _COUNTERS},
}


def redacted(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (
        f":{parts.port}" if parts.port else ""
    )
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def connect(url: str) -> redis.Redis:
    # No retries and short timeouts: the tier is a cache, a slow answer is a miss.
    return redis.Redis.from_url(
        url,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=SOCKET_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
        socket_read_size=1 << 20,
    )


class _Keys:
    """The tier's Redis key names and its bookkeeping scripts."""

    def __init__(self, client: redis.Redis, namespace: str, fingerprint: str = "") -> None:
        self.prefix = f"{namespace}:{fingerprint}:"
        self.lru = f"{namespace}:lru"
        self.sizes = f"{namespace}:sizes"
        self.total = f"{namespace}:bytes"
        self.meta = [self.lru, self.sizes, self.total]
        self.write = client.register_script(_WRITE)
        self.touch = client.register_script(_TOUCH)
        self.evict = client.register_script(_EVICT)
        self.forget = client.register_script(_FORGET)

    def entry(self, digest: bytes) -> str:
        return self.prefix + digest.hex()


def upkeep(client: redis.Redis, namespace: str, max_bytes: int) -> dict[str, int]:
    """Drop bookkeeping of entries whose TTL ran out, enforce the cap, report the size."""
    keys = _Keys(client, namespace)
    # connect() keeps responses as bytes (decode_responses is off).
    members = [m.decode() for m in cast("list[bytes]", client.zrange(keys.lru, 0, -1))]
    expired = 0
    for i in range(0, len(members), 500):
        removed, _ = keys.forget(keys=keys.meta + members[i : i + 500], args=["gone"])
        expired += int(removed)
    evicted = int(keys.evict(keys=keys.meta, args=[max_bytes]))
    return {
        "entries": int(client.zcard(keys.lru)),
        "bytes": int(client.get(keys.total) or 0),
        "expired_dropped": expired,
        "evicted": evicted,
    }


def upkeep_url(url: str, namespace: str = "kvtier", max_mb: int = 2048) -> dict[str, int]:
    """upkeep() for a periodic job that has settings, not an engine."""
    client = connect(url)
    try:
        return upkeep(client, namespace, max_mb * 2**20)
    finally:
        client.close()


class KVTier:
    def __init__(
        self,
        url: str,
        *,
        fingerprint: str,
        layout: BlockLayout,
        namespace: str = "kvtier",
        ttl_s: int = 86400,
        max_mb: int = 2048,
        compression: str = "none",
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
        self.keys = _Keys(self.redis, namespace, fingerprint)
        self.epoch = 0  # +1 each time Redis comes back: what it held may be gone
        self.lookup_done = threading.Event()
        self._lock = threading.Lock()
        self._counts: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
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

    # -- state and figures ------------------------------------------------------------

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
            payload = self._verify(value, blocks[i], chain[i][0])
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

    def _verify(self, value: bytes, tokens: tuple[int, ...], parent: bytes) -> memoryview | None:
        """The raw payload of a stored block if every field is what we expect, else None."""
        bs = self.layout.block_size
        head = HEADER.size + 4 * bs
        if len(value) < head + CRC.size:
            return None
        magic, version, comp, block_size, fp, stored_parent, stored_len, raw_len = (
            HEADER.unpack_from(value)
        )
        if (
            magic != MAGIC
            or version != LAYOUT_VERSION
            or comp not in COMPRESSIONS.values()
            or block_size != bs
            or fp != self.fp_bytes
            or stored_parent != parent
            or stored_len != len(value) - head - CRC.size
            or raw_len != self.layout.nbytes
            or struct.unpack_from(f"<{bs}I", value, HEADER.size) != tokens
        ):
            return None
        body = memoryview(value)[: len(value) - CRC.size]
        if zlib.crc32(body) != CRC.unpack_from(value, len(value) - CRC.size)[0]:
            return None
        payload = body[head:]
        try:
            if comp == COMPRESSIONS["zlib"]:
                payload = memoryview(zlib.decompress(payload))
            elif comp == COMPRESSIONS["lz4"]:
                import lz4.frame

                payload = memoryview(lz4.frame.decompress(payload))
        except Exception:
            return None
        return payload if len(payload) == raw_len else None

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
                value = self._encode(entry, [layer[:, i] for layer in layers])
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

    def _encode(self, entry: BlockEntry, block: list[np.ndarray]) -> memoryview:
        """Header, token ids, payload, crc32: one buffer, one copy of the payload."""
        bs = self.layout.block_size
        head = HEADER.size + 4 * bs
        raw_len = self.layout.nbytes
        comp = COMPRESSIONS[self.compression]
        stored: Any = None
        if comp != COMPRESSIONS["none"]:
            raw = np.stack(block).data
            if comp == COMPRESSIONS["zlib"]:
                stored = zlib.compress(raw, 1)
            else:
                import lz4.frame

                stored = lz4.frame.compress(raw)
        stored_len = raw_len if stored is None else len(stored)
        value = bytearray(head + stored_len + CRC.size)
        HEADER.pack_into(
            value, 0, MAGIC, LAYOUT_VERSION, comp, bs, self.fp_bytes, entry.parent,
            stored_len, raw_len,
        )  # fmt: skip
        struct.pack_into(f"<{bs}I", value, HEADER.size, *entry.token_ids)
        if stored is None:
            dst = np.frombuffer(value, dtype=np.uint8, count=raw_len, offset=head)
            dst = dst.reshape(len(block), *block[0].shape)
            for layer, src in enumerate(block):
                dst[layer] = src
        else:
            value[head : head + stored_len] = stored
        body = memoryview(value)[: head + stored_len]
        CRC.pack_into(value, head + stored_len, zlib.crc32(body))
        return memoryview(value)
