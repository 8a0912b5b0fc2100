"""The JSON HTTP API behind the UI (docs/http.md): ownership, validation, branches."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from chatapp.chat.conversations import add_exchange, create_conversation
from chatapp.chat.models import Conversation, Message

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(make_user: Any) -> Any:
    return make_user("alice")


@pytest.fixture
def client_for(alice: Any) -> Any:
    def login(user: Any) -> Client:
        c = Client(enforce_csrf_checks=False)
        c.force_login(user)
        return c

    return login


def patch(c: Client, url: str, body: Any) -> Any:
    return c.patch(url, data=json.dumps(body), content_type="application/json")


def finish(reply: Message, text: str) -> None:
    reply.text, reply.status, reply.finish_reason = text, "complete", "stop"
    reply.save()


def test_api_needs_login() -> None:
    answer = Client().get("/api/conversations/")
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthenticated"


def test_chat_page_redirects_anonymous_people_to_login() -> None:
    answer = Client().get("/")
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")


def test_chat_page_renders_for_a_logged_in_user(alice: Any, client_for: Any) -> None:
    page = client_for(alice).get("/")
    assert page.status_code == 200
    assert b'id="app"' in page.content and b"/static/app.js" in page.content


def test_conversations_are_listed_newest_first_and_searchable(alice: Any, client_for: Any) -> None:
    c = client_for(alice)
    older = create_conversation(alice, "About llamas")
    newer = create_conversation(alice, "About caches")
    listing = c.get("/api/conversations/").json()["conversations"]
    assert [x["id"] for x in listing] == [newer.pk, older.pk]
    found = c.get("/api/conversations/", {"q": "llama"}).json()["conversations"]
    assert [x["id"] for x in found] == [older.pk]


def test_create_rename_update_settings_and_delete(alice: Any, client_for: Any) -> None:
    c = client_for(alice)
    made = c.post(
        "/api/conversations/",
        data=json.dumps({"title": "Plan", "settings": {"temperature": 0.2}}),
        content_type="application/json",
    )
    assert made.status_code == 201
    conv = made.json()
    assert conv["settings"]["temperature"] == 0.2
    url = f"/api/conversations/{conv['id']}/"
    renamed = patch(
        c,
        url,
        {"title": "Better plan", "settings": {"system_prompt": "Be brief.", "max_tokens": 64}},
    )
    assert renamed.status_code == 200
    body = renamed.json()["conversation"]
    assert body["title"] == "Better plan" and body["settings"]["max_tokens"] == 64
    assert c.delete(url).status_code == 204
    assert not Conversation.objects.filter(pk=conv["id"]).exists()


@pytest.mark.parametrize(
    "body",
    [
        {"settings": {"temperature": 5}},
        {"settings": {"top_p": 0}},
        {"settings": {"max_tokens": 0}},
        {"settings": {"max_tokens": "many"}},
        {"settings": {"unknown": 1}},
        {"title": 5},
        {"nonsense": True},
    ],
)
def test_invalid_updates_are_refused_and_change_nothing(
    alice: Any, client_for: Any, body: Any
) -> None:
    conv = create_conversation(alice, "Keep me")
    answer = patch(client_for(alice), f"/api/conversations/{conv.pk}/", body)
    assert answer.status_code == 400 and answer.json()["error"]["message"]
    conv.refresh_from_db()
    assert conv.title == "Keep me" and conv.temperature == 0.7


def test_malformed_json_body_is_a_400(alice: Any, client_for: Any) -> None:
    answer = client_for(alice).post(
        "/api/conversations/", data="{oops", content_type="application/json"
    )
    assert answer.status_code == 400


def test_other_users_conversations_are_not_found(
    alice: Any, client_for: Any, make_user: Any
) -> None:
    conv = create_conversation(alice, "Private")
    bob = client_for(make_user("bob"))
    for method, url in [
        ("get", f"/api/conversations/{conv.pk}/"),
        ("patch", f"/api/conversations/{conv.pk}/"),
        ("delete", f"/api/conversations/{conv.pk}/"),
        ("get", f"/api/conversations/{conv.pk}/export.md"),
        ("get", f"/api/conversations/{conv.pk}/export.json"),
    ]:
        if method == "get":
            answer = bob.get(url)
        else:
            answer = getattr(bob, method)(url, data="{}", content_type="application/json")
        assert answer.status_code == 404, (method, url)
    assert bob.get("/api/conversations/").json()["conversations"] == []
    assert Conversation.objects.filter(pk=conv.pk).exists()


def test_flipping_between_alternative_replies(alice: Any, client_for: Any) -> None:
    conv = create_conversation(alice)
    user_msg, first = add_exchange(conv, None, "Hi", [])
    finish(first, "Hello!")
    _, second = add_exchange(conv, user_msg, None, [])
    finish(second, "Hey there!")
    c = client_for(alice)
    url = f"/api/conversations/{conv.pk}/"
    shown = c.get(url).json()["messages"]
    assert [m["text"] for m in shown] == ["Hi", "Hey there!"]
    assert shown[1]["alternatives"] == [first.pk, second.pk] and shown[1]["alternative_index"] == 1
    flipped = patch(c, url, {"active_message": first.pk}).json()["messages"]
    assert [m["text"] for m in flipped] == ["Hi", "Hello!"]
    assert flipped[1]["alternative_index"] == 0


def test_export_markdown_and_json(alice: Any, client_for: Any) -> None:
    conv = create_conversation(alice, "Trip")
    _, reply = add_exchange(conv, None, "Where to?", [])
    finish(reply, "Lisbon.")
    c = client_for(alice)
    md = c.get(f"/api/conversations/{conv.pk}/export.md")
    assert md.status_code == 200 and "attachment" in md["Content-Disposition"]
    assert "Where to?" in md.content.decode() and "Lisbon." in md.content.decode()
    data = c.get(f"/api/conversations/{conv.pk}/export.json").json()
    assert [m["text"] for m in data["messages"]] == ["Where to?", "Lisbon."]


def test_signup_creates_an_account_and_can_be_turned_off(settings: Any) -> None:
    c = Client()
    answer = c.post(
        "/accounts/signup/",
        {
            "username": "newbie",
            "password1": "a-long-test-password-1",
            "password2": "a-long-test-password-1",
        },
    )
    assert answer.status_code == 302
    assert c.get("/api/me/").json()["username"] == "newbie"
    weak = Client().post(
        "/accounts/signup/", {"username": "weak", "password1": "123", "password2": "123"}
    )
    assert weak.status_code == 200 and b"errorlist" in weak.content
    settings.CHAT_ALLOW_SIGNUP = False
    assert Client().get("/accounts/signup/").status_code == 404


def test_login_and_logout(alice: Any) -> None:
    c = Client()
    page = c.post("/accounts/login/", {"username": "alice", "password": "a-long-test-password-1"})
    assert page.status_code == 302
    assert c.get("/api/me/").status_code == 200
    c.post("/accounts/logout/")
    assert c.get("/api/me/").status_code == 401
