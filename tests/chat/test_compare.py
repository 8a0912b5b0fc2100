"""Compare two models (issue 45, item 15): a `send` with `compare_model` answers the
message twice, by the turn's model and by the one to compare with, both replies streamed
at once over the socket. The first reply continues the thread; the second is its
alternative, kept when the user picks it (`active_message`). Two real engines in this
process, the tiny model served under two names."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chatapp.chat.models import Conversation, Message
from inference.backends.embedded import EmbeddedClient
from inference.client import install_engine_clients, set_engine_client
from tests.engines import make_engine_client
from tests.sockets import ChatSocket, user_socket

pytestmark = pytest.mark.django_db(transaction=True)

FIRST, SECOND = "first", "second"
# Long enough that the first reply is still being written when the second starts (the
# tiny model rarely ends a reply of its own accord).
REPLY = {"max_tokens": 128, "temperature": 0}


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> Iterator[dict[str, EmbeddedClient]]:
    served = {
        FIRST: make_engine_client(tiny_model_dir, FIRST),
        SECOND: make_engine_client(tiny_model_dir, SECOND),
    }
    install_engine_clients({**served})
    yield served
    set_engine_client(None)


@pytest.fixture
async def sock(make_user: Any, engines: dict[str, EmbeddedClient]) -> Any:
    async with user_socket(make_user) as sock:
        yield sock


async def until_both_done(sock: ChatSocket) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while sum(f["type"] == "done" for f in frames) < 2:
        frames.append(await sock.recv(timeout=60))
        assert frames[-1]["type"] != "error", frames[-1]
    return frames


@database_sync_to_async
def saved(conversation_id: int) -> tuple[Conversation, list[Message]]:
    conv = Conversation.objects.get(pk=conversation_id)
    return conv, list(Message.objects.filter(conversation=conv).order_by("id"))


async def test_a_compared_message_is_answered_by_both_models_and_the_first_goes_on(
    sock: ChatSocket, make_user: Any
) -> None:
    await sock.send(
        {
            "type": "send",
            "conversation_id": None,
            "text": "Hello!",
            "settings": REPLY,
            "model": FIRST,
            "compare_model": SECOND,
            "client_id": "c1",
        }
    )
    frames = await until_both_done(sock)
    starts = [f for f in frames if f["type"] == "start"]
    assert len(starts) == 2
    first, second = starts[0]["message"], starts[1]["message"]
    assert starts[0]["client_id"] == "c1" and "compare_to" not in starts[0]
    assert starts[1]["compare_to"] == first["id"] and starts[1]["user_message"] is None
    assert (first["model"], second["model"]) == (FIRST, SECOND)
    # Both streamed: each got its deltas, and both were under way before either ended.
    for reply in (first, second):
        assert any(f["type"] == "delta" and f["message_id"] == reply["id"] for f in frames)
    assert frames.index(starts[1]) < next(i for i, f in enumerate(frames) if f["type"] == "done")
    conv_id = starts[0]["conversation_id"]
    conv, messages = await saved(conv_id)
    user, a, b = messages
    assert a.parent_id == b.parent_id == user.pk
    assert (a.status, b.status) == ("complete", "complete")
    # The thread goes on from the first reply, on the first model.
    assert (conv.active_leaf_id, conv.model) == (a.pk, FIRST)
    done = {f["message_id"]: f["message"] for f in frames if f["type"] == "done"}
    assert done[b.pk]["alternatives"] == [a.pk, b.pk]

    # Keeping the second answer: it becomes the branch the next turn follows.
    def keep(message_id: int) -> Any:
        browser = Client()
        browser.force_login(sock.user)  # type: ignore[attr-defined]
        return browser.patch(
            f"/api/conversations/{conv_id}/",
            json.dumps({"active_message": message_id}),
            content_type="application/json",
        )

    r = await database_sync_to_async(keep)(b.pk)
    assert r.status_code == 200, r.content
    await sock.send({"type": "send", "conversation_id": conv_id, "text": "And then?"})
    nxt = await sock.recv_until("done")
    start = next(f for f in nxt if f["type"] == "start")
    assert start["user_message"]["parent_id"] == b.pk


async def test_compare_is_refused_for_the_same_model_or_one_not_served(
    sock: ChatSocket,
) -> None:
    for other, code in ((FIRST, "invalid"), ("nobody", "model_not_found")):
        await sock.send(
            {
                "type": "send",
                "conversation_id": None,
                "text": "Hi",
                "model": FIRST,
                "compare_model": other,
            }
        )
        frame = await sock.recv()
        assert (frame["type"], frame["code"]) == ("error", code), frame
    assert not await database_sync_to_async(Message.objects.exists)()


async def test_a_compare_past_the_user_s_stream_limit_is_refused_and_the_first_goes_on(
    sock: ChatSocket, settings: Any
) -> None:
    settings.CHAT_MAX_CONCURRENT_STREAMS = 1
    await sock.send(
        {
            "type": "send",
            "conversation_id": None,
            "text": "Hello!",
            "settings": REPLY,
            "compare_model": SECOND,
            "client_id": "c2",
        }
    )
    frames = await sock.recv_until("done")
    refused = [f for f in frames if f["type"] == "error"]
    assert [(f["code"], f["client_id"]) for f in refused] == [("rate_limited", "c2")]
    assert [f["type"] for f in frames].count("start") == 1
    assert frames[-1]["status"] == "complete" and frames[-1]["message"]["model"] == FIRST
    _, messages = await saved(frames[-1]["message"]["conversation_id"])
    assert [m.role for m in messages] == ["user", "assistant"]
