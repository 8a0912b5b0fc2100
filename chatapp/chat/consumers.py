"""The chat WebSocket (/ws/chat/). Protocol: docs/websocket.md.

Every frame is validated against its schema (chatapp/chat/protocol.py) before a handler
sees it; anything wrong gets an `error` frame and the socket stays open. Generation itself
lives in chatapp.chat.generation so a reply survives the socket that asked for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from types import SimpleNamespace
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from pydantic import ValidationError
from redis.exceptions import RedisError

from chatapp.chat import attachments, conversations, instructions, temporary
from chatapp.chat.attachments import AttachmentsInvalid
from chatapp.chat.conversations import InvalidSettings, NotFound
from chatapp.chat.generation import (
    ERROR_TEXT,
    AlreadyStreaming,
    Draining,
    Generation,
    Reservation,
    TooManyStreams,
    done_event,
    message_snapshot,
    model_missing_text,
    registry,
)
from chatapp.chat.models import Conversation, Message
from chatapp.chat.protocol import (
    AnyFrame,
    ContinueFrame,
    EditFrame,
    PingFrame,
    RegenerateFrame,
    ResumeFrame,
    SendFrame,
    StopFrame,
    frame_error,
    parse_frame,
)
from chatapp.chat.reply import Reply, Subscription
from chatapp.chat.user_sockets import join, leave, remember_loop, session_user_id
from chatapp.ratelimit import counted_usage
from chatapp.text import InvalidText
from inference.client import (
    EngineUnavailableError,
    ModelNotFoundError,
    Prompt,
    default_model,
    get_engine_client,
    prefix_cache_salt,
)
from inference.engine import SamplingParams

log = logging.getLogger(__name__)

# The channel layer (Redis) does not answer: the socket closes with this code, which the
# page explains and retries with backoff (docs/websocket.md, "Close codes").
LAYER_AWAY = 4503
LAYER_ERRORS = (RedisError, OSError, TimeoutError)


class FrameError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def reply_sampling(conv: Conversation) -> SamplingParams:
    """A reply's sampling, from its conversation's settings. JSON mode holds the reply to a
    JSON object while decoding: the grammar of the API's `response_format: json_object`."""
    return SamplingParams(
        max_tokens=conv.max_tokens,
        temperature=conv.temperature,
        top_p=conv.top_p if conv.top_p > 0 else 1.0,
        structured="json" if conv.json_mode else None,
    )


class ChatConsumer(AsyncJsonWebsocketConsumer):
    in_group = False
    signed_out = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            # Accept, then close: a socket refused during the handshake reaches the page
            # as a bare 1006 (which it retries); 4401 tells it that it is signed out.
            self.signed_out = True
            await self.accept()
            await self.close(code=4401)
            return
        self.user = user
        self.session_key: str | None = self.scope["session"].session_key
        # The temporary chats this socket started: deleted when it closes.
        self.temporary_chats: set[int] = set()
        self.forwarders: dict[int, tuple[Reply, Subscription, asyncio.Task[None]]] = {}
        remember_loop(asyncio.get_running_loop())
        # Joined before accepting, so a logout (or a new title) from then on reaches it.
        await join(self.channel_layer, user.pk, self.channel_name)
        self.in_group = True
        await self.accept()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """The consumer's life; whatever ends it (a channel layer that failed under it
        included, which skips `disconnect`), its replies lose this socket as a watcher, so
        one nobody watches any more stops as it would after a disconnect."""
        opened = closed = False

        async def send_watched(message: dict[str, Any]) -> None:
            nonlocal opened, closed
            opened = opened or message["type"] == "websocket.accept"
            closed = closed or message["type"] == "websocket.close"
            await send(message)

        try:
            await super().__call__(scope, receive, send_watched)
        except LAYER_ERRORS as exc:
            # Else the handshake answers 500 (or an open socket drops with 1011), which
            # the page can only retry blindly.
            log.warning("chat socket closed with %s: the channel layer failed: %r", LAYER_AWAY, exc)
            if not closed:
                with contextlib.suppress(Exception):  # the client may be gone already
                    if not opened:
                        await send({"type": "websocket.accept"})
                    await send({"type": "websocket.close", "code": LAYER_AWAY})
        finally:
            self._drop_forwarders()

    def _drop_forwarders(self) -> None:
        for gen, sub, task in list(getattr(self, "forwarders", {}).values()):
            task.cancel()
            gen.unsubscribe(sub)
        self.forwarders = {}

    async def disconnect(self, code: int) -> None:
        self._drop_forwarders()
        if getattr(self, "temporary_chats", None):
            try:
                await database_sync_to_async(temporary.end)(self.user, self.temporary_chats)
            except DatabaseError as exc:  # left for the stale sweep (temporary.STALE_S)
                log.warning("could not delete temporary chats %s: %s", self.temporary_chats, exc)
            self.temporary_chats = set()
        if self.in_group:
            self.in_group = False
            await leave(self.channel_layer, self.user.pk, self.channel_name)

    # --- the login this socket was opened with (chatapp/chat/user_sockets.py) -------------

    async def auth_logout(self, event: dict[str, Any]) -> None:
        if event.get("session_key") == self.session_key:
            await self._sign_out()

    async def auth_changed(self, event: dict[str, Any]) -> None:
        if await session_user_id(self.session_key) != self.user.pk:
            await self._sign_out()

    async def chat_title(self, event: dict[str, Any]) -> None:
        """A title job stored a new title for one of this user's conversations."""
        if not self.signed_out:
            await self.send_json(
                {
                    "type": "title",
                    "conversation_id": event["conversation_id"],
                    "title": event["title"],
                }
            )

    async def _sign_out(self) -> None:
        self.signed_out = True
        await self.close(code=4401)

    # --- framing --------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.signed_out:
            return  # sent before the close reached the client: not answered
        if text_data is None:
            await self.send_error("bad_frame", "Binary frames are not supported; send JSON text.")
            return
        if len(text_data.encode("utf-8", "surrogatepass")) > settings.CHAT_MAX_FRAME_BYTES:
            await self.send_error("frame_too_large", "That message is too large to send.")
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):
            await self.send_error("bad_frame", "The frame is not valid JSON.")
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # Echo the ids the frame named, so the UI can tie an error to what it asked for.
        extra: dict[str, Any] = {}
        if isinstance(content, dict):
            client_id = content.get("client_id")
            if isinstance(client_id, str) and client_id and len(client_id) <= 64:
                extra["client_id"] = client_id
            for name in ("conversation_id", "message_id"):
                value = content.get(name)
                if isinstance(value, int) and not isinstance(value, bool):
                    extra[name] = value
        try:
            frame = parse_frame(content)
        except ValidationError as exc:
            refusal = frame_error(exc, content)
            await self.send_error(refusal.code, refusal.message, **(extra if refusal.echo else {}))
            return
        kind = frame.type
        handler = self.HANDLERS[kind]
        try:
            await handler(self, frame)
        except FrameError as exc:
            await self.send_error(exc.code, exc.message, **extra)
        except NotFound:
            await self.send_error(
                "not_found", "That conversation or message does not exist.", **extra
            )
        except (InvalidSettings, InvalidText) as exc:
            await self.send_error("invalid", str(exc), **extra)
        except EngineUnavailableError:
            await self.send_error("engine_unavailable", ERROR_TEXT["engine_unavailable"], **extra)
        except ModelNotFoundError as exc:
            await self.send_error("model_not_found", model_missing_text(exc.model), **extra)
        except DatabaseError:
            log.exception("database error on chat frame %r", kind)
            await self.send_error(
                "unavailable",
                "Your message could not be saved just now, so it was not sent. Please try again.",
                **extra,
            )
        except Exception:
            log.exception("chat frame %r failed", kind)
            await self.send_error("server_error", "Something went wrong on the server.", **extra)

    async def send_error(self, code: str, message: str, **fields: Any) -> None:
        await self.send_json({"type": "error", "code": code, "message": message, **fields})

    # --- handlers -------------------------------------------------------------------

    async def on_ping(self, frame: PingFrame) -> None:
        await self.send_json({"type": "pong", "time": time.time()})

    async def on_send(self, frame: SendFrame) -> None:
        new_settings = frame.settings.given() if frame.settings else {}
        if frame.conversation_id is not None:
            conv = await database_sync_to_async(conversations.get_conversation)(
                self.user, frame.conversation_id
            )
        else:
            # Not saved yet: it is written together with the first exchange, in one
            # transaction, so a refused or failed first message leaves nothing behind.
            new_settings = await database_sync_to_async(instructions.with_instructions)(
                self.user, new_settings
            )
            conv = conversations.new_conversation(self.user, "", new_settings)
            # A temporary chat (chatapp/chat/temporary.py) lives as long as this socket.
            conv.temporary = frame.temporary
        documents = await self._documents(frame.attachments or [])
        if frame.compare_model is not None:
            await self._check_compare(conv, frame)
        try:
            user_msg, reply = await self._generate(
                conv, None, frame.text, frame, documents=documents
            )
        finally:
            if conv.temporary and conv.pk is not None:
                self.temporary_chats.add(conv.pk)
        if frame.compare_model is not None and user_msg is not None:
            await self._compare(conv, user_msg, reply, frame)

    async def _check_compare(self, conv: Conversation, frame: SendFrame) -> None:
        """Before anything is saved: the second model is served and is another model."""
        named = frame.model if frame.model is not None else conv.model
        first = await asyncio.to_thread(get_engine_client, named or None)
        second = await asyncio.to_thread(get_engine_client, frame.compare_model)
        if second.model_name == first.model_name:
            raise FrameError("invalid", "Pick another model to compare with.")

    async def _compare(
        self, conv: Conversation, user_msg: Message, first: Message, frame: SendFrame
    ) -> None:
        """The second reply of a comparison: the same message answered by
        `frame.compare_model`, streamed alongside the first. It is saved as the first
        reply's alternative and does not move the conversation's active branch, so the
        thread goes on from the first reply unless the user keeps this one
        (`PATCH /api/conversations/<id>/` with `active_message`). It takes a stream slot
        of the user's own; the conversation's one is the first reply's."""
        reservation = await self._reserve_stream(None)
        try:
            gen, _, reply = await self._prepare_reply(
                conv,
                user_msg,
                None,
                True,
                reservation,
                frame.compare_model,
                activate=False,
            )
        finally:
            registry.release(reservation)
        await self._launch(gen, conv, None, reply, False, frame, compare_to=first.pk)

    async def on_regenerate(self, frame: RegenerateFrame) -> None:
        message = await database_sync_to_async(conversations.get_message)(
            self.user, frame.message_id
        )
        if message.role != Message.Role.ASSISTANT:
            raise FrameError("invalid", "Only a reply can be regenerated.")
        parent = await database_sync_to_async(lambda: message.parent)()
        await self._generate(message.conversation, parent, None, frame, branch_from=True)

    async def on_edit(self, frame: EditFrame) -> None:
        message = await database_sync_to_async(conversations.get_message)(
            self.user, frame.message_id
        )
        if message.role != Message.Role.USER:
            raise FrameError("invalid", "Only your own messages can be edited.")
        # Without `attachments` the edit keeps the message's documents; with it, those
        # listed (the message's own or new uploads).
        if "attachments" in frame.model_fields_set:
            documents = await self._documents(frame.attachments or [], keep_from=message)
        else:
            documents = await database_sync_to_async(
                lambda: list(message.attachments.order_by("position", "id"))
            )()
        # A message may be its documents alone.
        if not documents and not frame.text.strip():
            raise FrameError("invalid", "The message is empty.")
        parent = await database_sync_to_async(lambda: message.parent)()
        await self._generate(
            message.conversation, parent, frame.text, frame, branch_from=True, documents=documents
        )

    async def on_continue(self, frame: ContinueFrame) -> None:
        reply = await database_sync_to_async(conversations.get_message)(self.user, frame.message_id)
        if not await database_sync_to_async(conversations.can_continue)(reply):
            raise FrameError("invalid", "Only a reply cut off at the length limit can go on.")
        conv = reply.conversation
        reservation = await self._reserve_stream(conv.pk)
        try:
            gen = await self._prepare_continuation(conv, reply, reservation)
        finally:
            registry.release(reservation)
        await self._launch(gen, conv, None, reply, False, frame)

    async def _documents(
        self, ids: list[int], keep_from: Message | None = None
    ) -> list[attachments.Attachment]:
        try:
            return await database_sync_to_async(attachments.usable)(self.user, ids, keep_from)
        except AttachmentsInvalid as exc:
            raise FrameError("invalid", str(exc).capitalize() + ".") from exc

    async def on_stop(self, frame: StopFrame) -> None:
        message = await database_sync_to_async(conversations.get_message)(
            self.user, frame.message_id
        )
        # Here or on another web replica.
        await registry.stop(message.pk)

    async def on_resume(self, frame: ResumeFrame) -> None:
        message = await database_sync_to_async(conversations.get_message)(
            self.user, frame.message_id
        )
        # Generated here, or by another web replica (docs/serving.md, "Several web replicas").
        gen = await registry.find(message.pk)
        if gen is not None and not gen.finished:
            as_json = await database_sync_to_async(conversations.message_json)(message, True)
            # Subscribe and snapshot with no await in between: no delta can slip past.
            sub = gen.subscribe()
            snapshot = message_snapshot(gen, as_json)
            await self.send_json({"type": "snapshot", "message": snapshot})
            self._forward(gen, sub)
            return
        as_json = await database_sync_to_async(self._settle_orphan)(message)
        await self.send_json({"type": "snapshot", "message": as_json})
        if as_json["role"] == Message.Role.ASSISTANT:
            await self.send_json(
                done_event(
                    message.pk,
                    as_json["status"],
                    as_json["finish_reason"],
                    as_json["figures"],
                    as_json,
                )
            )

    @staticmethod
    def _settle_orphan(message: Message) -> dict[str, Any]:
        # Marked streaming but generated by no one here: the server restarted mid-reply.
        # Keep what was checkpointed and say why it ended.
        if message.status == Message.Status.STREAMING and registry.get(message.pk) is None:
            # An UPDATE of these fields only, so a reply deleted meanwhile stays deleted.
            Message.objects.filter(pk=message.pk, status=Message.Status.STREAMING).update(
                status=Message.Status.STOPPED,
                finish_reason="interrupted",
                updated_at=timezone.now(),
            )
            fresh = Message.objects.filter(pk=message.pk).first()
            if fresh is None:
                raise NotFound("message")
            message = fresh
        return conversations.message_json(message, with_alternatives=True)

    HANDLERS: dict[str, Any] = {
        "ping": on_ping,
        "send": on_send,
        "stop": on_stop,
        "regenerate": on_regenerate,
        "edit": on_edit,
        "continue": on_continue,
        "resume": on_resume,
    }

    # --- generation -----------------------------------------------------------------

    async def _reserve_stream(self, conversation_id: int | None) -> Reservation:
        """Claim this user's stream slot (and the conversation's) before anything is
        awaited, so frames arriving together cannot all pass the check; then the same
        across every web replica (chatapp/slots.py)."""
        limit = settings.CHAT_MAX_CONCURRENT_STREAMS
        try:
            reservation = registry.reserve(self.user.pk, conversation_id, limit)
            await registry.claim(reservation, limit)
            return reservation
        except AlreadyStreaming as exc:
            raise FrameError("already_streaming", "A reply is already being written here.") from exc
        except Draining as exc:
            raise FrameError(
                "draining", "The server is restarting. Send your message again in a moment."
            ) from exc
        except TooManyStreams as exc:
            raise FrameError(
                "rate_limited",
                f"You already have {exc.active} replies being written; wait for one to finish.",
            ) from exc

    async def _count_message(self) -> None:
        """Messages per minute, per user (django-ratelimit's counters in the Django cache)."""
        usage = await counted_usage(
            SimpleNamespace(user=self.user, method="WS"),
            group="chat-messages",
            key=lambda _group, req: str(req.user.pk),
            rate=f"{settings.CHAT_RATE_LIMIT_PER_MINUTE}/m",
            increment=True,
        )
        if usage and usage["should_limit"]:
            raise FrameError(
                "rate_limited",
                f"You are sending messages too fast (at most {settings.CHAT_RATE_LIMIT_PER_MINUTE} "
                "a minute). Please wait a moment.",
            )

    async def _generate(
        self,
        conv: Conversation,
        parent: Message | None,
        user_text: str | None,
        frame: SendFrame | RegenerateFrame | EditFrame,
        branch_from: bool = False,
        documents: list[attachments.Attachment] | None = None,
    ) -> tuple[Message | None, Message]:
        """Continue `conv` with a reply: after the active branch (a plain send), or after
        `parent` (`branch_from`: regenerate and edit), with `user_text` (after its
        `documents`) first if given. Returns the user message saved (if any) and the
        reply."""
        new_conversation = conv.pk is None
        reservation = await self._reserve_stream(conv.pk)
        try:
            gen, user_msg, reply = await self._prepare_reply(
                conv,
                parent,
                user_text,
                branch_from,
                reservation,
                frame.model,
                documents or [],
            )
        finally:
            registry.release(reservation)  # a no-op once the reply has started
        await self._launch(gen, conv, user_msg, reply, new_conversation, frame)
        return user_msg, reply

    async def _launch(
        self,
        gen: Generation,
        conv: Conversation,
        user_msg: Message | None,
        reply: Message,
        new_conversation: bool,
        frame: AnyFrame,
        compare_to: int | None = None,
    ) -> None:
        # Launched before anything else is awaited, so a registered reply always runs
        # (and ends, freeing its slot) even if this socket fails from here on; its events
        # wait in `sub` until the `start` frame is out.
        sub = gen.subscribe()
        registry.launch(gen)
        try:
            await self._announce(conv, user_msg, reply, new_conversation, frame, compare_to)
        except BaseException:
            gen.unsubscribe(sub)
            raise
        self._forward(gen, sub)

    async def _prepare_reply(
        self,
        conv: Conversation,
        parent: Message | None,
        user_text: str | None,
        branch_from: bool,
        reservation: Reservation,
        named: str | None = None,
        documents: list[attachments.Attachment] | None = None,
        activate: bool = True,
    ) -> tuple[Generation, Message | None, Message]:
        await self._count_message()
        # The model the frame names (the picker's), else the conversation's own.
        model = named if named is not None else conv.model
        client = await asyncio.to_thread(get_engine_client, model or None)
        model = client.model_name
        default = await asyncio.to_thread(default_model)

        def prepare() -> tuple[Prompt, Message | None, list[dict]]:
            # The branch the reply continues: for a plain send, the active branch; for
            # regenerate and edit, the path down to `parent`. One past the model's window
            # by its messages' stored counts is refused before its history is read.
            leaf = (parent.pk if parent else None) if branch_from else conv.active_leaf_id
            past = conversations.too_long_by_count(client, conv, leaf)
            if past:
                raise FrameError("too_long", past)
            branch = (
                conversations.path_to(parent) if branch_from else conversations.active_branch(conv)
            )
            # Scoped to the conversation's owner (docs/kv-tier.md, "Whose blocks"). Replies
            # keep their ids only for a model with their tokenizer (turns_for).
            salt = prefix_cache_salt(conv.owner_id)
            legacy = model == default
            anchor = branch[-1] if branch else None
            if user_text is None:
                return (
                    conversations.prompt_for(client, conv, branch, None, [], salt, legacy),
                    anchor,
                    [],
                )
            # Documents too long to read whole give their passages most relevant to the words.
            prompt, chosen = conversations.prompt_with_documents(
                client, conv, branch, user_text, documents or [], salt, legacy
            )
            return prompt, anchor, [p.as_json(n) for n, p in enumerate(chosen, start=1)]

        prompt, anchor, sources = await database_sync_to_async(prepare)()
        too_long = conversations.too_long_words(client, prompt)
        if too_long:
            raise FrameError("too_long", too_long)
        try:
            user_msg, reply = await database_sync_to_async(conversations.add_exchange)(
                conv,
                anchor,
                user_text,
                prompt.user_token_ids,
                model,
                client.tokenizer_id,
                documents,
                sources,
                activate,
            )
        except AttachmentsInvalid as exc:
            raise FrameError("invalid", str(exc).capitalize() + ".") from exc
        sampling = reply_sampling(conv)
        return registry.start(reply, prompt, sampling, reservation), user_msg, reply

    async def _prepare_continuation(
        self, conv: Conversation, reply: Message, reservation: Reservation
    ) -> Generation:
        """The same reply, written on from its last token by the model that wrote it: the
        prompt is the one it answered plus its own token ids, an exact extension of what
        the engine's prefix cache already holds."""
        await self._count_message()
        client = await asyncio.to_thread(get_engine_client, reply.model or None)
        default = await asyncio.to_thread(default_model)

        def prepare() -> Prompt | None:
            branch = conversations.path_to(reply.parent)
            salt = prefix_cache_salt(conv.owner_id)
            asked = conversations.prompt_for(
                client, conv, branch, None, [], salt, legacy=client.model_name == default
            )
            return conversations.continuation_prompt(
                asked, reply, client.tokenizer_id, client.model_name == default
            )

        prompt = await database_sync_to_async(prepare)()
        if prompt is None:
            raise FrameError("invalid", "This reply cannot go on with the model serving it now.")
        too_long = conversations.too_long_words(client, prompt)
        if too_long:
            raise FrameError("too_long", "The reply has filled the model's context window.")
        sampling = reply_sampling(conv)
        if sampling.structured is not None and reply.text.lstrip().startswith("{"):
            # The grammar takes the reply so far first, and goes on from inside its object.
            sampling.structured_given = len(reply.token_ids)
        elif sampling.structured is not None:
            sampling.structured = None  # written before JSON mode was on: it goes on as text
        await database_sync_to_async(conversations.reopen_reply)(reply)
        return registry.start(reply, prompt, sampling, reservation)

    async def _announce(
        self,
        conv: Conversation,
        user_msg: Message | None,
        reply: Message,
        new_conversation: bool,
        frame: AnyFrame,
        compare_to: int | None = None,
    ) -> None:
        """Tell this socket the reply started."""
        client_id = frame.client_id
        if new_conversation:
            conv_json = await database_sync_to_async(conversations.conversation_json)(conv)
            await self.send_json({"type": "conversation", "conversation": conv_json})
        user_json = (
            await database_sync_to_async(conversations.message_json)(user_msg, True)
            if user_msg
            else None
        )
        reply_json = await database_sync_to_async(conversations.message_json)(reply, True)
        start: dict[str, Any] = {
            "type": "start",
            "conversation_id": conv.pk,
            "user_message": user_json,
            "message": reply_json,
        }
        if compare_to is not None:
            start["compare_to"] = compare_to
        elif client_id:
            start["client_id"] = client_id
        await self.send_json(start)

    def _forward(self, gen: Reply, sub: Subscription) -> None:
        old = self.forwarders.pop(gen.message_id, None)
        if old is not None:
            old[2].cancel()
            gen.unsubscribe(old[1])
        task = asyncio.get_running_loop().create_task(self._pump(gen, sub))
        self.forwarders[gen.message_id] = (gen, sub, task)

    async def _pump(self, gen: Reply, sub: Subscription) -> None:
        """Send a reply's events to this socket, coalescing deltas: the first one goes
        out at once (that is the TTFT a person sees), later ones at most every
        CHAT_FLUSH_INTERVAL_MS, so a fast engine does not flood the socket."""
        interval = settings.CHAT_FLUSH_INTERVAL_MS / 1000.0
        last_sent = 0.0
        try:
            while True:
                event = await sub.queue.get()
                if event["type"] == "delta":
                    wait = last_sent + interval - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    # Everything queued meanwhile goes out in this one frame; a delta is
                    # never followed by another event but the reply's error and done.
                    held: list[dict[str, Any]] = []
                    while not sub.queue.empty():
                        nxt = sub.queue.get_nowait()
                        if nxt["type"] == "delta" and not held:
                            event = {
                                **event,
                                "text": event["text"] + nxt["text"],
                                "seq": nxt["seq"],
                            }
                        else:
                            held.append(nxt)
                    await self.send_json(event)
                    last_sent = time.monotonic()
                else:
                    held = [event]
                for nxt in held:
                    await self.send_json(nxt)
                    if nxt["type"] == "done":
                        return
        except Exception:
            log.debug("socket gone while forwarding %s", gen.message_id, exc_info=True)
        finally:
            entry = self.forwarders.get(gen.message_id)
            if entry is not None and entry[1] is sub:
                self.forwarders.pop(gen.message_id, None)
                gen.unsubscribe(sub)
