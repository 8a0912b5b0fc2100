"""Replies across web replicas: with the Redis channel layer (CHANNEL_LAYER=redis) several
web processes serve behind one proxy, and a reply started through one of them can be
resumed or stopped through any other (docs/serving.md, "Several web replicas").

A reply is generated where it started: that process holds its engine stream and saves it.
It records itself in Redis (`<prefix>:chat-reply:<message id>` → the owner's process
channel, renewed while the reply runs, so a crashed owner's entries lapse). Another replica
asked to resume it sends `reply.attach` to that channel with an inbox of its own; the owner
subscribes a viewer (as for a socket of its own, with no await in between), sends the
reply's text and delta count so far (`reply.state`) and then every event, in order, to the
inbox. The replica that attached builds the snapshot from them and forwards the events to
its socket exactly as for a local reply. `reply.detach` ends the viewer (its socket closed);
`reply.stop` stops the reply.

With the in-memory layer (one process) nothing here runs: every reply is local.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from channels.exceptions import ChannelFull
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers, get_channel_layer
from django.conf import settings
from redis import asyncio as aioredis
from redis.exceptions import RedisError

from inference.redis_options import REDIS_OPTIONS

if TYPE_CHECKING:
    from chatapp.chat.generation import Generation, GenerationRegistry

from chatapp.chat.reply import Subscription

log = logging.getLogger(__name__)

# An owner renews its entries this often; one not renewed for ENTRY_TTL_S lapses.
ENTRY_TTL_S = 15
RENEW_S = 5.0
# How long a replica waits for the owner's `reply.state` before it gives up on it.
ATTACH_TIMEOUT_S = 3.0
LAYER_ERRORS = (RedisError, OSError, TimeoutError, ChannelFull)

# Deletes the entry only while it still names this owner: a reply continued later by
# another replica keeps its message id and records itself anew.
_WITHDRAW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def enabled() -> bool:
    return settings.CHANNEL_LAYER == "redis"


def entry_key(message_id: int) -> str:
    return f"{settings.CHANNEL_LAYER_PREFIX}:chat-reply:{message_id}"


@dataclass
class _Loop:
    """This process's side of it on one event loop (daphne runs one; tests may run many)."""

    redis: Any
    channel: str
    layer: Any  # the channel layer `channel` is received on
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    # The replies this process owns and publishes, by message id.
    owned: set[int] = field(default_factory=set)
    # The viewers of other replicas on replies here: inbox → (generation, subscription, task).
    viewers: dict[str, tuple[Generation, Subscription, asyncio.Task[None]]] = field(
        default_factory=dict
    )


class Replicas:
    def __init__(self, registry: GenerationRegistry) -> None:
        self.registry = registry
        self._loops: dict[asyncio.AbstractEventLoop, _Loop] = {}

    async def _here(self) -> _Loop:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is not None:
            return state
        # A layer of this loop's own for the process channel it listens on: channels_redis
        # receives in one event loop per layer, and a listener left on the shared layer
        # by one loop (tests run one per test) held it against every later loop's.
        layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
        channel = await layer.new_channel()
        state = self._loops.get(loop)  # another task set it up meanwhile
        if state is not None:
            return state
        redis = aioredis.Redis.from_url(settings.REDIS_URL, **REDIS_OPTIONS)
        state = _Loop(redis, channel, layer)
        self._loops[loop] = state
        for coro in (self._listen(state), self._renew(state)):
            self._spawn(state, coro)
        return state

    @staticmethod
    def _spawn(state: _Loop, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        state.tasks.add(task)
        task.add_done_callback(state.tasks.discard)
        return task

    # --- the owner's side -------------------------------------------------------------

    async def publish(self, message_id: int) -> None:
        """Record that this process generates the reply (failing open: without Redis the
        reply runs on, resumable here only)."""
        try:
            state = await self._here()
            await state.redis.set(entry_key(message_id), state.channel, ex=ENTRY_TTL_S)
            state.owned.add(message_id)
        except LAYER_ERRORS as exc:
            log.warning("reply %s not recorded for other replicas: %r", message_id, exc)

    async def withdraw(self, message_id: int) -> None:
        state = self._loops.get(asyncio.get_running_loop())
        if state is None or message_id not in state.owned:
            return
        state.owned.discard(message_id)
        try:
            await state.redis.eval(_WITHDRAW, 1, entry_key(message_id), state.channel)
        except LAYER_ERRORS as exc:
            log.warning("reply %s: entry left to lapse: %r", message_id, exc)

    async def _renew(self, state: _Loop) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            if not state.owned:
                continue
            try:
                pipe = state.redis.pipeline(transaction=False)
                for mid in state.owned:
                    pipe.set(entry_key(mid), state.channel, ex=ENTRY_TTL_S)
                await pipe.execute()
            except LAYER_ERRORS as exc:
                log.warning("could not renew the replies' entries: %r", exc)

    async def _listen(self, state: _Loop) -> None:
        while True:
            try:
                message = await state.layer.receive(state.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("reply channel %s: %r", state.channel, exc)
                await asyncio.sleep(1.0)
                continue
            kind = message.get("type")
            gen = self.registry.get(int(message.get("message_id") or 0))
            if kind == "reply.attach":
                inbox = str(message["to"])
                if gen is None or gen.finished:
                    self._spawn(state, _send(inbox, {"type": "reply.gone"}))
                    continue
                # Subscribed and read with no await in between: no delta slips past.
                sub = gen.subscribe()
                first = {"type": "reply.state", "text": gen.text, "seq": gen.deltas_sent}
                task = self._spawn(state, self._forward(state, gen, sub, inbox, first))
                state.viewers[inbox] = (gen, sub, task)
            elif kind == "reply.detach":
                viewer = state.viewers.pop(str(message.get("to")), None)
                if viewer is not None:
                    viewer[2].cancel()
            elif kind == "reply.stop" and gen is not None:
                gen.stop("abort")

    async def _forward(
        self, state: _Loop, gen: Generation, sub: Subscription, inbox: str, first: dict
    ) -> None:
        try:
            await _send(inbox, first)
            while True:
                event = await sub.queue.get()
                await _send(inbox, {"type": "reply.event", "event": event})
                if event["type"] == "done":
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # its replica is gone or stopped reading
            log.info("viewer %s of reply %s dropped: %r", inbox, gen.message_id, exc)
        finally:
            viewer = state.viewers.get(inbox)
            if viewer is not None and viewer[1] is sub:
                state.viewers.pop(inbox, None)
            gen.unsubscribe(sub)

    # --- another replica's side -------------------------------------------------------

    async def owner(self, message_id: int) -> str | None:
        """The process channel of the replica generating this reply, if one is."""
        state = await self._here()
        raw = await state.redis.get(entry_key(message_id))
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    async def find(self, message_id: int) -> RemoteReply | None:
        """The reply as generated by another replica, attached; None when none is (or its
        owner did not answer within ATTACH_TIMEOUT_S)."""
        try:
            owner = await self.owner(message_id)
            if owner is None:
                return None
            state = await self._here()
            if owner == state.channel:
                return None  # ours, and finished meanwhile
            reply = RemoteReply(message_id, owner)
            return reply if await reply.attach() else None
        except LAYER_ERRORS as exc:
            log.warning("reply %s: other replicas out of reach: %r", message_id, exc)
            return None

    async def stop(self, message_id: int) -> None:
        with contextlib.suppress(*LAYER_ERRORS):
            owner = await self.owner(message_id)
            if owner is not None:
                await _send(owner, {"type": "reply.stop", "message_id": message_id})


async def _send(channel: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    assert layer is not None
    await layer.send(channel, message)


class RemoteReply:
    """A reply generated by another replica, as a socket here watches it: what the
    consumer's forwarder needs of a Generation (message_id, text, deltas_sent, finished,
    subscribe, unsubscribe, stop)."""

    def __init__(self, message_id: int, owner: str) -> None:
        self.message_id = message_id
        self.owner = owner
        self.text = ""
        self.deltas_sent = 0
        self.finished = False
        self.inbox = ""
        self.sub = Subscription()
        self._task: asyncio.Task[None] | None = None

    async def attach(self) -> bool:
        layer = get_channel_layer()
        assert layer is not None
        self.inbox = await layer.new_channel()
        await _send(
            self.owner, {"type": "reply.attach", "message_id": self.message_id, "to": self.inbox}
        )
        try:
            first = await asyncio.wait_for(layer.receive(self.inbox), ATTACH_TIMEOUT_S)
        except TimeoutError:
            log.warning("reply %s: its replica did not answer", self.message_id)
            return False
        if first.get("type") != "reply.state":
            return False  # ended meanwhile: the database has it whole
        self.text, self.deltas_sent = str(first["text"]), int(first["seq"])
        self._task = asyncio.get_running_loop().create_task(self._receive())
        return True

    async def _receive(self) -> None:
        layer = get_channel_layer()
        assert layer is not None
        try:
            while True:
                message = await layer.receive(self.inbox)
                event = message["event"]
                self.sub.queue.put_nowait(event)
                if event["type"] == "done":
                    self.finished = True
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("reply %s: lost its replica's events: %r", self.message_id, exc)
            self.sub.queue.put_nowait(
                {
                    "type": "error",
                    "code": "unavailable",
                    "message": "Lost contact with the server writing this reply; reload to see it.",
                    "message_id": self.message_id,
                }
            )

    def subscribe(self) -> Subscription:
        return self.sub

    def unsubscribe(self, sub: Subscription) -> None:
        if self._task is not None:
            self._task.cancel()
        if not self.finished:
            self.finished = True
            message = {"type": "reply.detach", "to": self.inbox}
            asyncio.get_running_loop().create_task(_quietly(_send(self.owner, message)))

    def stop(self, reason: str = "abort") -> None:
        message = {"type": "reply.stop", "message_id": self.message_id}
        asyncio.get_running_loop().create_task(_quietly(_send(self.owner, message)))


async def _quietly(coro: Any) -> None:
    with contextlib.suppress(*LAYER_ERRORS):
        await coro
