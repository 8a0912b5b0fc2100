"""The response cache: a deterministic request answered before is replayed from Redis.

A request is deterministic when it is greedy (temperature 0) or names a seed: the same
model, the same prompt ids and the same sampling settings then give the same reply, so a
stored reply can be streamed again without touching the engine. A sampled request without
a seed is never looked up nor stored: each of those is meant to come out differently.

    key   = blake2b(model fingerprint, owner's cache salt, exact prompt token ids,
                    every sampling setting)
    value = the reply's deltas (text and token ids of each), its finish reason and the
            figures of the request that produced it; JSON, bounded in size, with a TTL.

Entries are scoped by owner like the prefix cache (inference.client.prefix_cache_salt): a
replay answers in milliseconds, so a global cache would tell anyone that someone else sent
this exact prompt before.

Only replies that ended normally ("stop" or "length") are stored. Redis is spoken to with
the synchronous client from worker threads, so the event loop never waits on it; when Redis
does not answer, the cache steps aside for a while (one warning in the log) and requests
go to the engine as usual. Off by default: settings.RESPONSE_CACHE_* and
inference.response_cache.from_settings(). docs/response-cache.md has the details.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import redis
from django.conf import settings

from inference.engine import Delta, RequestFigures, SamplingParams

log = logging.getLogger(__name__)

STORED_FINISH_REASONS = ("stop", "length")
FORMAT = 1  # bumped when the stored layout changes; older entries are then misses


def is_deterministic(sampling: SamplingParams) -> bool:
    """Greedy, or sampled from a generator seeded by the request: the same every time."""
    return sampling.greedy or sampling.seed is not None


def sampling_json(sampling: SamplingParams) -> str:
    """Every sampling setting, canonically: any change to one is another key."""
    return json.dumps(asdict(sampling), sort_keys=True, separators=(",", ":"))


@dataclass
class CachedReply:
    """What a replay needs: the deltas as the engine sent them, and how the reply ended."""

    pieces: list[tuple[str, list[int]]]
    finish_reason: str
    # The original request's figures (RequestFigures.as_dict()), kept for inspection.
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def output_tokens(self) -> int:
        return sum(len(ids) for _, ids in self.pieces)

    def dumps(self) -> bytes:
        body = {
            "v": FORMAT,
            "pieces": [[text, ids] for text, ids in self.pieces],
            "finish_reason": self.finish_reason,
            "figures": self.figures,
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def loads(cls, raw: bytes) -> CachedReply | None:
        """The stored reply, or None when the bytes are not one (corrupt, older format)."""
        try:
            body = json.loads(raw)
            if body.get("v") != FORMAT or body["finish_reason"] not in STORED_FINISH_REASONS:
                return None
            pieces = []
            for text, ids in body["pieces"]:
                if not isinstance(text, str) or not all(isinstance(t, int) for t in ids):
                    return None
                pieces.append((text, list(ids)))
            if not pieces:
                return None
            figures = body.get("figures") or {}
            return cls(pieces, body["finish_reason"], figures if isinstance(figures, dict) else {})
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


class ResponseCache:
    """Replies of deterministic requests in Redis, by (model, prompt, sampling settings)."""

    def __init__(
        self,
        redis_url: str,
        ttl_s: float,
        namespace: str = "respcache",
        *,
        max_bytes: int = 1 << 20,
        retry_after_s: float = 30.0,
        timeout_s: float = 0.5,
    ) -> None:
        self.url = redis_url
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.namespace = namespace
        self.max_bytes = max_bytes
        self.retry_after_s = retry_after_s
        self.redis = redis.Redis.from_url(
            redis_url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
        self.counts = {"lookups": 0, "hits": 0, "stores": 0, "too_large": 0, "errors": 0}
        self._down_until = 0.0
        self._warned = False
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-cache")
        self._pending: set[Future[bool]] = set()

    def key(
        self,
        fingerprint: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        scope: str = "",
    ) -> str:
        """The entry of this prompt and sampling, for `scope` (the owner's cache salt; "":
        a request no user's text is in) only."""
        h = hashlib.blake2b(digest_size=20)
        parts = (fingerprint, scope, ",".join(map(str, prompt_token_ids)), sampling_json(sampling))
        for part in parts:
            h.update(part.encode())
            h.update(b"\0")
        return f"{self.namespace}:{h.hexdigest()}"

    # --- Redis, from worker threads ------------------------------------------------------

    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, exc: Exception) -> None:
        """Redis did not answer: step aside for retry_after_s, and say so once."""
        with self._lock:
            self.counts["errors"] += 1
            self._down_until = time.monotonic() + self.retry_after_s
            warn, self._warned = not self._warned, True
        if warn:
            log.warning(
                "response cache: Redis at %s is not answering (%s); requests go to the engine",
                self.url,
                exc,
            )

    def _answered(self) -> None:
        if self._warned:
            with self._lock:
                self._warned = False
            log.info("response cache: Redis at %s answers again", self.url)

    def get(self, key: str) -> CachedReply | None:
        if not self.available():
            return None
        try:
            raw = cast("bytes | None", self.redis.get(key))  # decode_responses is off
        except redis.RedisError as exc:
            self._failed(exc)
            return None
        self._answered()
        reply = CachedReply.loads(raw) if raw is not None else None
        if raw is not None and reply is None:
            self._delete(key)  # unreadable: never used, and gone for the next one
        with self._lock:
            self.counts["lookups"] += 1
            self.counts["hits"] += reply is not None
        return reply

    def put(self, key: str, reply: CachedReply) -> bool:
        if not self.available():
            return False
        raw = reply.dumps()
        if len(raw) > self.max_bytes:
            with self._lock:
                self.counts["too_large"] += 1
            return False
        try:
            self.redis.set(key, raw, px=self.ttl_ms)
        except redis.RedisError as exc:
            self._failed(exc)
            return False
        self._answered()
        with self._lock:
            self.counts["stores"] += 1
        return True

    def _delete(self, key: str) -> None:
        try:
            self.redis.delete(key)
        except redis.RedisError as exc:
            self._failed(exc)

    def put_later(self, key: str, reply: CachedReply) -> None:
        """Store in the background: a finished reply never waits for Redis."""
        try:
            future = self._writer.submit(self.put, key, reply)
        except RuntimeError:  # closed meanwhile: the reply is simply not kept
            return
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future[bool]) -> None:
        with self._lock:
            self._pending.discard(future)

    def flush(self, timeout: float = 5.0) -> None:
        """Wait for the background stores (tests, shutdown)."""
        with self._lock:
            pending = list(self._pending)
        wait_futures(pending, timeout=timeout)

    def clear(self) -> int:
        """Delete every entry of this namespace; returns how many there were."""
        keys = list(self.redis.scan_iter(match=f"{self.namespace}:*", count=500))
        return int(self.redis.delete(*keys)) if keys else 0

    def close(self) -> None:
        self.flush()
        self._writer.shutdown(wait=False)
        self.redis.close()

    # --- the stream ------------------------------------------------------------------------

    def stream(
        self,
        key: Callable[[], str | None],
        prompt_len: int,
        start_engine: Callable[[], AsyncIterator[Delta]],
        request_id: str | None = None,
        on_lookup: Callable[[bool], None] | None = None,
    ) -> ResponseStream:
        return ResponseStream(self, key, prompt_len, start_engine, request_id, on_lookup)


class ResponseStream:
    """A request's deltas: replayed from the cache on a hit, else the engine's stream,
    stored once it ends normally. `replayed` tells which, from the first delta on."""

    def __init__(
        self,
        cache: ResponseCache,
        key: Callable[[], str | None],
        prompt_len: int,
        start_engine: Callable[[], AsyncIterator[Delta]],
        request_id: str | None,
        on_lookup: Callable[[bool], None] | None,
    ) -> None:
        self.cache = cache
        self.replayed = False
        self._key = key
        self._prompt_len = prompt_len
        self._start_engine = start_engine
        self._request_id = request_id or uuid.uuid4().hex
        self._on_lookup = on_lookup
        self._deltas = self._run()

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> Delta:
        return await self._deltas.__anext__()

    async def aclose(self) -> None:
        await self._deltas.aclose()

    def _lookup(self) -> tuple[str | None, CachedReply | None]:
        key = self._key()  # None while the model's fingerprint is not known yet
        return key, (self.cache.get(key) if key is not None else None)

    async def _run(self) -> AsyncGenerator[Delta, None]:
        arrival = time.time()
        key, reply = (None, None)
        if self.cache.available():
            key, reply = await asyncio.to_thread(self._lookup)
            if key is not None and self._on_lookup is not None:
                self._on_lookup(reply is not None)
        if reply is not None:
            self.replayed = True
            async for delta in self._replay(reply, arrival):
                yield delta
            return
        engine = self._start_engine()
        pieces: list[tuple[str, list[int]]] = []
        try:
            async for delta in engine:
                pieces.append((delta.text, list(delta.token_ids)))
                if (
                    key is not None
                    and delta.finished
                    and delta.finish_reason in STORED_FINISH_REASONS
                    and not delta.error
                ):
                    figures = delta.figures.as_dict() if delta.figures else {}
                    self.cache.put_later(key, CachedReply(pieces, delta.finish_reason, figures))
                yield delta
        finally:
            closer = getattr(engine, "aclose", None)
            if closer is not None:
                await closer()

    async def _replay(self, reply: CachedReply, arrival: float) -> AsyncIterator[Delta]:
        m = RequestFigures(arrival_time=arrival, prompt_tokens=self._prompt_len, replayed=True)
        last = len(reply.pieces) - 1
        for i, (text, ids) in enumerate(reply.pieces):
            now = time.time()
            if ids and m.first_token_time is None:
                m.first_token_time = now
            m.token_times.extend([now] * len(ids))
            m.output_tokens += len(ids)
            delta = Delta(self._request_id, text=text, token_ids=list(ids))
            if i == last:
                m.finish_time = now
                delta.finished, delta.finish_reason, delta.figures = True, reply.finish_reason, m
            yield delta
            if i != last:
                await asyncio.sleep(0)  # a long reply does not hold the loop


_response_caches: dict[tuple[str, float], ResponseCache] = {}
_response_caches_lock = threading.Lock()  # not _lock: that one is held while a model loads


def from_settings() -> ResponseCache | None:
    """The response cache settings.RESPONSE_CACHE_* describe; None while it is off."""
    if not getattr(settings, "RESPONSE_CACHE_ENABLED", False):
        return None
    spec = (str(settings.RESPONSE_CACHE_URL), float(settings.RESPONSE_CACHE_TTL_S))
    with _response_caches_lock:
        if spec not in _response_caches:
            _response_caches[spec] = ResponseCache(*spec)
        return _response_caches[spec]
