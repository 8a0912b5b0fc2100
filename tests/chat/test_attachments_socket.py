"""Documents sent with a message over the chat socket (docs/websocket.md, `attachments`),
on the real engine with a tiny random-weight model: what is stored, the prompt the engine
gets, the KV prefix kept exact from turn to turn, edits and regenerations with documents,
and what is refused."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chatapp.chat import attachments, conversations
from chatapp.chat.models import Attachment, Conversation, Message
from inference.chat_template import Turn
from inference.client import get_engine_client, prefix_cache_salt
from tests.sockets import ChatSocket

pytestmark = pytest.mark.django_db(transaction=True)

GREEDY = {"max_tokens": 6, "temperature": 0}
NOTES = "Meeting notes.\nThe launch moves to Friday.\nBob owns the slides.\n" * 4


@database_sync_to_async
def pending(user: Any, name: str = "notes.md", text: str = NOTES) -> Attachment:
    return attachments.create_pending(user, name, text.encode(), None)


async def turn(sock: ChatSocket, **frame: Any) -> list[dict[str, Any]]:
    await sock.send({"type": "send", "conversation_id": None, "text": "Summarise.", **frame})
    return await sock.recv_until("done")


def of_type(frames: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(f for f in frames if f["type"] == kind)


@database_sync_to_async
def prompt_ids(conv_id: int, upto: int | None, text: str, docs: list[Attachment]) -> list[int]:
    """The prompt a send builds after message `upto` (None: the first message)."""
    conv = Conversation.objects.get(pk=conv_id)
    branch = conversations.path_to(Message.objects.get(pk=upto)) if upto else []
    salt = prefix_cache_salt(conv.owner_id)
    prompt = conversations.prompt_for(get_engine_client(), conv, branch, text, docs, salt)
    assert prompt.token_ids is not None
    return prompt.token_ids


async def test_a_document_is_stored_with_the_message_and_read_before_its_words(
    alice_socket: ChatSocket, tiny_engine: Any
) -> None:
    doc = await pending(alice_socket.user)  # type: ignore[attr-defined]
    frames = await turn(alice_socket, attachments=[doc.pk], settings=GREEDY)
    start = of_type(frames, "start")
    user_json = start["user_message"]
    assert [a["name"] for a in user_json["attachments"]] == ["notes.md"]
    assert user_json["attachments"][0]["id"] == doc.pk and "text" not in user_json["attachments"][0]
    user_msg = await database_sync_to_async(Message.objects.get)(pk=user_json["id"])
    assert user_msg.text == "Summarise."
    stored = await database_sync_to_async(lambda: list(user_msg.attachments.all()))()
    assert [(a.pk, a.text) for a in stored] == [(doc.pk, NOTES)]
    # The engine read the document, then the words: the stored ids are exactly that turn.
    expected = tiny_engine.prompts.turn_ids(attachments_turn("Summarise.", stored), first=True)
    assert user_msg.token_ids == expected
    assert tiny_engine.tokenizer.decode(expected).count('<document name="notes.md">') == 1
    done = frames[-1]
    assert done["figures"]["prompt_tokens"] == len(
        await prompt_ids(start["conversation_id"], None, "Summarise.", stored)
    )


def attachments_turn(text: str, docs: list[Attachment]) -> Turn:
    return Turn("user", attachments.prompt_text(text, docs))


async def test_the_next_turn_extends_the_documents_turn_token_for_token(
    alice_socket: ChatSocket, tiny_engine: Any, settings: Any
) -> None:
    settings.RESPONSE_CACHE_ENABLED = False
    doc = await pending(alice_socket.user)  # type: ignore[attr-defined]
    first = await turn(alice_socket, attachments=[doc.pk], settings=GREEDY)
    conv_id = of_type(first, "start")["conversation_id"]
    user_id = of_type(first, "start")["user_message"]["id"]
    reply_id = first[-1]["message_id"]
    stored = await database_sync_to_async(
        lambda: list(Attachment.objects.filter(message_id=user_id))
    )()
    reply = await database_sync_to_async(Message.objects.get)(pk=reply_id)
    turn1 = await prompt_ids(conv_id, None, "Summarise.", stored)

    await alice_socket.send(
        {"type": "send", "conversation_id": conv_id, "text": "Who owns the slides?"}
    )
    second = await alice_socket.recv_until("done")
    turn2 = await prompt_ids(conv_id, reply_id, "Who owns the slides?", [])
    assert turn2[: len(turn1) + len(reply.token_ids)] == turn1 + reply.token_ids
    figures = second[-1]["figures"]
    assert figures["prompt_tokens"] == len(turn2)
    # The engine reused every full block of what it already held: the document was not
    # read again.
    block = tiny_engine.engine.config.block_size
    held = len(turn1) + len(reply.token_ids) - 1  # the last sampled token was never fed
    assert figures["cached_tokens"] >= held // block * block
    assert figures["prompt_tokens"] - figures["cached_tokens"] < len(turn2) - len(turn1) + block


async def test_a_message_may_be_its_documents_alone(alice_socket: ChatSocket) -> None:
    doc = await pending(alice_socket.user, "Q3 report.txt")  # type: ignore[attr-defined]
    await alice_socket.send(
        {
            "type": "send",
            "conversation_id": None,
            "text": "",
            "attachments": [doc.pk],
            "settings": GREEDY,
        }
    )
    frames = await alice_socket.recv_until("done")
    assert of_type(frames, "conversation")["conversation"]["id"]
    conv = await database_sync_to_async(Conversation.objects.get)()
    assert conv.title == "Q3 report.txt"
    await alice_socket.send({"type": "send", "conversation_id": None, "text": ""})
    assert (await alice_socket.recv())["code"] == "invalid"


async def test_an_upload_goes_with_one_message_only(alice_socket: ChatSocket) -> None:
    doc = await pending(alice_socket.user)  # type: ignore[attr-defined]
    await turn(alice_socket, attachments=[doc.pk], settings=GREEDY)
    await alice_socket.send(
        {"type": "send", "conversation_id": None, "text": "Again", "attachments": [doc.pk]}
    )
    error = await alice_socket.recv()
    assert error["code"] == "invalid" and "attach it again" in error["message"]
    assert await database_sync_to_async(Conversation.objects.count)() == 1


async def test_another_users_document_cannot_be_sent(
    alice_socket: ChatSocket, make_user: Any
) -> None:
    bob = await database_sync_to_async(make_user)("bob")
    secret = await pending(bob, "secret.txt", "the launch code is 1234")
    await alice_socket.send(
        {"type": "send", "conversation_id": None, "text": "Read", "attachments": [secret.pk]}
    )
    error = await alice_socket.recv()
    assert error["code"] == "invalid" and "no longer available" in error["message"]
    assert await database_sync_to_async(Message.objects.count)() == 0
    fresh = await database_sync_to_async(Attachment.objects.get)(pk=secret.pk)
    assert fresh.message_id is None and fresh.owner_id == bob.pk


@pytest.mark.parametrize(
    ("field", "code"),
    [
        ("3", "bad_frame"),
        ([True], "bad_frame"),
        ([1, 1], "bad_frame"),
        (list(range(11)), "bad_frame"),
    ],
)
async def test_a_malformed_attachments_field_is_refused(
    alice_socket: ChatSocket, field: Any, code: str
) -> None:
    await alice_socket.send(
        {"type": "send", "conversation_id": None, "text": "x", "attachments": field}
    )
    assert (await alice_socket.recv())["code"] == code
    assert await database_sync_to_async(Message.objects.count)() == 0


async def test_an_edit_keeps_the_documents_unless_told_otherwise(
    alice_socket: ChatSocket,
) -> None:
    doc = await pending(alice_socket.user)  # type: ignore[attr-defined]
    first = await turn(alice_socket, attachments=[doc.pk], settings=GREEDY)
    user_id = of_type(first, "start")["user_message"]["id"]

    await alice_socket.send({"type": "edit", "message_id": user_id, "text": "Summarise briefly."})
    edited = await alice_socket.recv_until("done")
    kept = of_type(edited, "start")["user_message"]
    assert kept["id"] != user_id and kept["parent_id"] is None
    assert [a["name"] for a in kept["attachments"]] == ["notes.md"]
    assert kept["attachments"][0]["id"] != doc.pk  # a copy: each message owns its documents
    assert edited[-1]["figures"]["prompt_tokens"] > 40

    await alice_socket.send(
        {"type": "edit", "message_id": user_id, "text": "Just say hi.", "attachments": []}
    )
    dropped = of_type(await alice_socket.recv_until("done"), "start")["user_message"]
    assert dropped["attachments"] == []
    # The first branch still has its document.
    original = await database_sync_to_async(
        lambda: list(Attachment.objects.filter(message_id=user_id))
    )()
    assert [a.pk for a in original] == [doc.pk]


async def test_a_regenerated_reply_reads_the_same_documents(alice_socket: ChatSocket) -> None:
    doc = await pending(alice_socket.user)  # type: ignore[attr-defined]
    first = await turn(alice_socket, attachments=[doc.pk], settings=GREEDY)
    await alice_socket.send({"type": "regenerate", "message_id": first[-1]["message_id"]})
    again = await alice_socket.recv_until("done")
    assert of_type(again, "start")["user_message"] is None
    assert again[-1]["figures"]["prompt_tokens"] == first[-1]["figures"]["prompt_tokens"]
    # ... and the KV of the prompt is reused: the regenerate pays for no document again.
    assert again[-1]["figures"]["cached_tokens"] >= first[-1]["figures"]["prompt_tokens"] - 16


async def test_words_past_the_context_window_are_refused_and_the_document_stays_attachable(
    alice_socket: ChatSocket, tiny_engine: Any
) -> None:
    # (A document past the window is sent as its relevant passages: test_retrieval.py.)
    words = " ".join(f"w{i}" for i in range(tiny_engine.max_model_len))
    doc = await pending(alice_socket.user)  # type: ignore[attr-defined]
    await alice_socket.send(
        {"type": "send", "conversation_id": None, "text": words, "attachments": [doc.pk]}
    )
    error = await alice_socket.recv()
    assert error["code"] == "too_long"
    needed = len(await prompt_ids_new(words, [doc], alice_socket.user))  # type: ignore[attr-defined]
    assert error["message"] == (
        f"This message needs {needed:,} tokens with the conversation so far, and the model "
        f"reads at most {tiny_engine.max_model_len:,} tokens, its reply included. Remove an "
        "attachment, shorten the message or start a new chat."
    )
    assert await database_sync_to_async(Message.objects.count)() == 0
    fresh = await database_sync_to_async(Attachment.objects.get)(pk=doc.pk)
    assert fresh.message_id is None


@database_sync_to_async
def prompt_ids_new(text: str, docs: list[Attachment], user: Any) -> list[int]:
    conv = conversations.new_conversation(user)
    prompt = conversations.prompt_for(
        get_engine_client(), conv, [], text, docs, prefix_cache_salt(user.pk)
    )
    assert prompt.token_ids is not None
    return prompt.token_ids


async def test_the_conversation_api_lists_each_messages_documents(
    alice_socket: ChatSocket,
) -> None:
    doc = await pending(alice_socket.user)  # type: ignore[attr-defined]
    frames = await turn(alice_socket, attachments=[doc.pk], settings=GREEDY)
    conv_id = of_type(frames, "start")["conversation_id"]

    def fetch() -> Any:
        c = Client()
        c.force_login(alice_socket.user)  # type: ignore[attr-defined]
        return c.get(f"/api/conversations/{conv_id}/").json()

    data = await database_sync_to_async(fetch)()
    user, reply = data["messages"]
    assert [a["name"] for a in user["attachments"]] == ["notes.md"]
    assert "attachments" not in reply
