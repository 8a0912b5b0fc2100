"""Property-based fuzzing of every parser that reads what a client sends: the chat
WebSocket frames, the JSON API bodies and the OpenAI request bodies. Whatever arrives,
the answer is a clear error (or a valid result), the process keeps serving and stored
data is unchanged. The classes of input that once got a 500 or an HTML page are
generated, not only listed: text with lone surrogates and NULs in every string slot,
JSON nested thousands deep, bodies around and past the size limits, and the two names
of the token limit given together."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from chatapp.chat.conversations import create_conversation
from chatapp.chat.models import Conversation, Message
from chatapp.openai_api.keys import create_key
from chatapp.openai_api.views import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    ApiError,
    ApiRequest,
    parse_chat,
    parse_completion,
)
from tests.sockets import open_socket

pytestmark = pytest.mark.django_db(transaction=True)

# Hypothesis runs many examples inside one test (one database): a fresh user each time.
SERIAL = itertools.count()

KNOWN_CODES = {
    "bad_frame",
    "frame_too_large",
    "not_found",
    "busy",
    "too_long",
    "already_streaming",
    "engine_unavailable",
    "engine_error",
    "invalid",
    "rate_limited",
}

# Text as a client may send it in JSON: any code point, and often the ones no database
# column takes (a lone surrogate is not even UTF-8; PostgreSQL refuses NUL).
unstorable = st.sampled_from(["\x00", "\ud800", "\udbff", "\udc80", "\udfff"])
hostile_text = st.lists(st.characters() | unstorable, max_size=40).map("".join)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | hostile_text
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=12,
)
frame_types = st.sampled_from(
    ["send", "stop", "regenerate", "edit", "resume", "ping", "nope", "", "SEND"]
)
frames = st.one_of(
    json_values.map(json.dumps),
    st.text(min_size=1, max_size=80),  # not JSON at all, control characters included
    st.fixed_dictionaries(
        {"type": frame_types},
        optional={
            "conversation_id": json_values,
            "message_id": json_values,
            "text": json_values,
            "settings": json_values,
            "client_id": json_values,
        },
    ).map(json.dumps),
)
# A send whose text and settings hold unstorable text, deep nesting or oversize values.
hostile_sends = st.fixed_dictionaries(
    {"type": st.sampled_from(["send", "edit"]), "text": hostile_text | st.just("hello")},
    optional={
        "conversation_id": st.none(),
        "message_id": st.integers(-2, 2),
        "settings": st.fixed_dictionaries(
            {},
            optional={
                "system_prompt": hostile_text | st.just("x" * 40000),
                "max_tokens": st.sampled_from([-1, 0, 1, 2, 1 << 40]),
            },
        ),
        "client_id": hostile_text,
    },
).map(json.dumps)
deep_json = st.integers(1, 6000).map(
    lambda n: '{"type": "send", "text": ' + "[" * n + "]" * n + "}"
)
# JSON escapes a lone surrogate; a raw one cannot even be sent as text.
frames = frames.filter(bool) | hostile_sends | deep_json


def is_valid_send(raw: str) -> bool:
    try:
        frame = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(frame, dict) and frame.get("type") in {"send", "edit", "regenerate"}


@hsettings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=frames)
def test_any_chat_frame_gets_an_answer_and_the_socket_survives(
    raw: str, make_user: Any, tiny_engine: Any, settings: Any
) -> None:
    settings.CHAT_DEFAULTS = {**settings.CHAT_DEFAULTS, "max_tokens": 3}
    user = make_user(f"fuzz{next(SERIAL)}")

    async def exchange() -> list[dict]:
        sock, connected, _ = await open_socket(user)
        assert connected
        try:
            await sock.c.send_to(text_data=raw)
            seen = []
            if not is_valid_send(raw):
                seen.append(await sock.recv(timeout=10))
            else:
                while True:  # a valid request streams; wait for its end or its refusal
                    seen.append(await sock.recv(timeout=30))
                    if seen[-1]["type"] in ("done", "error"):
                        break
            await sock.send({"type": "ping"})
            while (frame := await sock.recv(timeout=10))["type"] != "pong":
                seen.append(frame)
            return seen
        finally:
            await sock.close()

    before = Message.objects.count()
    seen = async_to_sync(exchange)()
    for frame in seen:
        assert isinstance(frame, dict) and isinstance(frame.get("type"), str)
        if frame["type"] == "error":
            assert frame["code"] in KNOWN_CODES, frame
            assert isinstance(frame["message"], str) and frame["message"]
    if all(f["type"] == "error" for f in seen):
        assert Message.objects.count() == before


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable(text: str) -> bool:
    return encodable(text) and "\x00" not in text


def read_storable(text: str) -> bool:
    """Whether `text` is storable as the server reads it from JSON, where a high and a
    low surrogate escape side by side make one (valid) character."""
    return storable(json.loads(json.dumps(text)))


unstorable_sends = st.fixed_dictionaries(
    {
        "type": st.just("send"),
        "conversation_id": st.none(),
        "text": hostile_text | st.just("hello"),
        "settings": st.fixed_dictionaries({"system_prompt": hostile_text | st.just("Be brief.")}),
    }
).filter(lambda f: not (read_storable(f["text"]) and read_storable(f["settings"]["system_prompt"])))


@hsettings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(frame=unstorable_sends)
def test_a_send_with_unstorable_text_is_refused_before_anything_is_saved(
    frame: dict, make_user: Any, tiny_engine: Any
) -> None:
    user = make_user(f"unstorable{next(SERIAL)}")

    async def exchange() -> dict:
        sock, connected, _ = await open_socket(user)
        assert connected
        try:
            await sock.c.send_to(text_data=json.dumps(frame))
            return await sock.recv(timeout=20)
        finally:
            await sock.close()

    answer = async_to_sync(exchange)()
    assert answer["type"] == "error" and answer["code"] == "invalid", answer
    assert not Conversation.objects.filter(owner=user).exists()


# Every field either parser knows, plus ones it must refuse or accept only at defaults.
OPENAI_KEYS = sorted(CHAT_FIELDS | COMPLETION_FIELDS | {"logprobs", "frequency_penalty", "tools"})


@hsettings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.dictionaries(st.sampled_from(OPENAI_KEYS), json_values, max_size=8))
def test_openai_bodies_parse_or_fail_with_an_openai_error(body: dict, settings: Any) -> None:
    for parse in (parse_chat, parse_completion):
        try:
            request = parse(dict(body))
        except ApiError as exc:
            assert exc.status in (400, 404, 413) and exc.message
            assert exc.response()["Content-Type"] == "application/json"
        else:
            assert isinstance(request, ApiRequest)
            request.sampling.validate()


@hsettings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=json_values, raw=st.binary(max_size=60))
def test_conversation_api_refuses_bad_bodies_without_changing_anything(
    body: Any, raw: bytes, make_user: Any
) -> None:
    user = make_user(f"api{next(SERIAL)}")
    conv = create_conversation(user, "Stable title")
    client = Client()
    client.force_login(user)
    url = f"/api/conversations/{conv.pk}/"
    for payload in (json.dumps(body), raw):
        answer = client.patch(url, data=payload, content_type="application/json")
        assert answer.status_code in (200, 400, 404), answer.content
        if answer.status_code != 200:
            assert answer.json()["error"]["message"]
        created = client.post("/api/conversations/", data=payload, content_type="application/json")
        assert created.status_code in (201, 400)
    fresh = Conversation.objects.get(pk=conv.pk)
    if not (isinstance(body, dict) and set(body) <= {"title", "settings", "active_message"}):
        assert fresh.title == "Stable title"


conversation_edits = st.fixed_dictionaries(
    {},
    optional={
        "title": hostile_text | json_values,
        "settings": st.fixed_dictionaries(
            {}, optional={"system_prompt": hostile_text | json_values, "top_p": json_values}
        ),
    },
)


@hsettings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=conversation_edits, create=st.booleans())
def test_conversation_text_is_either_stored_intact_or_refused_whole(
    body: dict, create: bool, make_user: Any
) -> None:
    """Whatever text a rename or a new conversation carries: a 400 that changes nothing,
    or a 200/201 whose text reads back exactly as sent; never a 500 or a database error."""
    user = make_user(f"text{next(SERIAL)}")
    conv = create_conversation(user, "Stable title", {"system_prompt": "Stable prompt"})
    client = Client()
    client.force_login(user)
    payload = json.dumps(body)
    if create:
        answer = client.post("/api/conversations/", data=payload, content_type="application/json")
    else:
        answer = client.patch(
            f"/api/conversations/{conv.pk}/", data=payload, content_type="application/json"
        )
    assert answer.status_code in (200, 201, 400), answer.content[:300]
    assert answer["Content-Type"] == "application/json"
    stored = Conversation.objects.filter(owner=user).order_by("id")
    if answer.status_code == 400:
        assert answer.json()["error"]["message"]
        assert [(c.title, c.system_prompt) for c in stored] == [("Stable title", "Stable prompt")]
        return
    saved = stored.last() if create else stored.get(pk=conv.pk)
    # What the server read: in JSON a high and a low surrogate escape make one character.
    body = json.loads(payload)
    sent_title = body.get("title", None if create else "Stable title")
    if isinstance(sent_title, str):
        assert storable(sent_title) and saved.title == sent_title.strip()
    prompt = body.get("settings", {}).get("system_prompt")
    if isinstance(prompt, str):
        assert storable(prompt) and saved.system_prompt == prompt


token_limits = st.integers(-3, 3000) | st.none() | st.just(True) | st.floats(allow_nan=False)


@hsettings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(max_tokens=token_limits, max_completion_tokens=token_limits, prompt=hostile_text)
def test_both_names_of_the_token_limit_are_checked_and_must_agree(
    max_tokens: Any, max_completion_tokens: Any, prompt: str, settings: Any
) -> None:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
    for name, value in (
        ("max_tokens", max_tokens),
        ("max_completion_tokens", max_completion_tokens),
    ):
        if value is not None:
            body[name] = value
    try:
        request = parse_chat(body)
    except ApiError as exc:
        assert exc.status == 400 and exc.message
        return
    # The API stores no message text: NUL passes, a lone surrogate does not.
    assert encodable(prompt)
    given_limits = {v for v in (max_tokens, max_completion_tokens) if v is not None}
    assert len(given_limits) <= 1
    for value in given_limits:
        assert isinstance(value, int) and not isinstance(value, bool)
        assert 1 <= value <= settings.CHAT_MAX_NEW_TOKENS
        assert request.sampling.max_tokens == value


def openai_raw_bodies() -> st.SearchStrategy[bytes]:
    limit = django_settings.OPENAI_MAX_BODY_BYTES
    messages = st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system"]), "content": hostile_text}
        ),
        min_size=1,
        max_size=3,
    )
    bodies = st.fixed_dictionaries(
        {"model": st.just("no-such-model"), "messages": messages},
        optional={"max_tokens": token_limits, "max_completion_tokens": token_limits},
    ).map(lambda b: json.dumps(b).encode())
    nested = st.integers(1, 8000).map(
        lambda n: ('{"model": "m", "messages": ' + "[" * n + "]" * n + "}").encode()
    )
    # Around the API's own limit and past Django's (DATA_UPLOAD_MAX_MEMORY_SIZE).
    sizes = st.sampled_from([limit - 64, limit + 1, 3 * 1024 * 1024])
    oversize = sizes.map(lambda n: b'{"model": "m", "prompt": "' + b"a" * n + b'"}')
    return bodies | nested | oversize


@hsettings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=openai_raw_bodies(), path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_any_openai_body_gets_a_json_error_object_never_an_html_page(
    raw: bytes, path: str, make_user: Any, tiny_engine: Any
) -> None:
    _, key = create_key(make_user(f"v1{next(SERIAL)}"), "fuzz")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    answer = client.post(path, data=raw, content_type="application/json")
    # Every body here is refused: bad, too large, or naming a model that is not served.
    assert answer.status_code in (400, 404, 413), (answer.status_code, answer.content[:200])
    assert answer["Content-Type"] == "application/json"
    error = answer.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
