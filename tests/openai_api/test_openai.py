"""The OpenAI-compatible API, driven by the official `openai` package against a real
server process (daphne) running the engine on a tiny random-weight llama."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest
from django_ratelimit.core import _get_window

from tests.servers import engine_stats
from tools.live_server import LiveServer


@pytest.fixture
def client(server: LiveServer, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=60)


def test_models_lists_the_served_model(client: openai.OpenAI, model_id: str) -> None:
    assert [m.id for m in client.models.list().data] == [model_id]


def test_chat_completion_with_usage(client: openai.OpenAI, model_id: str) -> None:
    reply = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0
    )
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in {"length", "stop"}
    assert reply.usage.completion_tokens <= 5 and reply.usage.prompt_tokens > 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens >= 0


def test_max_completion_tokens_and_seed_make_a_repeatable_sample(
    client: openai.OpenAI, model_id: str
) -> None:
    kwargs: dict[str, Any] = dict(
        model=model_id,
        messages=[{"role": "user", "content": "Seeded"}],
        max_completion_tokens=8,
        temperature=1.0,
        seed=1234,
    )
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    assert client.chat.completions.create(**kwargs).choices[0].message.content == first


def test_ignore_eos_asks_for_max_tokens_and_must_be_a_boolean(
    client: openai.OpenAI, model_id: str
) -> None:
    from chatapp.openai_api.views import parse_chat

    body = {"model": model_id, "messages": [{"role": "user", "content": "Hi"}]}
    assert parse_chat({**body, "ignore_eos": True}).sampling.ignore_eos is True
    assert parse_chat(body).sampling.ignore_eos is False
    for seed in range(4):
        reply = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": f"Go {seed}"}],
            max_tokens=9, temperature=1.5, seed=seed, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert reply.usage.completion_tokens == 9 and reply.choices[0].finish_reason == "length"
    for bad in ("yes", 1, None):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                extra_body={"ignore_eos": bad},
            )  # fmt: skip
        assert err.value.body["param"] == "ignore_eos"  # type: ignore[index]


def test_streaming_chat_with_usage_chunk(client: openai.OpenAI, model_id: str) -> None:
    stream = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Stream please"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == ["length"] or finals == ["stop"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and 1 <= usage.completion_tokens <= 12
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2
    full = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Stream please"}],
        max_tokens=12,
        temperature=0,
    )
    assert full.choices[0].message.content == text


def test_completions_with_text_and_token_ids(client: openai.OpenAI, model_id: str) -> None:
    by_text = client.completions.create(
        model=model_id, prompt="Once upon a time", max_tokens=4, temperature=0
    )
    assert by_text.object == "text_completion" and by_text.usage.completion_tokens <= 4
    by_ids = client.completions.create(
        model=model_id, prompt=[1, 2, 3, 4, 5], max_tokens=3, temperature=0
    )
    assert by_ids.usage.prompt_tokens == 5
    streamed = list(
        client.completions.create(model=model_id, prompt="Hello", max_tokens=3, stream=True)
    )
    assert streamed[-1].choices[0].finish_reason in {"length", "stop"}


def test_a_growing_history_reuses_the_cached_prefix(client: openai.OpenAI, model_id: str) -> None:
    history = [
        {"role": "system", "content": "You answer in one word. " * 6},
        {"role": "user", "content": "Name a fruit."},
    ]
    first = client.chat.completions.create(
        model=model_id, messages=history, max_tokens=10, temperature=0
    )
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Another one."},
    ]
    second = client.chat.completions.create(
        model=model_id, messages=history, max_tokens=5, temperature=0
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    # Everything up to the last full KV block of turn one is reused.
    assert cached >= first.usage.prompt_tokens - 16, (cached, first.usage.prompt_tokens)


@pytest.mark.parametrize(
    "kwargs, status, param",
    [
        ({"n": 0}, 400, "n"),
        ({"temperature": 3}, 400, "temperature"),
        ({"top_p": 0}, 400, "top_p"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"max_tokens": 10**7}, 400, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"extra_body": {"frobnicate": True}}, 400, "frobnicate"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
        ({"model": "no-such-model"}, 404, "model"),
    ],
)
def test_invalid_requests_get_openai_style_errors(
    client: openai.OpenAI, model_id: str, kwargs: dict, status: int, param: str
) -> None:
    args: dict[str, Any] = {
        "model": model_id,
        "messages": [{"role": "user", "content": "x"}],
        **kwargs,
    }
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(**args)
    assert caught.value.status_code == status
    error = caught.value.body
    assert error["param"] == param and error["message"] and error["type"]


def test_prompt_over_the_context_window_is_a_clear_400(
    client: openai.OpenAI, model_id: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "word " * 5000}], max_tokens=4
        )
    assert caught.value.body["code"] == "context_length_exceeded"


def test_bad_keys_are_401(server: LiveServer, model_id: str) -> None:
    for key in ("sk-chat-not-a-real-key", "garbage"):
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    assert httpx.get(server.url + "/v1/models").status_code == 401


def test_revoked_key_stops_working(server: LiveServer, model_id: str) -> None:
    key = server.make_key("apiuser")
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
    api.models.list()
    server.python(
        "from chatapp.openai_api.models import ApiKey; from django.utils import timezone; "
        f"ApiKey.objects.filter(prefix={key[:14]!r}).update(revoked_at=timezone.now())"
    )
    with pytest.raises(openai.AuthenticationError):
        api.models.list()


def test_malformed_and_oversized_bodies(server: LiveServer, api_key: str) -> None:
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    bad = httpx.post(server.url + "/v1/chat/completions", content=b"{not json", headers=headers)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    surrogate = b'{"model": "x", "messages": [{"role": "user", "content": "\\ud800"}]}'
    assert httpx.post(
        server.url + "/v1/chat/completions", content=surrogate, headers=headers
    ).status_code in (400, 404)
    huge = json.dumps({"model": "x", "prompt": "a" * (2 * 1024 * 1024)})
    too_big = httpx.post(server.url + "/v1/completions", content=huge, headers=headers)
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "request_too_large"


def test_a_reply_holding_nul_can_be_sent_back_as_history(
    server: LiveServer, api_key: str, model_id: str
) -> None:
    """A model's reply may hold NUL (a byte token); a client sends its replies back as the
    next turn's history, and the API (which stores no message text) takes them."""
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0)
    messages: list[Any] = [
        {"role": "user", "content": "Say a\x00b."},
        {"role": "assistant", "content": "a\x00b"},
        {"role": "user", "content": "Again."},
    ]
    reply = api.chat.completions.create(model=model_id, messages=messages, max_tokens=2)
    assert reply.choices[0].finish_reason in ("length", "stop")
    done = api.completions.create(model=model_id, prompt="a\x00b", max_tokens=1)
    assert done.choices[0].finish_reason in ("length", "stop")


def test_rate_limit_per_key_answers_429_with_retry_after(server: LiveServer, model_id: str) -> None:
    key = server.make_key("apiuser", rate_limit_per_minute=3)
    pk = server.python(
        "from chatapp.openai_api.models import ApiKey; print(ApiKey.objects.latest('pk').pk)"
    )
    # The four requests must fall in one of the key's counting windows, whose edge is at a
    # second of the minute of its own (django-ratelimit): past the edge the count starts
    # again. Wait past an edge that is about to come (the window counts its last second).
    edge = _get_window(pk, 60) + 1
    if edge - time.time() < 3:
        time.sleep(max(0.0, edge - time.time()) + 0.5)
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": model_id, "prompt": "x", "max_tokens": 1}
    codes = [
        httpx.post(server.url + "/v1/completions", json=body, headers=headers) for _ in range(4)
    ]
    assert [r.status_code for r in codes] == [200, 200, 200, 429]
    assert int(codes[-1].headers["Retry-After"]) >= 1
    assert codes[-1].json()["error"]["code"] == "rate_limit_exceeded"


def test_concurrency_cap_per_key(server: LiveServer, model_id: str) -> None:
    key = server.make_key("apiuser", max_concurrent=1)
    headers = {"Authorization": f"Bearer {key}"}
    # Greedy on this prompt runs to max_tokens (a sampled reply could end at once).
    body = {"model": model_id, "prompt": "go", "max_tokens": 1500, "stream": True, "temperature": 0}
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body, headers=headers, timeout=60
    ) as first:
        assert first.status_code == 200
        lines = first.iter_lines()  # keep it: a dropped iterator closes the connection
        next(lines)
        second = httpx.post(
            server.url + "/v1/completions", json={**body, "stream": False}, headers=headers
        )
        assert second.status_code == 429


def test_client_disconnect_aborts_the_request_in_the_engine(
    server: LiveServer, api_key: str, model_id: str
) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    body = {"model": model_id, "prompt": "go", "max_tokens": 1900, "stream": True, "temperature": 0}
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body, headers=headers, timeout=60
    ) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert engine_stats(server)["running"] == 1
    deadline = time.monotonic() + 5
    while engine_stats(server)["running"] != 0:
        assert time.monotonic() < deadline, "the engine still runs the abandoned request"
        time.sleep(0.05)
