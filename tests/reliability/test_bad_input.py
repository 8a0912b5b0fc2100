"""Input that a database, a JSON parser or a transport cannot take gets a clear 400/413
error object (an `error` frame on the socket), never a 500, an HTML page or a misleading
503, and nothing of it is written. Each case runs on SQLite and, in the PostgreSQL pass of
`make test`, on PostgreSQL, where a NUL is a database error rather than a stored byte."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client, RequestFactory
from django_ratelimit.core import _get_window

from chatapp.chat.conversations import create_conversation
from chatapp.chat.models import Conversation, Message
from chatapp.openai_api.keys import create_key
from chatapp.openai_api.limits import KeyLimiter, RateLimited
from chatapp.openai_api.models import ApiKey
from tests.servers import started, users_code
from tests.sockets import open_socket
from tools.live_server import LiveServer

pytestmark = pytest.mark.django_db(transaction=True)

# Text no column can hold: a lone surrogate is not encodable as UTF-8 at all, and
# PostgreSQL refuses NUL in text.
UNSTORABLE = {"lone surrogate": "a\ud800b", "NUL": "a\x00b"}
DEEP = '{"model":' + "[" * 5000 + "]" * 5000 + "}"


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def assert_api_error(answer: Any, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.content[:300]
    assert answer["Content-Type"] == "application/json"
    error = answer.json()["error"]
    assert error["message"]
    return error


@pytest.mark.parametrize("bad", UNSTORABLE.values(), ids=UNSTORABLE.keys())
@pytest.mark.parametrize("field", ["title", "system_prompt"])
def test_renaming_with_unstorable_text_is_refused_and_changes_nothing(
    field: str, bad: str, make_user: Any
) -> None:
    user = make_user("renamer")
    conv = create_conversation(user, "Kept", {"system_prompt": "Kept prompt"})
    body = {"title": bad} if field == "title" else {"settings": {"system_prompt": bad}}
    answer = logged_in(user).patch(
        f"/api/conversations/{conv.pk}/", data=json.dumps(body), content_type="application/json"
    )
    error = assert_api_error(answer, 400)
    assert error["code"] == "invalid"
    fresh = Conversation.objects.get(pk=conv.pk)
    assert (fresh.title, fresh.system_prompt) == ("Kept", "Kept prompt")


@pytest.mark.parametrize("bad", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_creating_a_conversation_with_unstorable_text_is_refused(bad: str, make_user: Any) -> None:
    user = make_user("creator")
    client = logged_in(user)
    for body in ({"title": bad}, {"settings": {"system_prompt": bad}}):
        answer = client.post(
            "/api/conversations/", data=json.dumps(body), content_type="application/json"
        )
        assert_api_error(answer, 400)
    assert not Conversation.objects.filter(owner=user).exists()


def test_searching_for_a_nul_is_refused_not_a_database_error(make_user: Any) -> None:
    answer = logged_in(make_user("seeker")).get("/api/conversations/", {"q": "a\x00b"})
    assert_api_error(answer, 400)


@pytest.mark.parametrize("bad", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_a_socket_send_with_an_unstorable_system_prompt_gets_an_invalid_frame(
    bad: str, make_user: Any, tiny_engine: Any
) -> None:
    user = make_user("sockets")

    async def exchange() -> dict[str, Any]:
        sock, connected, _ = await open_socket(user)
        assert connected
        try:
            await sock.send(
                {"type": "send", "conversation_id": None, "text": "hello",
                 "settings": {"system_prompt": bad}, "client_id": "c1"}
            )  # fmt: skip
            frame = await sock.recv(timeout=20)
            await sock.send({"type": "ping"})
            assert (await sock.recv(timeout=10))["type"] == "pong"
            return frame
        finally:
            await sock.close()

    frame = async_to_sync(exchange)()
    assert frame["type"] == "error" and frame["code"] == "invalid", frame
    assert frame["client_id"] == "c1" and "system prompt" in frame["message"].lower()
    assert not Conversation.objects.filter(owner=user).exists()
    assert not Message.objects.filter(conversation__owner=user).exists()


def test_an_api_key_name_with_a_nul_is_refused(make_user: Any) -> None:
    user = make_user("keyholder")
    answer = logged_in(user).post("/settings/keys/", {"name": "lap\x00top"})
    assert answer.status_code == 400
    assert b"NUL" in answer.content
    assert not user.api_keys.exists()


# --- /v1 and /api bodies a parser cannot take ------------------------------------------


@pytest.fixture
def api_client(make_user: Any) -> Client:
    _, raw = create_key(make_user("apiclient"), "t")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_deeply_nested_json_is_a_400_error_object_on_v1(path: str, api_client: Client) -> None:
    answer = api_client.post(path, data=DEEP, content_type="application/json")
    assert assert_api_error(answer, 400)["type"] == "invalid_request_error"


def test_deeply_nested_json_is_a_400_error_object_on_the_conversation_api(
    make_user: Any,
) -> None:
    client = logged_in(make_user("nester"))
    answer = client.post("/api/conversations/", data=DEEP, content_type="application/json")
    assert_api_error(answer, 400)


def test_a_body_over_the_upload_limit_is_a_413_error_object_on_v1(api_client: Client) -> None:
    body = json.dumps({"model": "x", "prompt": "a" * (3 * 1024 * 1024)})
    answer = api_client.post("/v1/completions", data=body, content_type="application/json")
    assert assert_api_error(answer, 413)["code"] == "request_too_large"


def test_a_body_over_the_upload_limit_is_a_413_error_object_on_the_conversation_api(
    make_user: Any,
) -> None:
    user = make_user("bulky")
    body = json.dumps({"title": "t", "settings": {"system_prompt": "a" * (3 * 1024 * 1024)}})
    answer = logged_in(user).post("/api/conversations/", data=body, content_type="application/json")
    assert_api_error(answer, 413)
    assert not Conversation.objects.filter(owner=user).exists()


@pytest.mark.parametrize(
    "limits",
    [
        {"max_completion_tokens": 1, "max_tokens": -1},
        {"max_completion_tokens": -1, "max_tokens": 1},
        {"max_completion_tokens": 1, "max_tokens": 5},
    ],
    ids=["bad max_tokens", "bad max_completion_tokens", "conflicting"],
)
def test_both_token_limit_aliases_are_checked_and_must_agree(
    limits: dict[str, int], api_client: Client
) -> None:
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], **limits}
    answer = api_client.post(
        "/v1/chat/completions", data=json.dumps(body), content_type="application/json"
    )
    error = assert_api_error(answer, 400)
    assert error["param"] in ("max_tokens", "max_completion_tokens")


def test_unencodable_text_in_an_openai_message_is_a_400(api_client: Client) -> None:
    """A lone surrogate cannot be encoded at all. (NUL passes: the API stores no message
    text, and a model's own reply can hold one: tests/openai_api/test_openai.py.)"""
    body = {"model": "x", "messages": [{"role": "user", "content": UNSTORABLE["lone surrogate"]}]}
    answer = api_client.post(
        "/v1/chat/completions", data=json.dumps(body), content_type="application/json"
    )
    assert assert_api_error(answer, 400)["param"] == "messages[0].content"


# --- every /v1 and /api answer is JSON in its documented shape --------------------------


@pytest.mark.parametrize(
    "path", ["/v1/embeddings", "/v1/chat/completions/", "/v1/models/x%0ay", "/v1/nothing"]
)
def test_an_unknown_v1_path_is_a_404_error_object(path: str, api_client: Client) -> None:
    answer = api_client.get(path)
    error = assert_api_error(answer, 404)
    assert error["type"] == "invalid_request_error" and error["code"] == "not_found"


def test_an_unknown_api_path_and_a_missing_export_are_404_error_objects(make_user: Any) -> None:
    client = logged_in(make_user("lost"))
    assert assert_api_error(client.get("/api/nothing/"), 404)["code"] == "not_found"
    assert assert_api_error(client.get("/api/exports/999999/download"), 404)["code"] == "not_found"
    assert assert_api_error(Client().get("/api/exports/"), 401)["code"] == "unauthenticated"


def test_a_csrf_failure_on_the_api_is_a_403_error_object(make_user: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("forgetful"))
    answer = client.post("/api/conversations/", data="{}", content_type="application/json")
    assert assert_api_error(answer, 403)["code"] == "csrf_failed"
    assert not Conversation.objects.exists()


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("stop", "x" * 500_000, "at most 256 characters"),
        ("stop", ["a", "b", "c", "d", "e"], "at most 4"),
        ("cache_salt", "s" * 900_000, "at most 256 characters"),
        ("max_tokens", 2049, "between 1 and 2048"),
        ("max_completion_tokens", 0, "between 1 and 2048"),
    ],
    ids=["long stop", "five stops", "long cache_salt", "max_tokens", "max_completion_tokens"],
)
def test_a_v1_field_out_of_bounds_is_named_with_the_limit_that_applies(
    field: str, value: Any, words: str, api_client: Client
) -> None:
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], field: value}
    answer = api_client.post(
        "/v1/chat/completions", data=json.dumps(body), content_type="application/json"
    )
    error = assert_api_error(answer, 400)
    assert error["param"] == field, error
    assert words in error["message"], error


def test_waiting_the_advertised_retry_after_gets_past_the_per_minute_limit(
    make_user: Any,
) -> None:
    user = make_user("eager")
    # A key whose counting window ends a few seconds from now (each key's edge differs).
    for _ in range(500):
        key, _raw = create_key(user, "k")
        if 1.5 < _get_window(str(key.pk), 60) + 1 - time.time() < 4:
            break
    ApiKey.objects.filter(pk=key.pk).update(rate_limit_per_minute=1)
    key.refresh_from_db()
    request = RequestFactory().post("/v1/chat/completions")
    limiter = KeyLimiter()
    # acquire returns the coroutine function that ends the request: ended at once here.
    async_to_sync(async_to_sync(limiter.acquire)(key, request))()
    with pytest.raises(RateLimited) as limited:
        async_to_sync(limiter.acquire)(key, request)
    time.sleep(limited.value.retry_after + 0.2)
    async_to_sync(async_to_sync(limiter.acquire)(key, request))()  # not refused again


# --- frames larger than the transport's own limit (a real daphne) ------------------------

PASSWORD = "a-long-test-password-1"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LiveServer]:
    srv = started(LiveServer(tmp_path_factory.mktemp("bad-input-server"), tiny_model_dir),
                  users_code("framer", password=PASSWORD))  # fmt: skip
    yield srv
    srv.stop()


@pytest.mark.parametrize("megabytes", [2, 12])
def test_a_frame_over_a_mebibyte_gets_frame_too_large_and_the_socket_stays_open(
    megabytes: int, server: LiveServer
) -> None:
    with server.chat_socket("framer", PASSWORD) as sock:
        frame = json.dumps({"type": "send", "text": "x" * (megabytes * 1024 * 1024)})
        sock.send(frame)
        answer = json.loads(sock.recv(timeout=30))
        assert answer["type"] == "error" and answer["code"] == "frame_too_large", answer
        sock.send(json.dumps({"type": "ping"}))
        assert json.loads(sock.recv(timeout=10))["type"] == "pong"
