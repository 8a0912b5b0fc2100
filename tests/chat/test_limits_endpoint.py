"""GET /api/chat/limits/ (docs/http.md): the settings limits the server enforces, with its
defaults, so the settings dialog can refuse what a send would refuse (issue 17, item 5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from chatapp.chat.conversations import InvalidSettings, clean_settings

pytestmark = pytest.mark.django_db

URL = "/api/chat/limits/"


@pytest.fixture
def client(make_user: Any) -> Client:
    c = Client()
    c.force_login(make_user("limits-user"))
    return c


def test_limits_need_login_and_only_answer_get(client: Client) -> None:
    r = Client().get(URL)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "unauthenticated"
    assert client.post(URL).status_code == 405


def test_limits_follow_the_settings(client: Client, settings: Any) -> None:
    settings.CHAT_MAX_NEW_TOKENS = 1500
    settings.CHAT_MAX_MESSAGE_CHARS = 9000
    settings.CHAT_MAX_FRAME_BYTES = 70000
    settings.CHAT_DEFAULTS = {
        "system_prompt": "Be brief.",
        "temperature": 0.3,
        "top_p": 0.8,
        "max_tokens": 256,
    }
    body = client.get(URL).json()
    assert body["max_tokens"] == {"min": 1, "max": 1500, "default": 256}
    assert body["temperature"] == {"min": 0.0, "max": 2.0, "default": 0.3}
    assert body["top_p"] == {"min": 0.0, "min_exclusive": True, "max": 1.0, "default": 0.8}
    assert body["system_prompt"] == {"max_chars": 9000, "default": "Be brief."}
    assert body["message"] == {"max_chars": 9000, "max_frame_bytes": 70000}
    # No engine is installed in this test: the context window is unknown, said as null.
    assert body["context_tokens"] is None


def test_the_reported_ranges_are_exactly_what_the_server_accepts(client: Client) -> None:
    """Each reported bound is accepted and the value just past it is refused, by the same
    validation the chat socket and the conversations API use."""
    lim = client.get(URL).json()
    mt, temp, top_p = lim["max_tokens"], lim["temperature"], lim["top_p"]
    assert mt["max"] == 2048  # CHAT_MAX_NEW_TOKENS' default: the limit issue 17 saw refused
    for ok in ({"max_tokens": mt["min"]}, {"max_tokens": mt["max"]}):
        assert clean_settings(ok) == ok
    for bad in (mt["min"] - 1, mt["max"] + 1):
        with pytest.raises(InvalidSettings, match=r"^Max tokens must be between 1 and 2,048\.$"):
            clean_settings({"max_tokens": bad})
    assert clean_settings({"temperature": temp["min"], "top_p": top_p["max"]})
    assert clean_settings({"temperature": temp["max"]})
    with pytest.raises(InvalidSettings):
        clean_settings({"temperature": temp["max"] + 0.01})
    with pytest.raises(InvalidSettings):
        clean_settings({"top_p": top_p["min"]})  # min_exclusive
    with pytest.raises(InvalidSettings):
        clean_settings({"top_p": top_p["max"] + 0.01})
    # And over HTTP: the default is valid, one past max is a 400 with the same words.
    r = client.post(
        "/api/conversations/",
        data=json.dumps({"settings": {"max_tokens": mt["max"] + 1}}),
        content_type="application/json",
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "Max tokens must be between 1 and 2,048."
    assert clean_settings({k: lim[k]["default"] for k in ("max_tokens", "temperature", "top_p")})


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        # The settings dialog's words (frontend/src/limits.ts, fieldError), not the fields'
        # names: a send the dialog did not check (an old draft, another client) reads the same.
        ({"max_tokens": 4000}, "Max tokens must be between 1 and 2,048."),
        ({"max_tokens": 0}, "Max tokens must be between 1 and 2,048."),
        ({"max_tokens": 12.5}, "Max tokens must be a whole number."),
        ({"max_tokens": "many"}, "Max tokens must be a number."),
        ({"max_tokens": True}, "Max tokens must be a number."),
        ({"temperature": 2.01}, "Temperature must be between 0 and 2."),
        ({"temperature": -1}, "Temperature must be between 0 and 2."),
        ({"temperature": "hot"}, "Temperature must be a number."),
        ({"temperature": float("nan")}, "Temperature must be between 0 and 2."),
        ({"top_p": 0}, "Top-p must be more than 0 and at most 1."),
        ({"top_p": 1.5}, "Top-p must be more than 0 and at most 1."),
        ({"top_p": None}, "Top-p must be a number."),
        ({"system_prompt": 5}, "The system prompt must be a string."),
        ({"system_prompt": "x" * 32001}, "The system prompt is longer than 32,000 characters."),
        ({"system_prompt": "a\x00b"}, "The system prompt contains a NUL character."),
        ({"seed": 1}, "Unknown setting: seed."),
        ({"seed": 1, "top_k": 5}, "Unknown settings: seed, top_k."),
        ([], "The settings must be an object."),
    ],
)
def test_refused_settings_are_explained_in_the_dialogs_words(
    client: Client, raw: Any, words: str
) -> None:
    with pytest.raises(ValueError) as refused:  # InvalidSettings, or InvalidText for text
        clean_settings(raw)
    assert str(refused.value) == words
    r = client.post(
        "/api/conversations/",
        data=json.dumps({"settings": raw}),
        content_type="application/json",
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"] == words


def test_a_model_name_that_cannot_be_one_is_explained_in_words(client: Client) -> None:
    r = client.post(
        "/api/conversations/",
        data=json.dumps({"model": "m" * 201}),
        content_type="application/json",
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "The model must be a model's name of at most 200 characters."
    )


def test_favicon_is_served(client: Client) -> None:
    r = Client().get("/favicon.ico")
    assert r.status_code == 301
    assert r["Location"] == "/static/chatapp/favicon.svg"
    found = finders.find("chatapp/favicon.svg")
    assert found and Path(found).read_text().startswith("<svg")
    page = client.get("/")
    assert b'rel="icon" href="/static/chatapp/favicon.svg"' in page.content
