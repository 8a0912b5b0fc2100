"""Custom instructions: what a user says about themselves and how to answer, which each
new chat of theirs starts with as its system prompt (docs/http.md)."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chatapp.chat.models import Conversation
from tests.sockets import open_socket

ABOUT = "I am a baker in Lyon."
STYLE = "Answer in two sentences."
PROMPT = f"About the user:\n{ABOUT}\n\nHow to answer:\n{STYLE}"


def client_for(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


@pytest.mark.django_db
def test_instructions_are_saved_and_become_the_new_chat_default(plain_user) -> None:
    c = client_for(plain_user)
    assert c.get("/api/me/instructions/").json() == {
        "about": "",
        "style": "",
        "system_prompt": "",
        "max_chars": 1500,
    }
    assert c.get("/api/chat/limits/").json()["system_prompt"]["default"] == ""
    r = c.put("/api/me/instructions/", {"about": ABOUT, "style": STYLE}, "application/json")
    assert r.status_code == 200 and r.json()["system_prompt"] == PROMPT
    assert c.get("/api/chat/limits/").json()["system_prompt"]["default"] == PROMPT
    # One field at a time: the other is kept.
    r = c.put("/api/me/instructions/", {"style": ""}, "application/json")
    assert r.json()["system_prompt"] == f"About the user:\n{ABOUT}"


@pytest.mark.django_db
def test_instructions_past_the_limit_or_unknown_fields_are_refused(plain_user) -> None:
    c = client_for(plain_user)
    r = c.put("/api/me/instructions/", {"about": "x" * 1501}, "application/json")
    assert r.status_code == 400 and "1,500" in r.json()["error"]["message"]
    r = c.put("/api/me/instructions/", {"mood": "happy"}, "application/json")
    assert r.status_code == 400
    assert c.get("/api/me/instructions/").json()["about"] == ""


@pytest.mark.django_db
def test_a_new_conversation_starts_with_the_instructions_unless_it_names_its_own(
    plain_user, staff_user
) -> None:
    c = client_for(plain_user)
    c.put("/api/me/instructions/", {"about": ABOUT, "style": STYLE}, "application/json")
    plain = c.post("/api/conversations/", {}, "application/json").json()
    assert plain["settings"]["system_prompt"] == PROMPT
    own = {"settings": {"system_prompt": "You are a pirate."}}
    named = c.post("/api/conversations/", own, "application/json").json()
    assert named["settings"]["system_prompt"] == "You are a pirate."
    # Another user's chats are untouched.
    other = client_for(staff_user).post("/api/conversations/", {}, "application/json").json()
    assert other["settings"]["system_prompt"] == ""


@pytest.mark.django_db(transaction=True)
async def test_a_chat_started_over_the_socket_takes_the_instructions(
    make_user: Any, tiny_engine: Any
) -> None:
    user = await database_sync_to_async(make_user)("baker")
    await database_sync_to_async(
        lambda: client_for(user).put(
            "/api/me/instructions/", {"about": ABOUT, "style": STYLE}, "application/json"
        )
    )()
    sock, ok, _ = await open_socket(user)
    assert ok
    try:
        await sock.send(
            {"type": "send", "conversation_id": None, "text": "Hi", "settings": {"max_tokens": 2}}
        )
        frames = await sock.recv_until("done")
        conv = await Conversation.objects.aget(pk=frames[0]["conversation"]["id"])
        assert conv.system_prompt == PROMPT
    finally:
        await sock.close()
