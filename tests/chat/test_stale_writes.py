"""A step that works on a conversation it loaded earlier writes only what it owns.

Each test replays a race deterministically: load, let the other request (delete,
rename) land, then run the step that used to write the whole stale copy back. The
last ones race a real send against a real DELETE / PATCH.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chatapp.chat import conversations
from chatapp.chat.conversations import NotFound
from chatapp.chat.models import Conversation, Message
from tests.sockets import ChatSocket

pytestmark = pytest.mark.django_db(transaction=True)


def conversation_with_exchange(user: Any) -> tuple[Conversation, Message]:
    conv = conversations.create_conversation(user, "Plans", {"system_prompt": "Be brief."})
    _, reply = conversations.add_exchange(conv, None, "Hello", [])
    return conv, reply


def client_for(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def patch(c: Client, conv_id: int, body: dict[str, Any]) -> Any:
    return c.patch(
        f"/api/conversations/{conv_id}/", data=json.dumps(body), content_type="application/json"
    )


def test_a_send_into_a_conversation_deleted_meanwhile_does_not_bring_it_back(
    make_user: Any,
) -> None:
    alice = make_user("alice")
    conv, _ = conversation_with_exchange(alice)
    stale = conversations.get_conversation(alice, conv.pk)  # the send loads it...
    assert client_for(alice).delete(f"/api/conversations/{conv.pk}/").status_code == 204
    # ...reads its (now empty) branch and adds its exchange after the DELETE answered.
    assert conversations.active_branch(stale) == []
    with pytest.raises(NotFound):
        conversations.add_exchange(stale, None, "Still there?", [])
    assert not Conversation.objects.filter(pk=conv.pk).exists()
    assert not Message.objects.exists()


def test_a_send_after_a_rename_keeps_the_new_title_and_system_prompt(make_user: Any) -> None:
    alice = make_user("alice")
    conv, reply = conversation_with_exchange(alice)
    stale = conversations.get_conversation(alice, conv.pk)
    answer = patch(
        client_for(alice),
        conv.pk,
        {"title": "Renamed", "settings": {"system_prompt": "Answer in French."}},
    )
    assert answer.status_code == 200
    _, new_reply = conversations.add_exchange(stale, reply, "And then?", [])
    conv.refresh_from_db()
    assert (conv.title, conv.system_prompt) == ("Renamed", "Answer in French.")
    assert conv.active_leaf_id == new_reply.pk


def test_the_first_message_names_an_untitled_conversation_unless_it_was_renamed(
    make_user: Any,
) -> None:
    alice = make_user("alice")
    untitled = conversations.create_conversation(alice)
    stale = conversations.get_conversation(alice, untitled.pk)
    conversations.add_exchange(stale, None, "Plan a trip to Lisbon", [])
    untitled.refresh_from_db()
    assert untitled.title == "Plan a trip to Lisbon"

    renamed = conversations.create_conversation(alice)
    stale = conversations.get_conversation(alice, renamed.pk)
    assert patch(client_for(alice), renamed.pk, {"title": "Mine"}).status_code == 200
    conversations.add_exchange(stale, None, "Plan a trip to Porto", [])
    renamed.refresh_from_db()
    assert renamed.title == "Mine"


def test_a_rename_after_a_send_keeps_the_new_reply_on_screen(make_user: Any) -> None:
    alice = make_user("alice")
    conv, reply = conversation_with_exchange(alice)
    stale = conversations.get_conversation(alice, conv.pk)  # the PATCH loads it...
    _, new_reply = conversations.add_exchange(
        conversations.get_conversation(alice, conv.pk), reply, "More", []
    )
    conversations.update_conversation(stale, {"title": "Renamed"})  # ...and saves after the send
    conv.refresh_from_db()
    assert conv.title == "Renamed"
    assert conv.active_leaf_id == new_reply.pk


def test_a_rename_of_a_conversation_deleted_meanwhile_is_not_found(make_user: Any) -> None:
    alice = make_user("alice")
    conv, _ = conversation_with_exchange(alice)
    stale = conversations.get_conversation(alice, conv.pk)
    Conversation.objects.filter(pk=conv.pk).delete()
    with pytest.raises(NotFound):
        conversations.update_conversation(stale, {"title": "Back?", "settings": {"top_p": 0.5}})
    assert not Conversation.objects.filter(pk=conv.pk).exists()


async def test_a_reply_whose_conversation_is_deleted_mid_stream_stops_and_stays_deleted(
    alice_socket: ChatSocket, tiny_engine: Any, settings: Any
) -> None:
    settings.CHAT_FLUSH_INTERVAL_MS = 0
    settings.CHAT_CHECKPOINT_INTERVAL_S = 0.02
    await alice_socket.send(
        {
            "type": "send",
            "conversation_id": None,
            "text": "Tell me everything",
            "settings": {"max_tokens": 2000, "temperature": 0},
        }
    )
    frames = await alice_socket.recv_until("delta")
    conv_id = frames[0]["conversation"]["id"]
    c = await database_sync_to_async(client_for)(alice_socket.user)  # type: ignore[attr-defined]
    deleted = await database_sync_to_async(c.delete)(f"/api/conversations/{conv_id}/")
    assert deleted.status_code == 204
    done = (await alice_socket.recv_until("done", timeout=10))[-1]
    assert done["status"] == "stopped" and done["finish_reason"] == "abort"
    assert done["figures"]["output_tokens"] < 2000
    assert not await database_sync_to_async(Conversation.objects.filter(pk=conv_id).exists)()
    assert not await database_sync_to_async(Message.objects.exists)()
    assert tiny_engine.stats()["running"] == 0
