"""A user's open chat sockets, in any process: the channel-layer group each one joins, and
what is sent to it. A socket lives only as long as the login it was opened with
(docs/websocket.md, close code 4401); a conversation's new title reaches its owner's
sockets as a `title` frame.

Every socket joins its user's channel-layer group. Logging out tells the group which
session ended; changing the password, deactivating or deleting the user tells it to
check again, and each socket whose session no longer logs that user in closes itself.
group_send works on the in-memory layer (one process) and the Redis layer (several).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from importlib import import_module
from typing import Any

from asgiref.sync import async_to_sync
from channels.auth import get_user
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user_model, user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_init, post_save

log = logging.getLogger(__name__)

# Group event types; the consumer's handlers are named after them (auth.logout -> auth_logout).
LOGOUT = "auth.logout"
CHANGED = "auth.changed"
# A channel layer that does not answer within this long is treated as away.
LAYER_TIMEOUT_S = 2.0


def user_group(user_id: int) -> str:
    return f"chat-user-{user_id}"


async def session_user_id(session_key: str | None) -> int | None:
    """Whom the session logs in now, read afresh from the session store (None: nobody).
    The same checks as an HTTP request: the session exists, the user exists and is
    active, and the password has not changed since the login."""
    if not session_key:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = await get_user({"session": store})
    return user.pk if user.is_authenticated else None


async def join(layer: Any, user_id: int, channel_name: str) -> None:
    """Add a socket to its user's group (it raises when the channel layer is away, as
    the socket's own channel would fail then too: the page reconnects with backoff)."""
    await asyncio.wait_for(layer.group_add(user_group(user_id), channel_name), LAYER_TIMEOUT_S)


async def leave(layer: Any, user_id: int, channel_name: str) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(
            layer.group_discard(user_group(user_id), channel_name), LAYER_TIMEOUT_S
        )


def notify(user_id: int, event: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return

    async def send() -> None:
        await asyncio.wait_for(layer.group_send(user_group(user_id), event), LAYER_TIMEOUT_S)

    try:
        async_to_sync(send)()
    except Exception as exc:
        # The channel layer (Redis) away must not make logging out fail.
        log.warning("could not tell user %s's sockets about %s: %s", user_id, event["type"], exc)


def _on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is None or getattr(request, "session", None) is None:
        return
    # Sent before Django flushes the session, so the event names the session instead of
    # asking sockets to look it up.
    notify(user.pk, {"type": LOGOUT, "session_key": request.session.session_key})


def _credentials(user: Any) -> tuple[Any, Any]:
    # From __dict__: reading a deferred field here would cost a query per loaded user.
    return user.__dict__.get("password"), user.__dict__.get("is_active")


def _remember_credentials(sender: Any, instance: Any, **kwargs: Any) -> None:
    instance._chat_credentials = _credentials(instance)


def _on_user_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    update_fields = kwargs.get("update_fields")
    if created or (update_fields is not None and not {"password", "is_active"} & update_fields):
        return  # e.g. the last_login update on every login
    now = _credentials(instance)
    if getattr(instance, "_chat_credentials", now) == now:
        return
    instance._chat_credentials = now
    user_id = instance.pk
    transaction.on_commit(lambda: notify(user_id, {"type": CHANGED}))


def _on_user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    user_id = instance.pk
    transaction.on_commit(lambda: notify(user_id, {"type": CHANGED}))


def connect_signals() -> None:
    user_model = get_user_model()
    user_logged_out.connect(_on_logout, dispatch_uid="chat-sockets-logout")
    post_init.connect(_remember_credentials, sender=user_model, dispatch_uid="chat-sockets-init")
    post_save.connect(_on_user_saved, sender=user_model, dispatch_uid="chat-sockets-saved")
    post_delete.connect(_on_user_deleted, sender=user_model, dispatch_uid="chat-sockets-deleted")


# Group event telling a user's sockets a conversation got a new title (ChatConsumer.chat_title).
TITLE = "chat.title"
# The event loop this process's sockets run on, once one has connected.
_sockets_loop: asyncio.AbstractEventLoop | None = None


def remember_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _sockets_loop
    _sockets_loop = loop


def send_title(user_id: int, conversation_id: int, title: str) -> None:
    """Tell the user's open sockets (in any process: through the channel layer) that a
    conversation got a new title; they send a `title` frame. Never raises: a frame that
    does not arrive only means the title shows on the next reload.

    Called from a job's thread. The in-memory layer's queues belong to the loop the
    sockets run on, so the event is handed to that loop; the Redis layer works from any
    loop, and a process with no sockets (a Celery worker) sends it on a loop of its own."""
    event = {"type": TITLE, "conversation_id": conversation_id, "title": title}
    loop = _sockets_loop
    if loop is None or not loop.is_running():
        notify(user_id, event)
        return
    layer = get_channel_layer()
    if layer is None:
        return
    coro = asyncio.wait_for(layer.group_send(user_group(user_id), event), LAYER_TIMEOUT_S)
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    try:
        if running is loop:
            loop.create_task(coro)
        else:
            asyncio.run_coroutine_threadsafe(coro, loop).result(LAYER_TIMEOUT_S + 1)
    except Exception as exc:
        log.warning("could not tell user %s's sockets about a new title: %s", user_id, exc)
