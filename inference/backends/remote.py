"""The engine as a web process sees it in distributed mode: each request goes to an engine
worker (inference/workers/server.py) over the Redis channel layer, and its deltas come
back on this process's reply channel.

generate() keeps AsyncEngine.generate's contract, so EngineClient wraps either one:
an async iterator of Delta, the last one finished; EngineBusyError, PromptTooLongError
or InvalidRequestError before the first delta; leaving early aborts the request.

Routing, among the live workers serving the request's model: the worker that served the
session last with this model (it holds the session's KV), if alive;
without a session (an API request with no `user`), the worker that served the longest
prefix of this prompt's first blocks (prefix_keys), unless it is much busier than the
least loaded; else the least loaded live worker (which restores the session's prefix from
the Redis KV tier if it has one). A watchdog ends a request with an error delta when its
worker's heartbeat lapses, or when Redis stays unreachable for WORKER_DEAD_AFTER_S: a
reply never hangs on a worker that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from channels.exceptions import ChannelFull
from redis import Redis
from redis import asyncio as aioredis

from inference.engine.errors import EngineBusyError, EngineError, InvalidRequestError
from inference.engine.outputs import Delta, RequestFigures
from inference.engine.sampling_params import SamplingParams
from inference.engine.streaming import until_finished
from inference.workers.protocol import (
    LOST_CONTACT,
    REDIS_ERRORS,
    REDIS_OPTIONS,
    WORKER_LOST,
    EngineUnavailableError,
    ModelNotFoundError,
    abort_message,
    consume,
    delta_from_event,
    error_from_event,
    generate_message,
    is_refusal,
    lost_delta,
    open_layer,
    raise_if_cancelled,
    send,
)
from inference.workers.registry import Registry, WorkerInfo, live_workers_sync

log = logging.getLogger(__name__)

# One Redis round trip (routing read, a send) that takes longer than this has failed.
REDIS_TIMEOUT_S = 2.0
# How often in-flight requests' workers are checked for a heartbeat.
WATCH_EVERY_S = 0.5
# Prefix affinity: a request without a session is known by digests of its prompt's first
# PREFIX_BLOCKS blocks of PREFIX_BLOCK_TOKENS tokens (the first 256 tokens), so a client
# that resends a growing history keeps to the worker holding its KV.
PREFIX_BLOCK_TOKENS = 16
PREFIX_BLOCKS = 16
# A prefix's worker is passed over when its load is more than this above the least loaded
# one's: many conversations opening alike (one long system prompt) must not all pile onto
# one worker, and a restore from the Redis tier costs less than a queue.
PREFIX_AFFINITY_SLACK = 4
LOST_ON_THE_WAY = (
    "the engine worker no longer knows this reply (a message was lost on the way); "
    "what was written so far is saved - send again to continue"
)


def prefix_keys(
    prompt_token_ids: list[int], cache_salt: str | None = None, model: str = ""
) -> list[str]:
    """Digests of the prompt's first full blocks, a chain: the i-th covers blocks 0..i,
    salted with the request's cache salt (its KV is found only under that salt) and its
    model (another model's workers hold no KV of it, even for the same ids). A turn that
    extends an earlier prompt shares the earlier prompt's digests; a prompt shorter than
    one block has none (it routes by load)."""
    n = min(len(prompt_token_ids) // PREFIX_BLOCK_TOKENS, PREFIX_BLOCKS)
    h = hashlib.blake2b(digest_size=16)
    h.update(b"salt:" + (cache_salt or "").encode() + b"\0")
    if model:
        h.update(b"model:" + model.encode() + b"\0")
    keys = []
    for i in range(n):
        block = prompt_token_ids[i * PREFIX_BLOCK_TOKENS : (i + 1) * PREFIX_BLOCK_TOKENS]
        h.update(b"".join(int(t).to_bytes(4, "little", signed=True) for t in block))
        keys.append(h.copy().hexdigest())
    return keys


def choose_worker(
    candidates: list[WorkerInfo], home: str | None, by_prefix: bool, mine: dict[str, int]
) -> WorkerInfo:
    """The session's (or prefix's) worker if alive, else the least loaded. A heartbeat can
    be a moment old, so a worker's load counts this process's own requests on it too: a
    burst of new sessions spreads instead of piling onto one worker."""

    def load(w: WorkerInfo) -> int:
        return max(w.load, mine.get(w.id, 0))

    least = min(candidates, key=lambda w: (load(w), random.random()))
    for w in candidates:
        if w.id == home:
            if by_prefix and load(w) - load(least) > PREFIX_AFFINITY_SLACK:
                return least
            return w
    return least


@dataclass(eq=False)
class _Pending:
    worker_id: str
    worker_channel: str
    incarnation: str
    queue: asyncio.Queue[Delta | EngineError] = field(default_factory=asyncio.Queue)
    # Since when the worker's heartbeat has not listed this request (None: it does).
    unlisted_since: float | None = None
    # Its last delta (or its refusal) is queued: the worker is done with it, and a reader
    # slow to take the queue must not see it ended again as lost.
    ended: bool = False


@dataclass(eq=False)
class _Link:
    """What one event loop needs: its own channel layer and Redis client (both bind to
    the loop), a reply channel, and the requests waiting on it."""

    loop: asyncio.AbstractEventLoop
    layer: Any
    redis: Any
    registry: Registry
    reply_to: str
    requests: dict[str, _Pending] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    last_contact: float = field(default_factory=time.monotonic)
    messages: int = 0


class RemoteEngine:
    def __init__(
        self,
        tokenizer: Any,
        *,
        url: str,
        namespace: str = "engine",
        model: str = "",
        model_path: str = "",
        dead_after_s: float = 3.0,
        missing: type[EngineError] = EngineUnavailableError,
    ) -> None:
        self.tokenizer = tokenizer
        # What EngineClient reads of an engine's config (the model folder, which the web
        # side has too: its tokenizer comes from there).
        self.config = SimpleNamespace(model=model_path)
        self.url = url
        self.namespace = namespace
        self.model = model
        self.dead_after_s = dead_after_s
        # What a request gets while no live worker serves the model: the default model is
        # "unavailable" (workers come and go), any other is "not found" (nobody serves it).
        self.missing = missing
        self._links: dict[asyncio.AbstractEventLoop, _Link] = {}
        self._lock = threading.Lock()
        self._background: set[asyncio.Task[Any]] = set()
        self._max_model_len: int | None = None
        # Each live worker's own stats as of the last stats() (the per-worker /metrics).
        self.last_worker_stats: dict[str, dict[str, Any]] = {}
        self._closed = False
        options = {**REDIS_OPTIONS, "socket_timeout": REDIS_TIMEOUT_S}
        self._sync_redis = Redis.from_url(url, **options)
        with contextlib.suppress(*REDIS_ERRORS):
            self._note(live_workers_sync(self._sync_redis, namespace))

    @property
    def max_model_len(self) -> int | None:
        """The smallest context window among the live workers last seen (None: none seen)."""
        return self._max_model_len

    @property
    def messages_received(self) -> int:
        """Channel messages received so far (each holds one or more deltas)."""
        return sum(link.messages for link in list(self._links.values()))

    # --- streaming ------------------------------------------------------------------

    async def generate(
        self,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        session_id: str | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        shared_prefix_tokens: int = 0,
    ) -> AsyncIterator[Delta]:
        if self._closed:
            raise EngineUnavailableError("the engine client is shut down")
        link = await self._link()
        rid = request_id or uuid.uuid4().hex
        if rid in link.requests:
            raise InvalidRequestError(f"request id {rid!r} is already streaming")
        prefix = [] if session_id else prefix_keys(prompt_token_ids, cache_salt, self.model)
        worker = await self._route(link, session_id, prefix)
        pending = _Pending(worker.id, worker.channel, worker.incarnation)
        link.requests[rid] = pending
        arrival, output_tokens = time.time(), 0
        try:
            message = generate_message(
                rid,
                prompt_token_ids,
                sampling,
                session_id,
                link.reply_to,
                cache_salt=cache_salt,
                shared_prefix_tokens=shared_prefix_tokens,
                model=self.model,
            )
            try:
                await send(link.layer, worker.channel, message, REDIS_TIMEOUT_S)
            except ChannelFull as exc:
                raise EngineBusyError(
                    f"engine worker {worker.id} has too many requests queued"
                ) from exc
            except REDIS_ERRORS as exc:  # it may have gone out: stop it, should it arrive
                self._send_abort(link, worker.channel, rid)
                raise_if_cancelled(exc)
                raise self._unreachable(exc) from exc
            abandon = functools.partial(self._send_abort, link, worker.channel, rid)
            async with contextlib.aclosing(until_finished(pending.queue, abandon)) as deltas:
                async for item in deltas:
                    if prefix:  # the worker took it: it holds this prefix's KV from now on
                        self._note_prefix(link, prefix[-1], worker.id)
                        prefix = []
                    output_tokens += len(item.token_ids)
                    if item.finished and item.figures is None:
                        # An error delta (the worker died, stopped or went out of reach)
                        # brings no figures; the request's record still names its worker.
                        item.figures = lost_figures(
                            worker.id, arrival, len(prompt_token_ids), output_tokens
                        )
                    yield item
        except EngineError as exc:
            # Refused by (or on the way to) this worker: its record names the worker.
            if exc.worker is None:
                exc.worker = worker.id
            raise
        finally:
            link.requests.pop(rid, None)

    def abort(self, request_id: str) -> None:
        """Ask the request's worker to stop it; the stream then ends with an "abort" delta."""
        for link in list(self._links.values()):
            pending = link.requests.get(request_id)
            if pending is not None:
                with contextlib.suppress(RuntimeError):  # that loop is closed
                    link.loop.call_soon_threadsafe(
                        self._send_abort, link, pending.worker_channel, request_id
                    )

    def _send_abort(self, link: _Link, channel: str, request_id: str) -> None:
        async def send_abort() -> None:
            with contextlib.suppress(*REDIS_ERRORS, ChannelFull):
                await send(link.layer, channel, abort_message(request_id), 2)

        if any(t.done() or t.cancelling() for t in link.tasks):
            return  # the loop is shutting down (asyncio.run closing a stream left open)
        with contextlib.suppress(RuntimeError):  # the loop is closed
            task = link.loop.create_task(send_abort())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    # --- routing --------------------------------------------------------------------

    def _note_prefix(self, link: _Link, digest: str, worker_id: str) -> None:
        async def note() -> None:
            with contextlib.suppress(*REDIS_ERRORS):
                await asyncio.wait_for(
                    link.registry.set_prefix_affinity(digest, worker_id), REDIS_TIMEOUT_S
                )

        task = link.loop.create_task(note())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _route(
        self, link: _Link, session_id: str | None, prefix: list[str] | None = None
    ) -> WorkerInfo:
        try:
            found, sticky = await asyncio.wait_for(
                link.registry.routing(session_id, prefix or (), self.model), REDIS_TIMEOUT_S
            )
        except REDIS_ERRORS as exc:
            raise_if_cancelled(exc)
            raise self._unreachable(exc) from exc
        link.last_contact = time.monotonic()
        # A draining worker finishes what it has and takes nothing new.
        found = [w for w in found if not w.draining]
        candidates = self._note(found)
        if not candidates:
            if self.missing is ModelNotFoundError:
                raise ModelNotFoundError(self.model, [w.model for w in found if w.model])
            if found:
                raise self.missing(
                    f"no engine worker serves the model {self.model!r} "
                    f"(running: {sorted({w.model for w in found})})"
                )
            raise self.missing(
                "no engine worker is running: start one with `python manage.py run_engine`"
            )
        mine: dict[str, int] = {}
        for p in link.requests.values():
            mine[p.worker_id] = mine.get(p.worker_id, 0) + 1
        return choose_worker(candidates, sticky, not session_id, mine)

    def _note(self, workers: list[WorkerInfo]) -> list[WorkerInfo]:
        """The workers serving our model; remember their context window."""
        mine = [w for w in workers if not self.model or not w.model or w.model == self.model]
        lens = [w.max_model_len for w in mine if w.max_model_len]
        if lens:
            self._max_model_len = min(lens)
        return mine

    def _unreachable(self, exc: BaseException) -> EngineUnavailableError:
        return EngineUnavailableError(
            f"cannot reach the engine workers: Redis at {self.url} did not answer "
            f"({exc or type(exc).__name__})"
        )

    # --- the per-loop link: reply channel, receiver, watchdog -------------------------

    async def _link(self) -> _Link:
        loop = asyncio.get_running_loop()
        link = self._links.get(loop)
        if link is not None and not any(t.done() for t in link.tasks):
            return link
        if link is not None:  # its receiver or watchdog died: start afresh
            log.error("engine replies: the reply link stopped; opening a new one")
            self._close_link(link)
            self._links.pop(loop, None)
        layer = open_layer(self.url, self.namespace)
        reply_to = await layer.new_channel("engine.reply")
        redis = aioredis.Redis.from_url(self.url, **REDIS_OPTIONS)
        with self._lock:
            for old in [lp for lp in self._links if lp.is_closed()]:
                del self._links[old]
            if loop in self._links:  # another task of this loop got here first
                return self._links[loop]
            link = _Link(loop, layer, redis, Registry(redis, self.namespace, self.dead_after_s),
                         reply_to)  # fmt: skip
            self._links[loop] = link
        link.tasks = [
            loop.create_task(self._receive_loop(link), name="engine-reply-receiver"),
            loop.create_task(self._watch(link), name="engine-worker-watchdog"),
        ]
        return link

    async def _receive_loop(self, link: _Link) -> None:
        def handle(message: dict[str, Any]) -> None:
            link.messages += 1
            worker = str(message.get("worker", ""))
            for event in message.get("events", ()):
                pending = link.requests.get(event.get("request_id"))
                if pending is None:
                    continue  # aborted, or already ended by the watchdog
                item = (
                    error_from_event(event)
                    if is_refusal(event)
                    else delta_from_event(event, worker)
                )
                pending.queue.put_nowait(item)
                pending.ended = pending.ended or isinstance(item, EngineError) or item.finished

        def failed(exc: Exception, first: bool) -> None:
            if first:
                log.warning("engine replies: cannot receive from Redis (%s): %r", self.url, exc)

        await consume(link.layer, link.reply_to, handle, failed, 0.5, log)

    async def _watch(self, link: _Link) -> None:
        try:
            while True:
                raise_if_cancelled()
                await asyncio.sleep(WATCH_EVERY_S)
                if not link.requests:
                    link.last_contact = time.monotonic()
                    continue
                try:
                    workers = await asyncio.wait_for(link.registry.live_workers(), REDIS_TIMEOUT_S)
                except REDIS_ERRORS as exc:
                    raise_if_cancelled(exc)
                    if time.monotonic() - link.last_contact > self.dead_after_s:
                        why = f"{LOST_CONTACT}: {self._unreachable(exc)}"
                        self._fail(link, why)
                    continue
                link.last_contact = time.monotonic()
                self._check(link, {w.id: w for w in workers})
        finally:
            with contextlib.suppress(Exception):
                await link.redis.aclose()

    def _check(self, link: _Link, alive: dict[str, WorkerInfo]) -> None:
        """End the requests whose worker is gone, and those their worker has not listed
        for dead_after_s (the request or its last delta was lost on the way)."""
        now = time.monotonic()
        for rid, p in list(link.requests.items()):
            if p.ended:
                continue
            worker = alive.get(p.worker_id)
            if worker is None or worker.incarnation != p.incarnation:
                self._fail(link, WORKER_LOST, [rid])
            elif rid in worker.requests:
                p.unlisted_since = None
            elif p.unlisted_since is None:
                p.unlisted_since = now
            elif now - p.unlisted_since > self.dead_after_s:
                self._fail(link, LOST_ON_THE_WAY, [rid])

    def _fail(self, link: _Link, why: str, rids: list[str] | None = None) -> None:
        """End requests (all, or these) with an error delta."""
        for rid in list(link.requests) if rids is None else rids:
            p = link.requests.pop(rid, None)
            if p is not None and not p.ended:
                log.warning("request %s on engine worker %s ended: %s", rid, p.worker_id, why)
                p.queue.put_nowait(lost_delta(rid, why))

    # --- stats and shutdown -----------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The workers' stats summed (running, waiting, KV blocks, totals), plus a
        `workers` list with each one's load."""
        try:
            workers = self._note(live_workers_sync(self._sync_redis, self.namespace))
        except REDIS_ERRORS as exc:
            return {"running": 0, "waiting": 0, "workers": [], "mode": "distributed",
                    "error": str(self._unreachable(exc))}  # fmt: skip
        self.last_worker_stats = {w.id: w.stats for w in workers}
        out = combine([w.stats for w in workers])
        out.update(
            mode="distributed",
            max_model_len=self._max_model_len,
            workers=[w.summary() for w in workers],
        )
        return out

    def shutdown(self) -> None:
        self._closed = True
        for link in list(self._links.values()):
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                link.loop.call_soon_threadsafe(self._close_link, link)
        self._links.clear()
        self._sync_redis.close()

    def _close_link(self, link: _Link) -> None:
        self._fail(link, "the engine client shut down")
        for task in link.tasks:
            task.cancel()

    async def aclose(self) -> None:
        """Stop this event loop's receiver and watchdog (tests, the benchmark)."""
        link = self._links.pop(asyncio.get_running_loop(), None)
        if link is not None:
            self._close_link(link)
            await asyncio.gather(*link.tasks, return_exceptions=True)


def lost_figures(
    worker_id: str, arrival: float, prompt_tokens: int, output_tokens: int
) -> RequestFigures:
    """What the web side knows of a request whose worker never sent its figures."""
    m = RequestFigures(
        arrival_time=arrival, prompt_tokens=prompt_tokens, output_tokens=output_tokens
    )
    m.worker = worker_id  # type: ignore[attr-defined]  # as delta_from_event does
    return m


# Per-worker stats combined: most add up; these do not.
_LARGEST = {"last_step_seconds"}
_SMALLEST = {"max_model_len", "kv_block_size"}


def combine(stats: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"running": 0, "waiting": 0}
    for key in dict.fromkeys(k for s in stats for k in s):
        values = [s[key] for s in stats if key in s]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(numbers) != len(values):
            out[key] = values[0]  # a description (dtype, device): the first worker's
        elif key in _LARGEST:
            out[key] = max(numbers)
        elif key in _SMALLEST:
            out[key] = min(numbers)
        elif key.endswith("_rate"):
            out[key] = sum(numbers) / len(numbers)
        else:
            out[key] = sum(numbers)
    if out.get("prefix_cache_queries"):
        out["prefix_cache_hit_rate"] = out.get("prefix_cache_hits", 0) / out["prefix_cache_queries"]
    return out
