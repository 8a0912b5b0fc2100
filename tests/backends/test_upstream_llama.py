"""ENGINE_MODE=upstream in front of an engine that is not this app: llama.cpp's
`llama-server` on the bundled GGUF, built once into the cache folder by
scripts/build-llama-server.sh (scripts/test.sh builds it before the tests run).

One llama-server and one front for the session; replies are a few tokens long. Without
the tools to build llama-server (cmake, ninja, a C/C++ compiler) these tests skip and say
so; any other failure to build or start it is a failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from inference.bench.llama_server import (
    LlamaServer,
    binary_path,
    llama_server_binary,
    missing_build_tools,
)
from inference.model_files import bundled_gguf
from tests.servers import PASSWORD, chat_through_the_socket
from tools.live_server import LiveServer

# A cold build takes minutes on a small machine: only then may the first test's setup
# (which builds) take longer than the suite's usual limit.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300 if binary_path().exists() else 3600),
]

CTX = 1024  # llama-server's context (one slot): small, so an oversized prompt is cheap


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    if not binary_path().exists() and (missing := missing_build_tools()):
        pytest.skip(f"llama-server is not built and cannot be: no {', '.join(missing)} here")
    server = LlamaServer(
        llama_server_binary(),
        bundled_gguf(),
        threads=1,
        slots=1,
        workdir=tmp_path_factory.mktemp("llama-server"),
        ctx_per_slot=CTX,
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def llama_model(llama: LlamaServer) -> str:
    return str(httpx.get(llama.url + "/v1/models", timeout=10).json()["data"][0]["id"])


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, llama: LlamaServer) -> Iterator[LiveServer]:
    srv = LiveServer(
        tmp_path_factory.mktemp("front-llama"),
        "/nonexistent-model-folder",  # the front never loads a model of its own
        ENGINE_MODE="upstream",
        ENGINE_UPSTREAM_URL=llama.url + "/v1",
    ).start()
    srv.make_user("apiuser", PASSWORD)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api(front: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=front.url + "/v1", api_key=front.make_key("apiuser"), max_retries=0
    )


def test_the_front_lists_the_model_llama_server_serves(
    api: openai.OpenAI, llama_model: str
) -> None:
    assert [m.id for m in api.models.list().data] == [llama_model]


def test_a_chat_completion_through_the_front(api: openai.OpenAI, llama_model: str) -> None:
    reply = api.chat.completions.create(
        model=llama_model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8,
        temperature=0,
    )
    assert reply.object == "chat.completion" and reply.model == llama_model
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    # The counts are llama-server's own (it tokenized the templated prompt).
    assert reply.usage.prompt_tokens > 5
    assert 1 <= reply.usage.completion_tokens <= 8


def test_a_streamed_chat_completion_through_the_front(api: openai.OpenAI, llama_model: str) -> None:
    stream = api.chat.completions.create(
        model=llama_model,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert sum(1 for t in texts if t) >= 2, chunks  # streamed in pieces, not all at once
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and not any(finishes[:-1])
    assert chunks[-1].usage is not None and 1 <= chunks[-1].usage.completion_tokens <= 8


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
def test_llama_server_refusing_an_oversized_prompt_is_a_clean_400(
    front: LiveServer, api: openai.OpenAI, llama_model: str, stream: bool
) -> None:
    # Over llama-server's context; the front has no window of its own to check it against.
    words = "word " * (CTX * 2)
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model=llama_model,
            messages=[{"role": "user", "content": words}],
            max_tokens=4,
            stream=stream,
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "invalid_request_error", error
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages", error
    assert "context" in error["message"], error
    # Nothing stuck: the next request is served.
    assert httpx.get(front.url + "/healthz?engine=1").status_code == 200
    reply = api.chat.completions.create(
        model=llama_model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert reply.usage.completion_tokens >= 1


def test_text_completions_pass_and_token_id_prompts_are_refused_by_the_front(
    api: openai.OpenAI, llama_model: str
) -> None:
    reply = api.completions.create(
        model=llama_model, prompt="The capital of France is", max_tokens=4, temperature=0
    )
    assert reply.choices[0].text and 1 <= reply.usage.completion_tokens <= 4
    # Token ids mean nothing to another server's tokenizer: refused here, before it.
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model=llama_model, prompt=[1, 2, 3], max_tokens=4)
    assert caught.value.body["param"] == "prompt", caught.value.body


def test_the_chat_ui_socket_streams_through_llama_server(front: LiveServer) -> None:
    done = chat_through_the_socket(front, max_tokens=8)
    # Measured at the app side; the token count is llama-server's usage figure.
    assert done["figures"]["ttft_ms"] > 0 and 1 <= done["figures"]["output_tokens"] <= 8


class Fruit(BaseModel):
    name: str = Field(max_length=16)
    ripe: bool


def test_a_json_schema_or_object_goes_to_llama_server_and_other_grammars_are_refused(
    api: openai.OpenAI, llama_model: str
) -> None:
    ask = [{"role": "user", "content": "Name one fruit, as JSON."}]
    parsed = api.beta.chat.completions.parse(
        model=llama_model, messages=ask, response_format=Fruit, max_tokens=60, temperature=0
    )
    assert isinstance(parsed.choices[0].message.parsed, Fruit)
    reply = api.chat.completions.create(
        model=llama_model, messages=ask, response_format={"type": "json_object"},
        max_tokens=60, temperature=0,
    )  # fmt: skip
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
    # llama-server has no regex field: refused by name here, not ignored there.
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model=llama_model, messages=ask, max_tokens=4, extra_body={"guided_regex": "a+"}
        )
    assert caught.value.body["param"] == "response_format", caught.value.body
