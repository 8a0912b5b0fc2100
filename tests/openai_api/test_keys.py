"""Managing API keys (issue 17, item 6; docs/http.md "API keys", docs/api.md "Keys"): the
JSON API of the chat's account dialog and the server page's POST-redirect-GET."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from chatapp.openai_api.keys import NEW_KEY_SESSION, create_key, key_for_token
from chatapp.openai_api.models import ApiKey

pytestmark = pytest.mark.django_db


def logged_in(user: Any, csrf: bool = False) -> Client:
    c = Client(enforce_csrf_checks=csrf)
    c.force_login(user)
    return c


def create(c: Client, body: Any) -> Any:
    return c.post("/api/keys/", data=json.dumps(body), content_type="application/json")


@pytest.fixture
def alice(make_user: Any) -> Any:
    return make_user("alice")


def test_a_key_made_in_the_app_is_shown_once_and_works(alice: Any) -> None:
    c = logged_in(alice)
    answer = create(c, {"name": "laptop script"})
    assert answer.status_code == 201
    assert "no-store" in answer["Cache-Control"]
    body = answer.json()
    secret, key = body["secret"], body["key"]
    assert secret.startswith("sk-chat-") and secret.startswith(key["prefix"])
    assert key["name"] == "laptop script" and key["last_used_at"] is None
    assert key_for_token(secret).pk == key["id"]

    listed = c.get("/api/keys/").json()
    assert listed["max_keys"] == 20
    assert [k["id"] for k in listed["keys"]] == [key["id"]]
    assert listed["keys"][0]["last_used_at"] is not None  # the bearer check above used it
    text = json.dumps(listed)
    assert secret not in text and ApiKey.objects.get().key_hash not in text


def test_the_list_is_newest_first_with_prefix_created_and_last_use(alice: Any) -> None:
    c = logged_in(alice)
    first = create(c, {"name": "one"}).json()["key"]
    second = create(c, {"name": "two"}).json()["key"]
    keys = c.get("/api/keys/").json()["keys"]
    assert [k["name"] for k in keys] == ["two", "one"]
    assert set(keys[0]) == {"id", "name", "prefix", "created_at", "last_used_at"}
    assert keys[1]["prefix"] == first["prefix"] and keys[0]["created_at"] == second["created_at"]


def test_a_revoked_key_stops_working_and_leaves_the_list(alice: Any) -> None:
    c = logged_in(alice)
    body = create(c, {"name": "old"}).json()
    assert c.delete(f"/api/keys/{body['key']['id']}/").status_code == 204
    assert key_for_token(body["secret"]) is None
    assert c.get("/api/keys/").json()["keys"] == []
    assert c.delete(f"/api/keys/{body['key']['id']}/").status_code == 404


def test_another_user_can_neither_see_nor_revoke_a_key(alice: Any, make_user: Any) -> None:
    key, raw = create_key(alice, "alice's")
    bob = logged_in(make_user("bob"))
    assert bob.get("/api/keys/").json()["keys"] == []
    answer = bob.delete(f"/api/keys/{key.pk}/")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
    assert key_for_token(raw) is not None


def test_writes_need_a_login_and_a_csrf_token(alice: Any) -> None:
    assert Client().get("/api/keys/").status_code == 401
    assert create(Client(), {"name": "x"}).status_code == 401
    assert create(logged_in(alice, csrf=True), {"name": "x"}).status_code == 403
    key, raw = create_key(alice, "kept")
    assert logged_in(alice, csrf=True).delete(f"/api/keys/{key.pk}/").status_code == 403
    assert ApiKey.objects.count() == 1 and key_for_token(raw) is not None


def test_there_is_a_cap_on_keys_per_user_with_a_clear_error(
    alice: Any, make_user: Any, settings: Any
) -> None:
    settings.OPENAI_MAX_KEYS_PER_USER = 3
    c = logged_in(alice)
    made = [create(c, {"name": f"k{i}"}).json()["key"] for i in range(3)]
    answer = create(c, {"name": "one too many"})
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "too_many_keys"
    assert "3 API keys" in error["message"] and "Revoke one" in error["message"]
    assert ApiKey.objects.filter(owner=alice).count() == 3
    # The server page says the same.
    page = c.post("/settings/keys/", {"name": "from the page"})
    assert page.status_code == 409 and "3 API keys" in page.content.decode()
    # Other users have places of their own, and revoked keys do not count.
    assert create(logged_in(make_user("bob")), {"name": "bob's"}).status_code == 201
    c.delete(f"/api/keys/{made[0]['id']}/")
    assert create(c, {"name": "in its place"}).status_code == 201


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({}, 400, "invalid"),
        ({"name": "   "}, 400, "invalid"),
        ({"name": 7}, 400, "invalid"),
        ({"name": "x" * 101}, 400, "too_long"),
        ({"name": "lap\x00top"}, 400, "invalid"),
        ({"name": "ok", "scopes": ["all"]}, 400, "invalid"),
        (["name"], 400, "invalid"),
        ({"name": "y" * 5000}, 413, "too_large"),
    ],
)
def test_bad_names_are_refused_and_nothing_is_made(
    alice: Any, body: Any, status: int, code: str
) -> None:
    answer = create(logged_in(alice), body)
    assert answer.status_code == status, answer.content
    assert answer.json()["error"]["code"] == code
    assert not ApiKey.objects.exists()


def test_a_body_that_is_not_json_is_refused(alice: Any) -> None:
    answer = logged_in(alice).post("/api/keys/", data="name=x", content_type="text/plain")
    assert answer.status_code == 400 and not ApiKey.objects.exists()


# --- the server page -------------------------------------------------------------------


def test_the_keys_page_redirects_after_making_a_key_so_a_reload_makes_no_second(
    alice: Any,
) -> None:
    c = logged_in(alice)
    made = c.post("/settings/keys/", {"name": "script"})
    assert made.status_code == 303 and made["Location"] == "/settings/keys/"
    assert ApiKey.objects.count() == 1
    shown = c.get("/settings/keys/").content.decode()
    raw = re.search(r"sk-chat-[\w-]+", shown).group(0)
    assert key_for_token(raw) is not None
    assert 'data-testid="copy-key"' in shown
    # Reloading (what the browser does after the redirect: a GET) shows it no more and
    # makes nothing; the session has forgotten it.
    again = c.get("/settings/keys/").content.decode()
    assert raw not in again and ApiKey.objects.count() == 1
    assert NEW_KEY_SESSION not in c.session


def test_a_refused_name_on_the_page_is_said_and_shows_no_key(alice: Any) -> None:
    answer = logged_in(alice).post("/settings/keys/", {"name": "  "})
    assert answer.status_code == 400
    assert "The name is empty." in answer.content.decode()
    assert not ApiKey.objects.exists()


def test_a_keys_last_use_is_written_at_most_once_a_minute(alice: Any) -> None:
    """A request with a key updates its last use only if the one recorded is a minute old
    or more (the page shows it to the minute): a burst of requests makes one write."""
    secret = create(logged_in(alice), {"name": "burst"}).json()["secret"]
    key_for_token(secret)
    first = ApiKey.objects.get().last_used_at
    assert first is not None
    key_for_token(secret)
    assert ApiKey.objects.get().last_used_at == first
    ApiKey.objects.update(last_used_at=first - timedelta(seconds=61))
    key_for_token(secret)
    assert ApiKey.objects.get().last_used_at > first
