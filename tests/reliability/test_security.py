"""Nobody is let in where they should not be."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from chatapp.openai_api.keys import create_key
from chatapp.openai_api.models import ApiKey

pytestmark = pytest.mark.django_db

PUBLIC = {"/accounts/login/", "/accounts/signup/", "/healthz", "/accounts/logout/", "/favicon.ico"}


def every_path(resolver: URLResolver | None = None, prefix: str = "") -> list[str]:
    paths = []
    for entry in (resolver or get_resolver()).url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            if route.startswith("admin/"):
                paths.append("/admin/")  # Django's own admin guards its views
                continue
            paths.extend(every_path(entry, route))
        elif isinstance(entry, URLPattern):
            concrete = re.sub(r"<(?:\w+:)?\w+>", "1", route)
            concrete = re.sub(r"\(\?P<fmt>[^)]*\)", "md", concrete)
            concrete = re.sub(r"\(\?P<\w+>[^)]*\)", "1", concrete)
            paths.append("/" + concrete.lstrip("^").rstrip("$").replace("\\.", "."))
    return paths


def test_every_route_needs_a_login_except_the_public_ones() -> None:
    paths = every_path()
    assert "/api/conversations/" in paths and "/v1/chat/completions" in paths
    for path in paths:
        if path in PUBLIC:
            continue
        for method in ("get", "post"):
            answer = getattr(Client(), method)(path)
            assert answer.status_code in (302, 401, 403, 404, 405), (
                method,
                path,
                answer.status_code,
            )
            if answer.status_code == 302:
                assert "/login/" in answer["Location"], (path, answer["Location"])


def test_forms_and_json_api_need_csrf_tokens(make_user: Any) -> None:
    user = make_user("csrf")
    c = Client(enforce_csrf_checks=True)
    c.force_login(user)
    assert (
        c.post("/api/conversations/", data="{}", content_type="application/json").status_code == 403
    )
    assert c.post("/settings/keys/", {"name": "x"}).status_code == 403
    assert not ApiKey.objects.exists()


def test_api_keys_belong_to_their_owner(make_user: Any) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    key, raw = create_key(alice, "laptop")
    c = Client()
    c.force_login(bob)
    assert raw not in c.get("/settings/keys/").content.decode()
    assert key.prefix not in c.get("/settings/keys/").content.decode()
    assert c.post(f"/settings/keys/{key.pk}/revoke").status_code == 404
    key.refresh_from_db()
    assert key.revoked_at is None
    c.force_login(alice)
    page = c.get("/settings/keys/").content.decode()
    assert key.prefix in page and raw not in page  # the key itself is shown only once
    assert c.post(f"/settings/keys/{key.pk}/revoke").status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_a_new_key_is_shown_once_and_stored_hashed(make_user: Any) -> None:
    c = Client()
    c.force_login(make_user("keen"))
    page = c.post("/settings/keys/", {"name": "script"}, follow=True).content.decode()
    raw = re.search(r"sk-chat-[\w-]+", page).group(0)
    assert not ApiKey.objects.filter(key_hash=raw).exists()
    assert raw not in c.get("/settings/keys/").content.decode()


def test_thousands_of_messages_in_one_conversation_still_load(make_user: Any) -> None:
    from chatapp.chat.conversations import add_exchange, create_conversation
    from chatapp.chat.models import Conversation, Message

    user = make_user("long")
    conv = create_conversation(user, "Long")
    # The first exchange the app's way; the other 1,499 in a few queries (the thread's
    # shape, not how each was written, is what loading it exercises).
    _, reply = add_exchange(conv, None, "question 0", [])
    reply.text, reply.status = "answer 0", "complete"
    reply.save()
    rest = Message.objects.bulk_create(
        Message(conversation=conv, role=role, text=f"{kind} {i}")
        for i in range(1, 1500)
        for role, kind in ((Message.Role.USER, "question"), (Message.Role.ASSISTANT, "answer"))
    )
    parent = reply
    for message in rest:
        message.parent, parent = parent, message
    Message.objects.bulk_update(rest, ["parent"], batch_size=500)
    Conversation.objects.filter(pk=conv.pk).update(active_leaf=parent)
    c = Client()
    c.force_login(user)
    # Paged, newest first (docs/http.md): every page loads, and together they are the thread.
    url = f"/api/conversations/{conv.pk}/"
    page = c.get(url, {"limit": 1000}).json()
    messages = page["messages"]
    assert messages[-1]["text"] == "answer 1499"
    while page["older"]:
        page = c.get(url, {"before": messages[0]["id"], "limit": 1000}).json()
        messages = page["messages"] + messages
    assert len(messages) == 3000 and messages[0]["text"] == "question 0"
