"""A huge conversation costs a page, not its length: GET /api/conversations/<id>/ answers
the newest messages of the active branch and pages back with `before`; the composer's
prompt-size count is rate-limited per user."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chatapp.chat.conversations import MESSAGES_PAGE
from chatapp.chat.export import conversation_payload
from chatapp.chat.models import Conversation, Message
from tests.sockets import open_socket

pytestmark = pytest.mark.django_db

MESSAGES = 20_000


def long_conversation(owner: Any, count: int) -> Conversation:
    """One branch of `count` alternating turns of ~150 characters, as an import leaves it."""
    conv = Conversation.objects.create(owner=owner, title="Imported")
    # Ids given, so that one bulk insert can chain each message to the one before it.
    first = (Message.objects.order_by("-id").values_list("id", flat=True).first() or 0) + 1
    Message.objects.bulk_create(
        (
            Message(
                pk=first + i,
                conversation=conv,
                parent_id=first + i - 1 if i else None,
                role=Message.Role.ASSISTANT if i % 2 else Message.Role.USER,
                text=f"message {i} " + "lorem ipsum dolor sit amet " * 5,
            )
            for i in range(count)
        ),
        batch_size=2000,
    )
    Conversation.objects.filter(pk=conv.pk).update(active_leaf_id=first + count - 1)
    conv.refresh_from_db()
    return conv


def test_a_huge_conversation_answers_its_newest_page_and_pages_back(make_user: Any) -> None:
    alice = make_user("alice")
    conv = long_conversation(alice, MESSAGES)
    client = Client()
    client.force_login(alice)

    started = time.perf_counter()
    first = client.get(f"/api/conversations/{conv.pk}/")
    took = time.perf_counter() - started
    body = first.json()
    assert first.status_code == 200
    assert len(body["messages"]) == MESSAGES_PAGE and body["older"] is True
    assert body["messages"][-1]["id"] == conv.active_leaf_id
    size = len(first.content)
    print(f"\n{MESSAGES:,} messages: the newest page is {size:,} bytes in {took:.2f} s")
    assert len(first.content) < 200 * 1024  # the whole branch is ~8 MB

    before = body["messages"][0]["id"]
    second = client.get(f"/api/conversations/{conv.pk}/?before={before}&limit=50").json()
    assert [m["id"] for m in second["messages"]] == list(range(before - 50, before))
    assert second["older"] is True
    root = Message.objects.get(conversation=conv, parent=None).pk
    oldest = client.get(f"/api/conversations/{conv.pk}/?before={root + 150}").json()
    assert [m["id"] for m in oldest["messages"]] == list(range(root, root + 150))
    assert oldest["older"] is False


def test_a_page_keeps_each_messages_alternatives(make_user: Any) -> None:
    alice = make_user("alice")
    conv = long_conversation(alice, 6)
    leaf = Message.objects.get(pk=conv.active_leaf_id)
    other = Message.objects.create(  # the ids above were given: this one is given too
        pk=leaf.pk + 1, conversation=conv, parent_id=leaf.parent_id, role=leaf.role, text="again"
    )
    client = Client()
    client.force_login(alice)
    body = client.get(f"/api/conversations/{conv.pk}/?limit=2").json()
    assert [m["id"] for m in body["messages"]] == [leaf.parent_id, leaf.pk]
    assert body["messages"][-1]["alternatives"] == [leaf.pk, other.pk]
    assert body["messages"][-1]["alternative_index"] == 0


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=x", "before=y"])
def test_a_bad_page_is_refused_in_words(make_user: Any, query: str) -> None:
    alice = make_user("alice")
    conv = long_conversation(alice, 2)
    client = Client()
    client.force_login(alice)
    answer = client.get(f"/api/conversations/{conv.pk}/?{query}")
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid"


def test_prompt_size_counts_are_rate_limited_per_user(make_user: Any, settings: Any) -> None:
    settings.CHAT_PROMPT_SIZE_PER_MINUTE = 3
    client, other = Client(), Client()
    client.force_login(make_user("counter"))
    other.force_login(make_user("bystander"))

    def count(c: Client) -> Any:
        body = json.dumps({"conversation_id": None, "text": "How long is this?"})
        return c.post("/api/chat/prompt-size/", data=body, content_type="application/json")

    assert [count(client).status_code for _ in range(3)] == [200, 200, 200]
    refused = count(client)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused["Retry-After"]) <= 61
    assert count(other).status_code == 200  # another user's counts are their own


def test_an_import_counts_each_messages_tokens_for_the_served_model(
    make_user: Any, tiny_engine: Any
) -> None:
    alice = make_user("alice")
    # Ids from the database's sequence (long_conversation gives its own, which the import's
    # inserts on PostgreSQL would then meet).
    conv = Conversation.objects.create(owner=alice, title="To copy")
    parent = None
    for i, text in enumerate(["What is a token?", "A piece of a word.", "And a prompt?"]):
        role = Message.Role.ASSISTANT if i % 2 else Message.Role.USER
        parent = Message.objects.create(conversation=conv, parent=parent, role=role, text=text)
    Conversation.objects.filter(pk=conv.pk).update(active_leaf=parent)
    conv.refresh_from_db()
    exported = json.dumps(conversation_payload(conv)).encode()
    client = Client()
    client.force_login(make_user("bob"))
    answer = client.post(
        "/api/conversations/import/", data=exported, content_type="application/json"
    )
    assert answer.status_code == 201, answer.content
    copied = Message.objects.filter(conversation__owner__username="bob").order_by("id")
    assert [(m.tokens, m.tokenizer) for m in copied] == [
        (tiny_engine.count_tokens(m.text), tiny_engine.tokenizer_id) for m in copied
    ]


def counted_conversation(owner: Any, count: int, engine: Any) -> Conversation:
    """A long conversation whose messages carry their token counts, as an import leaves it."""
    conv = long_conversation(owner, count)
    per_message = engine.count_tokens(Message.objects.filter(conversation=conv).first().text)
    Message.objects.filter(conversation=conv).update(
        tokens=per_message, tokenizer=engine.tokenizer_id
    )
    return conv


def test_prompt_size_refuses_a_conversation_past_the_window_from_its_counts(
    make_user: Any, tiny_engine: Any
) -> None:
    alice = make_user("alice")
    conv = counted_conversation(alice, MESSAGES, tiny_engine)
    client = Client()
    client.force_login(alice)
    body = json.dumps({"conversation_id": conv.pk, "text": "And then?"})
    started = time.perf_counter()
    answer = client.post("/api/chat/prompt-size/", data=body, content_type="application/json")
    took = time.perf_counter() - started
    print(f"\nprompt-size on {MESSAGES:,} counted messages: {took:.2f} s")
    size = answer.json()
    assert answer.status_code == 200 and size["fits"] is False
    assert size["message"].startswith("This message needs more than")
    assert f"at most {tiny_engine.max_model_len:,} tokens" in size["message"]


@pytest.mark.django_db(transaction=True)
async def test_a_send_past_the_window_by_its_counts_is_refused_and_saves_nothing(
    make_user: Any, tiny_engine: Any
) -> None:
    alice = await database_sync_to_async(make_user)("alice")
    conv = await database_sync_to_async(counted_conversation)(alice, MESSAGES, tiny_engine)
    before = await database_sync_to_async(Message.objects.count)()
    sock, connected, _ = await open_socket(alice)
    assert connected
    try:
        await sock.send({"type": "send", "conversation_id": conv.pk, "text": "And then?"})
        refused = (await sock.recv_until("error"))[-1]
    finally:
        await sock.close()
    assert refused["code"] == "too_long" and "more than" in refused["message"]
    assert await database_sync_to_async(Message.objects.count)() == before
