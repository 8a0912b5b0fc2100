"""Continue: a reply cut at its length limit is written on in place, from its own token
ids, so the engine reuses what its prefix cache holds (docs/websocket.md, `continue`)."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async

from chatapp.chat.models import Message
from tests.sockets import ChatSocket

pytestmark = pytest.mark.django_db(transaction=True)

CUT = {"max_tokens": 40, "temperature": 0}


@database_sync_to_async
def reply_of(conversation_id: int) -> Message:
    return Message.objects.get(conversation_id=conversation_id, role="assistant")


async def cut_reply(sock: ChatSocket) -> tuple[int, Message, dict[str, Any]]:
    await sock.send(
        {"type": "send", "conversation_id": None, "text": "Tell me a story.", "settings": CUT}
    )
    frames = await sock.recv_until("done")
    assert frames[-1]["finish_reason"] == "length", frames[-1]
    conv_id = frames[0]["conversation"]["id"]
    return conv_id, await reply_of(conv_id), frames[-1]


async def test_a_reply_cut_at_the_limit_goes_on_in_place_from_the_cache(
    alice_socket: ChatSocket,
) -> None:
    conv_id, before, first_done = await cut_reply(alice_socket)
    await alice_socket.send({"type": "continue", "message_id": before.pk})
    frames = await alice_socket.recv_until("done")
    start = frames[0]
    assert start["type"] == "start" and start["user_message"] is None
    assert start["message"]["id"] == before.pk and start["message"]["text"] == before.text
    new_text = "".join(f["text"] for f in frames if f["type"] == "delta")
    done = frames[-1]
    assert done["status"] == "complete" and done["message"]["text"] == before.text + new_text

    after = await reply_of(conv_id)  # the same message, no second reply
    assert after.pk == before.pk and after.status == "complete"
    assert after.text == before.text + new_text
    assert after.token_ids[: len(before.token_ids)] == before.token_ids
    assert len(after.token_ids) == len(before.token_ids) + done["figures"]["output_tokens"]
    # The prompt is the first one plus the reply so far, and the engine had it cached.
    figures = done["figures"]
    assert figures["prompt_tokens"] == first_done["figures"]["prompt_tokens"] + len(
        before.token_ids
    )
    assert figures["cached_tokens"] >= first_done["figures"]["prompt_tokens"] // 16 * 16 > 0


async def test_only_the_last_reply_cut_at_the_limit_can_go_on(alice_socket: ChatSocket) -> None:
    conv_id, reply, _ = await cut_reply(alice_socket)
    user = await database_sync_to_async(lambda: reply.parent)()
    later = await Message.objects.acreate(
        conversation_id=conv_id, parent=reply, role="user", text="And then?"
    )
    for message_id in (reply.pk, user.pk):  # followed by a later turn; not a reply
        await alice_socket.send({"type": "continue", "message_id": message_id})
        error = await alice_socket.recv()
        assert error["type"] == "error" and error["code"] == "invalid", error
        assert error["message_id"] == message_id
    await later.adelete()
    await Message.objects.filter(pk=reply.pk).aupdate(finish_reason="stop")
    for message_id in (reply.pk,):  # ended by itself
        await alice_socket.send({"type": "continue", "message_id": message_id})
        error = await alice_socket.recv()
        assert error["type"] == "error" and error["code"] == "invalid", error
        assert error["message_id"] == message_id
    assert (await reply_of(conv_id)).text == reply.text
