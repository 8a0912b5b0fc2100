"""Per-user limits hold when the frames that test them arrive at the same moment.

Each socket is its own consumer task, so sends on several sockets run interleaved at
every await: a limit checked before the reply is registered would let them all through.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chatapp.chat.generation import registry
from chatapp.chat.models import Message
from tests.sockets import ChatSocket, open_socket

pytestmark = pytest.mark.django_db(transaction=True)

LONG = {"max_tokens": 400, "temperature": 0}


async def first_answer(sock: ChatSocket) -> dict[str, Any]:
    """The frame that says whether a send was taken: `start` or `error`."""
    while True:
        frame = await sock.recv()
        if frame["type"] in ("start", "error"):
            return frame


async def stop_and_wait(sock: ChatSocket, start: dict[str, Any]) -> None:
    await sock.send({"type": "stop", "message_id": start["message"]["id"]})
    await sock.recv_until("done")


async def sockets_of(user: Any, n: int) -> list[ChatSocket]:
    socks = []
    for _ in range(n):
        sock, connected, _ = await open_socket(user)
        assert connected
        socks.append(sock)
    return socks


async def test_sends_on_many_sockets_at_once_start_no_more_than_the_stream_cap(
    make_user: Any, tiny_engine: Any, settings: Any
) -> None:
    settings.CHAT_MAX_CONCURRENT_STREAMS = 4
    alice = await database_sync_to_async(make_user)("alice")
    socks = await sockets_of(alice, 8)
    try:
        await asyncio.gather(
            *(
                s.send(
                    {"type": "send", "conversation_id": None, "text": f"Hi {i}", "settings": LONG}
                )
                for i, s in enumerate(socks)
            )
        )
        answers = await asyncio.gather(*(first_answer(s) for s in socks))
        started = [(s, a) for s, a in zip(socks, answers, strict=True) if a["type"] == "start"]
        refused = [a for a in answers if a["type"] == "error"]
        assert len(started) == 4, [a.get("code", a["type"]) for a in answers]
        assert {a["code"] for a in refused} == {"rate_limited"}
        # A refused send leaves nothing behind: 4 conversations of 2 messages each.
        assert await database_sync_to_async(Message.objects.count)() == 8
        await asyncio.gather(*(stop_and_wait(s, a) for s, a in started))
    finally:
        for s in socks:
            await s.close()
    assert registry.streaming_for_user(alice.pk) == 0


async def test_simultaneous_sends_into_one_conversation_start_one_reply(
    make_user: Any, tiny_engine: Any
) -> None:
    alice = await database_sync_to_async(make_user)("alice")
    socks = await sockets_of(alice, 3)
    try:
        await socks[0].send({"type": "send", "conversation_id": None, "text": "First"})
        conv_id = (await socks[0].recv_until("done"))[0]["conversation"]["id"]
        await asyncio.gather(
            *(
                s.send(
                    {"type": "send", "conversation_id": conv_id, "text": "Again", "settings": LONG}
                )
                for s in socks
            )
        )
        answers = await asyncio.gather(*(first_answer(s) for s in socks))
        started = [(s, a) for s, a in zip(socks, answers, strict=True) if a["type"] == "start"]
        assert len(started) == 1, [a.get("code", a["type"]) for a in answers]
        assert sorted(a.get("code") for a in answers if a["type"] == "error") == [
            "already_streaming",
            "already_streaming",
        ]
        await stop_and_wait(*started[0])
    finally:
        for s in socks:
            await s.close()
    # The first exchange and one more: no sibling branches from the refused sends.
    roles = await database_sync_to_async(
        lambda: list(Message.objects.filter(conversation_id=conv_id).values_list("role", flat=True))
    )()
    assert roles == ["user", "assistant", "user", "assistant"]


async def test_a_send_refused_by_the_messages_per_minute_limit_frees_its_stream_slot(
    alice_socket: ChatSocket, settings: Any
) -> None:
    settings.CHAT_RATE_LIMIT_PER_MINUTE = 1
    settings.CHAT_MAX_CONCURRENT_STREAMS = 1
    refused = 0
    # The per-minute window can roll over mid-test (its boundary is set per key), letting
    # one more send start: that send then uses up the new window, and counting resumes.
    for _ in range(6):
        answer = await first_answer(await _send(alice_socket, "More"))
        if answer["type"] == "start":
            await alice_socket.recv_until("done")
            continue
        assert answer["code"] == "rate_limited" and "minute" in answer["message"], answer
        refused += 1
        if refused == 3:
            break
    assert refused == 3
    assert registry.streaming_for_user(alice_socket.user.pk) == 0  # type: ignore[attr-defined]


async def _send(sock: ChatSocket, text: str) -> ChatSocket:
    await sock.send({"type": "send", "conversation_id": None, "text": text})
    return sock
