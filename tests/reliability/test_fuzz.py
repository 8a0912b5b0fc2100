"""Property-based fuzzing of every parser that reads what a client sends: the chat
WebSocket frames, the JSON API bodies and the OpenAI request bodies. Whatever arrives,
the answer is a clear error (or a valid result), the process keeps serving and stored
data is unchanged."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from chatapp.conversations import create_conversation
from chatapp.models import Conversation, Message
from chatapp.openai_api import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    ApiError,
    ApiRequest,
    parse_chat,
    parse_completion,
)
from tests.chat.conftest import open_socket

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

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
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
# JSON escapes a lone surrogate; a raw one cannot even be sent as text.
frames = frames.filter(bool) | st.just(
    '{"type": "send", "conversation_id": null, "text": "\\udc80x"}'
)


def is_valid_send(raw: str) -> bool:
    try:
        frame = json.loads(raw)
    except ValueError:
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
