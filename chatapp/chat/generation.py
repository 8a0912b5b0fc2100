"""One assistant reply being generated, decoupled from the socket that asked for it.

A reply outlives its socket for CHAT_DISCONNECT_GRACE_S, so that a page refresh or a
dropped connection can `resume` it; viewers subscribe and get every delta from then
on. The reply is saved as it streams (by the one checkpoint writer, every
CHAT_CHECKPOINT_INTERVAL_S: checkpoints.py) and once at the end with its figures and why
it ended, so a stop, disconnect or error loses nothing that was generated, and a crash
loses about an interval of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from chatapp.chat import checkpoints, replicas, titles
from chatapp.chat.conversations import message_json
from chatapp.chat.models import Message
from chatapp.chat.reply import Reply, Subscription
from chatapp.events import send_request_ended
from chatapp.slots import Lease, LimitReached, Locked, leases
from inference.client import Prompt, get_engine_client, prefix_cache_salt
from inference.engine import (
    EngineBusyError,
    EngineError,
    PromptTooLongError,
    RequestFigures,
    SamplingParams,
)
from inference.workers.protocol import is_worker_lost

log = logging.getLogger(__name__)

# Why a reply ended → the status it is saved with.
STATUS_FOR_FINISH = {
    "stop": Message.Status.COMPLETE,
    "length": Message.Status.COMPLETE,
    "abort": Message.Status.STOPPED,
    "disconnect": Message.Status.STOPPED,
    # Cut by a drain (SIGTERM) past CHAT_DRAIN_S: the text so far is kept.
    "shutdown": Message.Status.STOPPED,
    "error": Message.Status.ERROR,
}

ERROR_TEXT = {
    "busy": "The server is busy right now. Please try again in a moment.",
    "too_long": "This conversation is too long for the model. Start a new chat.",
    "engine_unavailable": "The model is not available right now. Please try again shortly.",
    "engine_error": "The model failed while writing this reply.",
    "worker_lost": "The engine worker writing this reply stopped. What it wrote is saved; "
    "send your message again to continue.",
    "model_not_found": "This conversation's model is not served any more. Pick another "
    "model and send again.",
}


def model_missing_text(model: str) -> str:
    """What the chat says when a turn names a model no engine serves."""
    return f"The model “{model[:100]}” is not served here. Pick another model and send again."


def message_figures(m: RequestFigures | None) -> dict[str, Any]:
    """The figures a reply keeps (Message.figures, the done frame's `figures`)."""
    if m is None:
        return {}
    decode_s = None
    if m.first_token_time is not None and m.finish_time is not None:
        decode_s = m.finish_time - m.first_token_time
    tps = (m.output_tokens - 1) / decode_s if decode_s and m.output_tokens > 1 else None
    # Upstream servers and replays have no Redis tier: their figure stays 0.
    redis_tokens = int(getattr(m, "cached_tokens_redis", 0) or 0)

    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 1)

    figures = {
        "ttft_ms": ms(m.ttft),
        "output_tokens": m.output_tokens,
        "tokens_per_s": None if tps is None else round(tps, 1),
        "prompt_tokens": m.prompt_tokens,
        # Both tiers, as the API's usage counts them; the Redis part on its own, so the UI
        # can tell a turn served from memory from one restored from the KV tier.
        "cached_tokens": m.cached_tokens + redis_tokens,
        "cached_tokens_redis": redis_tokens,
        "e2e_ms": ms(m.e2e),
        "queue_ms": ms(m.queue_time),
    }
    if getattr(m, "replayed", False):
        figures["replayed"] = True  # from the response cache; the UI marks the reply
    return figures


def done_event(
    message_id: int, status: str, finish_reason: str | None, figures: dict, message: dict
) -> dict[str, Any]:
    """The `done` frame that ends a reply (docs/websocket.md)."""
    return {
        "type": "done",
        "message_id": message_id,
        "status": status,
        "finish_reason": finish_reason,
        "figures": figures,
        "message": message,
    }


class Generation:
    def __init__(
        self,
        registry: GenerationRegistry,
        message: Message,
        prompt: Prompt,
        sampling: SamplingParams,
    ) -> None:
        self.registry = registry
        self.message_id: int = message.pk
        self.conversation_id: int = message.conversation_id
        self.owner_id: int | None = getattr(message.conversation, "owner_id", None)
        # The model writing it (blank: the default model).
        self.model: str = message.model
        self.prompt = prompt
        self.sampling = sampling
        self.request_id = f"chat-{message.pk}-{uuid.uuid4().hex[:8]}"
        # A reply written on (Continue) starts from what it holds; a new one holds nothing.
        self.text = message.text
        self.token_ids: list[int] = list(message.token_ids)
        # Delta frames published so far: each frame's `seq` (docs/websocket.md).
        self.deltas_sent = 0
        self.finished = False
        self.stop_reason: str | None = None
        self.subscribers: set[Subscription] = set()
        self._grace: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None
        # Its slot in the limits shared by the web replicas (its reservation's).
        self.lease: Lease | None = None

    # --- viewers --------------------------------------------------------------------

    def subscribe(self) -> Subscription:
        sub = Subscription()
        self.subscribers.add(sub)
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self.subscribers.discard(sub)
        if not self.subscribers and not self.finished:
            grace = float(settings.CHAT_DISCONNECT_GRACE_S)
            if grace <= 0:
                self.stop("disconnect")
            else:
                loop = asyncio.get_running_loop()
                self._grace = loop.call_later(grace, self._stop_if_unwatched)

    def _stop_if_unwatched(self) -> None:
        self._grace = None
        if not self.subscribers:
            self.stop("disconnect")

    def _publish(self, event: dict[str, Any]) -> None:
        for sub in list(self.subscribers):
            sub.queue.put_nowait(event)

    # --- control --------------------------------------------------------------------

    def stop(self, reason: str = "abort") -> None:
        if self.finished:
            return
        self.stop_reason = self.stop_reason or reason
        with contextlib.suppress(EngineError):
            get_engine_client(self.model or None).abort(self.request_id)

    async def run(self) -> None:
        finish_reason = "error"
        error_code: str | None = None
        figures: RequestFigures | None = None
        try:
            shared = self.registry.replicas()
            if shared is not None:
                # Other web replicas find it there, to resume or stop it.
                await shared.publish(self.message_id)
            if self.lease is not None and len(self.lease.keys) == 1:
                # A new conversation's first reply: its id exists from now on.
                self.lease = await leases.with_lock(
                    self.lease, f"chat-conversation:{self.conversation_id}"
                )
            client = await asyncio.to_thread(get_engine_client, self.model or None)
            # The owner's scope: nobody else's prefix or response cache sees this prompt.
            salt = prefix_cache_salt(self.owner_id) if self.owner_id is not None else None
            stream = client.stream(
                self.prompt,
                self.sampling,
                session_id=f"conversation-{self.conversation_id}",
                request_id=self.request_id,
                cache_salt=salt,
            )
            async for delta in stream:
                if delta.token_ids:
                    self.token_ids.extend(delta.token_ids)
                # A byte-level tokenizer can emit NUL, which PostgreSQL's text refuses: the
                # reply drops it, on the screen and in the database alike.
                text = delta.text.replace("\x00", "")
                if text:
                    self.text += text
                    self.deltas_sent += 1
                    self._publish(
                        {
                            "type": "delta",
                            "message_id": self.message_id,
                            "text": text,
                            "seq": self.deltas_sent,
                        }
                    )
                if delta.finished:
                    finish_reason = delta.finish_reason or "stop"
                    figures = delta.figures
                    if finish_reason == "error":
                        error_code = "worker_lost" if is_worker_lost(delta) else "engine_error"
                        log.error("engine error on %s: %s", self.request_id, delta.error)
                if text:
                    checkpoints.writer.changed(self.message_id, self._progress, self._gone)
        except EngineBusyError:
            error_code = "busy"
        except PromptTooLongError:
            error_code = "too_long"
        except EngineError as exc:
            error_code = getattr(exc, "code", "engine_error")
            if error_code not in ERROR_TEXT:
                error_code = "engine_error"
            log.warning("generation %s failed: %s", self.request_id, exc)
        except asyncio.CancelledError:  # the server is shutting down
            finish_reason = "abort"
            raise
        except Exception:
            log.exception("generation %s crashed", self.request_id)
            error_code = "engine_error"
        finally:
            if finish_reason == "abort" and self.stop_reason in ("disconnect", "shutdown"):
                finish_reason = self.stop_reason
            await self._finish(
                finish_reason if error_code is None else "error", error_code, figures
            )

    def _progress(self) -> checkpoints.Progress:
        return checkpoints.Progress(self.message_id, self.text)

    def _gone(self) -> None:
        # Deleted with its conversation: nobody can see this reply any more.
        self.stop("abort")

    async def _finish(
        self, finish_reason: str, error_code: str | None, m: RequestFigures | None
    ) -> None:
        self.finished = True
        checkpoints.writer.forget(self.message_id)
        if self._grace is not None:
            self._grace.cancel()
        status = STATUS_FOR_FINISH.get(finish_reason, Message.Status.ERROR)
        figures = message_figures(m)
        error_text = ERROR_TEXT.get(error_code, "") if error_code else ""
        message = await asyncio.shield(self._save_final(status, finish_reason, figures, error_text))
        # The conversation is free before its client hears `done`: a client may send the
        # next turn the moment it does, and would be refused as already streaming.
        shared = self.registry.replicas()
        if shared is not None:
            await asyncio.shield(shared.withdraw(self.message_id))
        self.registry.forget(self)
        await asyncio.shield(leases.release(self.lease))
        if error_code:
            self._publish(
                {
                    "type": "error",
                    "code": error_code,
                    "message": error_text,
                    "conversation_id": self.conversation_id,
                    "message_id": self.message_id,
                }
            )
        self._publish(done_event(self.message_id, status, finish_reason, figures, message))
        await send_request_ended(
            "chat",
            self.request_id,
            m,
            finish_reason,
            error_code,
            conversation_id=self.conversation_id,
            user_id=self.owner_id,
            model=self.model,
        )
        if status == Message.Status.COMPLETE:
            # The conversation's first complete reply asks for its title (titles.py).
            await database_sync_to_async(titles.maybe_start)(self.conversation_id)

    @database_sync_to_async
    def _save_final(
        self, status: str, finish_reason: str, figures: dict, error: str
    ) -> dict[str, Any]:
        # A briefly locked database must not lose the reply: retry before giving up.
        for attempt in range(5):
            try:
                # An UPDATE of the fields this reply owns, never a save() of a loaded copy:
                # were the conversation deleted in between, that save would insert it again.
                saved = Message.objects.filter(pk=self.message_id).update(
                    text=self.text,
                    token_ids=list(self.token_ids),
                    tokens=len(self.token_ids) or None,
                    status=status,
                    finish_reason=finish_reason,
                    figures=figures,
                    error=error,
                    updated_at=timezone.now(),
                )
                msg = Message.objects.filter(pk=self.message_id).first() if saved else None
                if msg is None:
                    # The conversation was deleted while the reply streamed.
                    return {"id": self.message_id, "text": self.text, "status": status}
                return message_json(msg, with_alternatives=True)
            except Exception:
                if attempt == 4:
                    log.exception("could not save reply %s", self.message_id)
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")


class AlreadyStreaming(Exception):
    """A reply is already being written (or about to be) in that conversation."""


# How long a drain waits after the last reply ended, for its final frames to go out.
DRAIN_FLUSH_S = 0.5


class Draining(Exception):
    """This process is shutting down: it starts no new reply."""


class TooManyStreams(Exception):
    def __init__(self, active: int) -> None:
        super().__init__(f"{active} replies streaming")
        self.active = active


@dataclass(eq=False)
class Reservation:
    """A stream slot claimed for a reply that is not registered yet."""

    owner_id: int
    conversation_id: int | None
    # The same slot across the web replicas (claim), while it has one.
    lease: Lease | None = None


class GenerationRegistry:
    """The replies generating in this process, by message and by conversation, and the
    slots reserved for replies still being prepared."""

    def __init__(self) -> None:
        self.by_message: dict[int, Generation] = {}
        self.by_conversation: dict[int, int] = {}
        self.reserved: set[Reservation] = set()
        self.draining = False
        self._replicas: replicas.Replicas | None = None

    def replicas(self) -> replicas.Replicas | None:
        """The replies of the other web replicas (the Redis channel layer); None in a
        single process (the in-memory layer)."""
        if not replicas.enabled():
            return None
        if self._replicas is None:
            self._replicas = replicas.Replicas(self)
        return self._replicas

    async def find(self, message_id: int) -> Reply | None:
        """The reply being generated, here or by another web replica (attached)."""
        gen = self.get(message_id)
        if gen is not None:
            return gen
        shared = self.replicas()
        return await shared.find(message_id) if shared is not None else None

    async def stop(self, message_id: int) -> None:
        """Stop the reply, wherever it is being generated."""
        gen = self.get(message_id)
        if gen is not None:
            gen.stop("abort")
            return
        shared = self.replicas()
        if shared is not None:
            await shared.stop(message_id)

    def get(self, message_id: int) -> Generation | None:
        return self.by_message.get(message_id)

    def streaming_for_user(self, owner_id: int) -> int:
        running = sum(
            1 for g in self.by_message.values() if g.owner_id == owner_id and not g.finished
        )
        return running + sum(1 for r in self.reserved if r.owner_id == owner_id)

    def streaming_in(self, conversation_id: int) -> Generation | None:
        mid = self.by_conversation.get(conversation_id)
        return self.by_message.get(mid) if mid is not None else None

    def reserve(self, owner_id: int, conversation_id: int | None, limit: int) -> Reservation:
        """Check the limits and claim a slot in one step, with no await in between: two
        frames that check at the same moment cannot both pass. The caller must either
        `start` the reply with it or `release` it, on every path."""
        if self.draining:
            raise Draining
        if conversation_id is not None and (
            self.streaming_in(conversation_id) is not None
            or any(r.conversation_id == conversation_id for r in self.reserved)
        ):
            raise AlreadyStreaming
        active = self.streaming_for_user(owner_id)
        if active >= limit:
            raise TooManyStreams(active)
        reservation = Reservation(owner_id, conversation_id)
        self.reserved.add(reservation)
        return reservation

    async def claim(self, reservation: Reservation, limit: int) -> None:
        """The reservation's slot across every web replica too (chatapp/slots.py; nothing
        in one process): raises as `reserve` does, with the reservation given back."""
        conv = reservation.conversation_id
        try:
            reservation.lease = await leases.acquire(
                f"chat-streams:{reservation.owner_id}",
                limit,
                lock=f"chat-conversation:{conv}" if conv is not None else None,
            )
        except LimitReached as exc:
            self.release(reservation)
            raise TooManyStreams(exc.held) from exc
        except Locked as exc:
            self.release(reservation)
            raise AlreadyStreaming from exc
        except BaseException:
            self.release(reservation)
            raise

    def release(self, reservation: Reservation) -> None:
        """Give back a slot whose reply never started (idempotent)."""
        self.reserved.discard(reservation)
        lease, reservation.lease = reservation.lease, None
        leases.release_soon(lease)

    def start(
        self,
        message: Message,
        prompt: Prompt,
        sampling: SamplingParams,
        reservation: Reservation | None = None,
    ) -> Generation:
        gen = Generation(self, message, prompt, sampling)
        if reservation is not None:
            # The slot passes from the reservation to the generation in one step.
            self.reserved.discard(reservation)
            gen.lease, reservation.lease = reservation.lease, None
        self.by_message[gen.message_id] = gen
        self.by_conversation[gen.conversation_id] = gen.message_id
        return gen

    def launch(self, gen: Generation) -> None:
        gen.task = asyncio.get_running_loop().create_task(gen.run(), name=gen.request_id)

    def forget(self, gen: Generation) -> None:
        self.by_message.pop(gen.message_id, None)
        if self.by_conversation.get(gen.conversation_id) == gen.message_id:
            self.by_conversation.pop(gen.conversation_id, None)

    async def drain(self, deadline_s: float) -> None:
        """Shut down without losing a reply: start none, let the running ones finish for up
        to `deadline_s`, then cut the rest (finish "shutdown") and wait for them to save."""
        self.draining = True
        running = [g.task for g in self.by_message.values() if g.task is not None]
        if not running:
            return
        log.info("draining: %d replies running, %.0f s to finish", len(running), deadline_s)
        _, late = await asyncio.wait(running, timeout=deadline_s)
        if late:
            log.warning("draining: cutting %d replies at the deadline", len(late))
            for gen in list(self.by_message.values()):
                gen.stop("shutdown")
            # Each saves its text and figures once its stream ends (at once on abort).
            await asyncio.wait(late, timeout=10)
        # The sockets still have to send each reply's `done` frame before the server
        # closes them.
        await asyncio.sleep(DRAIN_FLUSH_S)


registry = GenerationRegistry()


def message_snapshot(gen: Reply, message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "text": gen.text, "status": Message.Status.STREAMING, "seq": gen.deltas_sent}
