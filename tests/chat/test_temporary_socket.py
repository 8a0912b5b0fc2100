"""A temporary chat over the real socket and engine (a tiny model): it is stored while its
socket is open, never listed, and deleted when that socket closes."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async

from chatapp.chat.models import Conversation, Message
from tests.sockets import ChatSocket, open_socket

pytestmark = pytest.mark.django_db(transaction=True)


async def first_exchange(sock: ChatSocket, **frame: Any) -> int:
    await sock.send(
        {"type": "send", "conversation_id": None, "text": "Hi", "settings": {"max_tokens": 4}}
        | frame
    )
    frames = await sock.recv_until("done")
    assert frames[-1]["status"] == "complete"
    return frames[0]["conversation"]["id"]


@database_sync_to_async
def kept(*ids: int) -> set[int]:
    return set(Conversation.objects.filter(pk__in=ids).values_list("pk", flat=True))


async def test_a_temporary_chat_goes_when_its_socket_closes(alice_socket: ChatSocket) -> None:
    temp = await first_exchange(alice_socket, temporary=True)
    # A second turn goes on in the same temporary chat.
    await alice_socket.send({"type": "send", "conversation_id": temp, "text": "And?"})
    assert (await alice_socket.recv_until("done"))[-1]["status"] == "complete"
    saved = await first_exchange(alice_socket)
    conv = await database_sync_to_async(Conversation.objects.get)(pk=temp)
    assert conv.temporary is True
    count = await database_sync_to_async(Message.objects.filter(conversation_id=temp).count)()
    assert count == 4

    # Another socket of the same user closing leaves this one's temporary chat alone.
    other, connected, _ = await open_socket(alice_socket.user)  # type: ignore[attr-defined]
    assert connected
    await other.close()
    assert await kept(temp, saved) == {temp, saved}

    await alice_socket.close()
    assert await kept(temp, saved) == {saved}
    assert not await database_sync_to_async(Message.objects.filter(conversation_id=temp).exists)()


async def test_temporary_must_be_true_or_false(alice_socket: ChatSocket) -> None:
    await alice_socket.send(
        {"type": "send", "conversation_id": None, "text": "Hi", "temporary": "yes"}
    )
    frame = await alice_socket.recv()
    assert frame["type"] == "error" and frame["code"] == "bad_frame"
