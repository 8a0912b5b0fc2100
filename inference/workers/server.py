"""An engine worker: takes requests from its channel, runs them on an AsyncEngine, and
streams the deltas back over the Redis channel layer.

    server = WorkerServer(engine, url="redis://127.0.0.1:6379/3")
    await server.run(stop)          # until stop (an asyncio.Event) is set

Deltas are coalesced per reply channel: a request's first delta (its TTFT) and last go
out at once; the others wait up to `flush_s` and travel together with every other delta
bound for the same web process, one channel message per flush. A busy worker so sends
about 1 / flush_s messages per second to each web process, not one per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from channels.exceptions import ChannelFull
from redis import asyncio as aioredis

from inference.catalog import created_at
from inference.engine.errors import EngineError, InvalidRequestError
from inference.workers.protocol import (
    REDIS_ERRORS,
    REDIS_OPTIONS,
    STOPPED,
    EngineUnavailableError,
    consume,
    default_worker_id,
    delta_event,
    lost_delta,
    open_layer,
    raise_if_cancelled,
    refusal_event,
    sampling_from_dict,
    send,
    worker_channel,
)
from inference.workers.registry import Registry, WorkerInfo

log = logging.getLogger(__name__)

# A send that does not complete in this long counts as failed (and is retried).
SEND_TIMEOUT_S = 2.0
# Deltas for a reply channel that cannot be sent for this long are dropped and their
# requests aborted: the web side has given up on them by then (WORKER_DEAD_AFTER_S).
GIVE_UP_S = 10.0
# Load changes trigger a heartbeat, at most this often.
BEAT_AT_MOST_EVERY_S = 0.1


@dataclass
class _Request:
    task: asyncio.Task[None]
    reply_to: str


class WorkerServer:
    def __init__(
        self,
        engine: Any,
        *,
        url: str,
        namespace: str = "engine",
        worker_id: str | None = None,
        model: str = "",
        model_path: str = "",
        flush_s: float = 0.015,
        dead_after_s: float = 3.0,
        drain_s: float = 0.0,
    ) -> None:
        self.engine = engine
        self.url = url
        self.namespace = namespace
        self.id = worker_id or default_worker_id()
        self.channel = worker_channel(self.id)
        self.model = model
        self.model_path = model_path
        self.model_created = created_at(model_path) if model_path else 0
        self.flush_s = max(0.0, flush_s)
        self.dead_after_s = dead_after_s
        # On stop, how long the replies in flight get to finish before they are cut.
        self.drain_s = max(0.0, drain_s)
        self.draining = False
        # Three beats fit in the time after which the web side declares a worker dead.
        self.heartbeat_s = min(1.0, dead_after_s / 3)
        self.incarnation = uuid.uuid4().hex
        self.requests: dict[str, _Request] = {}
        self.outbox: dict[str, list[dict[str, Any]]] = {}
        self.messages_sent = 0
        self._failing_since: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._load_changed = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self.layer: Any = None
        self.registry: Registry | None = None

    # --- life -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; then end in-flight requests with an error delta,
        deregister and return."""
        self.layer = open_layer(self.url, self.namespace)
        redis = aioredis.Redis.from_url(self.url, **REDIS_OPTIONS)
        self.registry = Registry(redis, self.namespace, self.dead_after_s)
        receiver = asyncio.create_task(self._receive_loop(), name="worker-receive")
        loops = [
            asyncio.create_task(self._beat_loop(), name="worker-beat"),
            asyncio.create_task(self._flush_loop(), name="worker-flush"),
        ]
        stopping = asyncio.create_task(stop.wait())
        log.info("engine worker %s serving on %s (%s)", self.id, self.channel, self.url)
        try:
            done, _ = await asyncio.wait(
                [stopping, receiver, *loops], return_when=asyncio.FIRST_COMPLETED
            )
            for task in done - {stopping}:
                log.error("worker loop %s ended: %r", task.get_name(), task.exception())
        finally:
            stopping.cancel()
            await self._shut_down(receiver, loops)
            await redis.aclose()

    async def _shut_down(self, receiver: asyncio.Task[None], loops: list[asyncio.Task]) -> None:
        await self._drain()
        receiver.cancel()  # stop taking work
        in_flight = list(self.requests.items())
        for rid, req in in_flight:
            req.task.cancel()  # the engine aborts it
            self._post(req.reply_to, delta_event(lost_delta(rid, STOPPED)), urgent=True)
        await _settle([req.task for _, req in in_flight])
        with contextlib.suppress(*REDIS_ERRORS):
            await asyncio.wait_for(self._flush(), SEND_TIMEOUT_S * 2)
        assert self.registry is not None
        with contextlib.suppress(*REDIS_ERRORS):
            await asyncio.wait_for(self.registry.remove(self.id), SEND_TIMEOUT_S)
        for task in (*loops, *self._background):
            task.cancel()
        await _settle([receiver, *loops, *self._background])
        log.info("engine worker %s stopped", self.id)

    async def _drain(self) -> None:
        """Take no new request (the next beat says `draining`, so none is routed here, and
        one already on its way is refused as unavailable) and give the replies in flight up
        to drain_s to finish; the heartbeat goes on meanwhile, so the web side keeps
        waiting for them. What is left at the deadline is cut by the caller."""
        self.draining = True
        self._load_changed.set()
        if self.requests and self.drain_s > 0:
            log.info(
                "engine worker %s draining: %d replies, %.0f s to finish",
                self.id,
                len(self.requests),
                self.drain_s,
            )
            await _settle([req.task for req in self.requests.values()], self.drain_s)
            if self.requests:
                log.warning(
                    "engine worker %s: cutting %d replies at the drain deadline",
                    self.id,
                    len(self.requests),
                )

    def info(self) -> WorkerInfo:
        stats = dict(self.engine.stats())
        total = int(stats.get("kv_blocks_total") or 0)
        return WorkerInfo(
            id=self.id,
            channel=self.channel,
            incarnation=self.incarnation,
            model=self.model,
            model_path=self.model_path,
            model_created=self.model_created,
            host=socket.gethostname(),
            max_model_len=int(self.engine.max_model_len),
            running=int(stats.get("running") or 0),
            waiting=int(stats.get("waiting") or 0),
            kv_usage=int(stats.get("kv_blocks_used") or 0) / total if total else 0.0,
            requests=list(self.requests),
            draining=self.draining,
            stats={**stats, "messages_sent": self.messages_sent, "streams": len(self.requests)},
        )

    async def _beat_loop(self) -> None:
        """Beat every heartbeat_s, and soon after a request arrives, is scheduled (its first
        delta) or ends, so that the load the web side routes by and shows is fresh."""
        assert self.registry is not None
        failing = False
        while True:
            raise_if_cancelled()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._load_changed.wait(), self.heartbeat_s)
            self._load_changed.clear()
            try:
                await asyncio.wait_for(self.registry.beat(self.info()), SEND_TIMEOUT_S)
                if failing:
                    log.info("engine worker %s reached Redis again", self.id)
                failing = False
            except REDIS_ERRORS as exc:
                raise_if_cancelled(exc)
                if not failing:
                    log.warning(
                        "engine worker %s cannot reach Redis (%s): %s", self.id, self.url, exc
                    )
                failing = True
            await asyncio.sleep(BEAT_AT_MOST_EVERY_S)

    # --- requests in ------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        def failed(exc: Exception, first: bool) -> None:
            log.debug("receive on %s failed: %r", self.channel, exc)

        await consume(self.layer, self.channel, self._handle, failed, 1.0, log)

    def _handle(self, message: dict[str, Any]) -> None:
        kind, rid = message.get("type"), str(message.get("request_id"))
        if kind == "generate":
            reply_to = message["reply_to"]
            if rid in self.requests:
                error = InvalidRequestError(f"request id {rid!r} is already streaming")
                self._post(reply_to, refusal_event(rid, error), urgent=True)
                return
            if self.draining:
                # Routed here before the routing saw the `draining` beat.
                busy = EngineUnavailableError(f"engine worker {self.id} is shutting down")
                self._post(reply_to, refusal_event(rid, busy), urgent=True)
                return
            wanted = message.get("model") or ""
            if wanted and self.model and wanted != self.model:
                # Routed here by a stale registration: refused as unavailable, so a retry is
                # routed afresh.
                stale = EngineUnavailableError(
                    f"engine worker {self.id} serves {self.model!r}, not {wanted!r}"
                )
                self._post(reply_to, refusal_event(rid, stale), urgent=True)
                return
            task = asyncio.create_task(self._serve(rid, message), name=f"serve-{rid}")
            self.requests[rid] = _Request(task, reply_to)
            self._load_changed.set()
        elif kind == "abort":
            if rid in self.requests:
                self.engine.abort(rid)  # the engine answers with a final "abort" delta
        else:
            log.warning("engine worker %s: unknown message type %r", self.id, kind)

    async def _serve(self, rid: str, message: dict[str, Any]) -> None:
        reply_to, session_id = message["reply_to"], message.get("session_id")
        first = True
        try:
            stream = self.engine.generate(
                message["prompt"],
                sampling_from_dict(message["sampling"]),
                session_id=session_id,
                request_id=rid,
                cache_salt=message.get("cache_salt"),
                shared_prefix_tokens=int(message.get("shared_prefix_tokens") or 0),
            )
            async for delta in stream:
                self._post(reply_to, delta_event(delta), urgent=first or delta.finished)
                if first:
                    # Scheduled now: the next beat shows it running, not waiting, at once.
                    self._load_changed.set()
                    if session_id:
                        self._spawn(self._note_affinity(session_id))
                first = False
        except EngineError as exc:  # refused before the first delta
            self._post(reply_to, refusal_event(rid, exc), urgent=True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("engine worker %s: request %s failed", self.id, rid)
            event = (
                refusal_event(rid, EngineError(f"the engine worker failed: {exc}"))
                if first
                else delta_event(lost_delta(rid, f"the engine worker failed: {exc}"))
            )
            self._post(reply_to, event, urgent=True)
        finally:
            self.requests.pop(rid, None)
            self._load_changed.set()

    async def _note_affinity(self, session_id: str) -> None:
        assert self.registry is not None
        with contextlib.suppress(*REDIS_ERRORS):
            await asyncio.wait_for(
                self.registry.set_affinity(session_id, self.id, self.model), SEND_TIMEOUT_S
            )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- deltas out -------------------------------------------------------------------

    def _post(self, reply_to: str, event: dict[str, Any], urgent: bool = False) -> None:
        self.outbox.setdefault(reply_to, []).append(event)
        self._wake.set()
        if urgent:
            self._urgent.set()

    async def _flush_loop(self) -> None:
        while True:
            raise_if_cancelled()
            await self._wake.wait()
            if not self._urgent.is_set() and self.flush_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), self.flush_s)
            self._wake.clear()
            self._urgent.clear()
            await self._flush()
            if self.outbox and not self._wake.is_set():
                await asyncio.sleep(0.2)  # sends failed: retry shortly
                self._wake.set()

    async def _flush(self) -> None:
        """One message per reply channel with everything waiting for it, in order."""
        async with self._flush_lock:
            await self._send_outbox()

    async def _send_outbox(self) -> None:
        outbox, self.outbox = self.outbox, {}
        for reply_to, events in outbox.items():
            message = {"type": "events", "worker": self.id, "events": events}
            try:
                await send(self.layer, reply_to, message, SEND_TIMEOUT_S)
                self.messages_sent += 1
                self._failing_since.pop(reply_to, None)
            except ChannelFull:
                log.warning("reply channel %s is full: its web process stopped reading", reply_to)
                self._drop_channel(reply_to)
            except REDIS_ERRORS as exc:
                raise_if_cancelled(exc)
                since = self._failing_since.setdefault(reply_to, time.monotonic())
                if time.monotonic() - since > GIVE_UP_S:
                    log.warning("giving up on reply channel %s: %s", reply_to, exc)
                    self._drop_channel(reply_to)
                else:  # keep them, in order, ahead of anything posted meanwhile
                    self.outbox[reply_to] = events + self.outbox.get(reply_to, [])
            except Exception:  # a message that cannot be packed: drop it, keep serving
                log.exception("engine worker %s: could not send to %s", self.id, reply_to)

    def _drop_channel(self, reply_to: str) -> None:
        self._failing_since.pop(reply_to, None)
        self.outbox.pop(reply_to, None)
        for req in list(self.requests.values()):
            if req.reply_to == reply_to:
                req.task.cancel()


async def _settle(tasks: list[asyncio.Task[Any]], timeout: float = 5.0) -> None:
    """Wait for cancelled tasks to end, but not forever: shutdown must finish."""
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)
