"""ENGINE_MODE=upstream in front of an engine that is not this app: llama.cpp's
`llama-server` on the bundled GGUF, built once into the cache folder by
scripts/build-llama-server.sh (scripts/test.sh builds it before the tests run).

One llama-server and one front for the session, and a second pair (module) whose
llama-server has a template with a tool format; replies are a few tokens long. Without
the tools to build llama-server (cmake, ninja, a C/C++ compiler) these tests skip and say
so; any other failure to build or start it is a failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def test_logprobs_come_back_from_llama_server_in_openai_shape(
    api: openai.OpenAI, llama_model: str
) -> None:
    ask = dict(
        model=llama_model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
        temperature=0, logprobs=True, top_logprobs=3,
    )  # fmt: skip
    reply = api.chat.completions.create(**ask)  # type: ignore[call-overload]
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 4
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and bytes(t.bytes) == t.token.encode()
        tops = [a.logprob for a in t.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and all(v <= 0 for v in tops)
        # Greedy: the sampled token is the likeliest alternative.
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob
    # Streamed: each token's entry rides on its own delta, the same tokens.
    chunks = list(api.chat.completions.create(**ask, stream=True))  # type: ignore[call-overload]
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]  # fmt: skip
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-3)
    assert all(len(t.top_logprobs) == 3 for t in streamed)
    # No top_logprobs asked for: none given (llama-server needs one asked to send any).
    bare = api.chat.completions.create(**{**ask, "top_logprobs": None})  # type: ignore[call-overload]
    assert bare.choices[0].logprobs.content and all(
        t.top_logprobs == [] for t in bare.choices[0].logprobs.content
    )


def test_completion_logprobs_and_echo_through_the_front(
    api: openai.OpenAI, llama_model: str
) -> None:
    prompt = "The capital of France is"
    reply = api.completions.create(
        model=llama_model, prompt=prompt, max_tokens=3, temperature=0, logprobs=2
    )
    lp = reply.choices[0].logprobs
    assert "".join(lp.tokens) == reply.choices[0].text and len(lp.tokens) == 3
    assert all(v <= 0 for v in lp.token_logprobs)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(3)]
    for token, alternatives in zip(lp.tokens, lp.top_logprobs, strict=True):
        assert len(alternatives) == 2 and token in alternatives
    streamed = api.completions.create(
        model=llama_model, prompt=prompt, max_tokens=3, temperature=0, logprobs=2, stream=True
    )
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.tokens]  # fmt: skip
    assert tokens == lp.tokens
    # echo is the front's own doing: the prompt's text before the reply's.
    echoed = api.completions.create(
        model=llama_model, prompt=prompt, max_tokens=3, temperature=0, echo=True
    )
    assert echoed.choices[0].text == prompt + reply.choices[0].text


def _reply(api: openai.OpenAI, model: str, content: str, **extra: object) -> str:
    """A greedy 16-token reply unless `extra` says otherwise."""
    kwargs: dict[str, object] = {"max_tokens": 16, "temperature": 0, **extra}
    reply = api.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],
        **kwargs,  # type: ignore[call-overload]
    )
    return str(reply.choices[0].message.content)


def test_penalties_and_vllm_s_sampling_extras_reach_llama_server(
    api: openai.OpenAI, llama_model: str
) -> None:
    ask = "Repeat the word cat many times."
    plain = _reply(api, llama_model, ask)
    # Each changes the greedy reply, so each was applied there, not dropped on the way
    # (repetition_penalty goes to llama-server as its repeat_penalty).
    for field in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
        value = 3.0 if field == "repetition_penalty" else 2.0
        changed = _reply(api, llama_model, ask, extra_body={field: value})
        assert changed != plain, field
    # top_k 1 (or a min_p of 1) makes even a hot sampler greedy.
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        hot = _reply(api, llama_model, ask, extra_body=extra, temperature=2.0, seed=7)
        assert hot == plain, extra


def test_n_choices_with_a_seed_are_repeatable_through_the_front(
    api: openai.OpenAI, llama_model: str
) -> None:
    # llama-server takes n=1 only: each choice is a request of its own there, with seed
    # seed + i, so the same seed gives the same choices again.
    def choices() -> list[str]:
        reply = api.chat.completions.create(
            model=llama_model, messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=8, temperature=1.0, seed=11, n=2,
        )  # fmt: skip
        assert [c.index for c in reply.choices] == [0, 1]
        return [str(c.message.content) for c in reply.choices]

    first = choices()
    assert all(first) and choices() == first


def test_logit_bias_bans_and_forces_tokens_in_llama_server(
    api: openai.OpenAI, llama: LlamaServer, llama_model: str
) -> None:
    def token_id(text: str) -> int:
        ids = httpx.post(llama.url + "/tokenize", json={"content": text}, timeout=10).json()
        assert len(ids["tokens"]) == 1, ids
        return int(ids["tokens"][0])

    plain = _reply(api, llama_model, "Hi")
    first = plain.split()[0].rstrip("!,.")
    banned = _reply(api, llama_model, "Hi", logit_bias={str(token_id(first)): -100})
    assert not banned.startswith(first), (plain, banned)
    forced = _reply(api, llama_model, "Hi", logit_bias={str(token_id(" Paris")): 100}, max_tokens=3)
    assert forced.split() == ["Paris"] * 3, forced


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
def test_tools_are_a_clear_400_naming_the_model(
    api: openai.OpenAI, llama: LlamaServer, llama_model: str, stream: bool
) -> None:
    # The bundled model's template has no tool format, and llama-server then drops tools
    # without a word (its /props says so): the front refuses them instead.
    caps = httpx.get(llama.url + "/props", timeout=10).json()["chat_template_caps"]
    assert caps["supports_tools"] is False
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]  # fmt: skip
    for kwargs, param in (
        ({"messages": history[:1], "tools": tools}, "tools"),
        ({"messages": history}, "messages"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            api.chat.completions.create(
                model=llama_model,
                max_tokens=4,
                stream=stream,
                **kwargs,  # type: ignore[arg-type]
            )
        error = caught.value.body
        assert isinstance(error, dict) and error["param"] == param, error
        assert llama_model in error["message"] and "tools" in error["message"], error


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
def test_llama_server_refusing_a_field_is_a_clean_400(
    front: LiveServer, api: openai.OpenAI, llama_model: str, stream: bool
) -> None:
    # A schema the front passes on (its $ref stays inside the document) that llama-server
    # cannot resolve: its 400 reaches the client as ours, not as a 500 or a 503.
    bad = {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model=llama_model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
            stream=stream,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}},
        )  # fmt: skip
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "invalid_request_error", error
    assert "nowhere" in error["message"], error
    assert httpx.get(front.url + "/healthz?engine=1").status_code == 200


# --- tools: llama-server with a template that has a tool format ------------------------

# From llama.cpp's own collection of templates (in the source the build keeps): ChatML,
# the bundled model's own markers, with Hermes' <tool_call> format.
HERMES_TEMPLATE = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"


def _tool(name: str, field: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": f"The {field}",
            "parameters": {"type": "object", "properties": {field: {"type": "string"}},
                           "required": [field]}}}  # fmt: skip


WEATHER = [_tool("get_weather", "city")]


def _examples() -> list[dict[str, Any]]:
    """Three earlier turns that each called the tool: the 135M model follows the pattern."""
    out: list[dict[str, Any]] = []
    for i, city in enumerate(("Paris", "Rome", "Berlin")):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
        }
        out += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny"},
            {"role": "assistant", "content": f"It is sunny in {city}."},
        ]  # fmt: skip
    return [*out, {"role": "user", "content": "What is the weather in Madrid?"}]


@pytest.fixture(scope="module")
def tool_api(
    tmp_path_factory: pytest.TempPathFactory, llama: LlamaServer
) -> Iterator[tuple[openai.OpenAI, str]]:
    binary = Path(llama.args[0])
    server = LlamaServer(
        str(binary), bundled_gguf(), threads=1, slots=1,
        workdir=tmp_path_factory.mktemp("llama-tools"), ctx_per_slot=2048,
    )  # fmt: skip
    template = binary.parents[2] / "src" / "models" / "templates" / HERMES_TEMPLATE
    assert template.is_file(), f"llama.cpp's source next to {binary} has no {HERMES_TEMPLATE}"
    server.args += ["--chat-template-file", str(template)]
    server.start()
    front = LiveServer(
        tmp_path_factory.mktemp("front-llama-tools"),
        "/nonexistent-model-folder",
        ENGINE_MODE="upstream",
        ENGINE_UPSTREAM_URL=server.url + "/v1",
    )
    try:
        front.start()
        front.make_user("apiuser", PASSWORD)
        api = openai.OpenAI(base_url=front.url + "/v1", api_key=front.make_key("apiuser"),
                            max_retries=0)  # fmt: skip
        yield api, api.models.list().data[0].id
    finally:
        front.stop()
        server.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
def test_a_tool_call_round_trip_through_the_front(
    tool_api: tuple[openai.OpenAI, str], stream: bool
) -> None:
    api, model = tool_api
    ask = _examples()
    if stream:
        chunks = list(api.chat.completions.create(
            model=model, messages=ask, tools=WEATHER, max_tokens=40, temperature=0, stream=True,
        ))  # type: ignore[call-overload]  # fmt: skip
        entries = [e for c in chunks if c.choices for e in c.choices[0].delta.tool_calls or ()]
        # As OpenAI streams them: the id and name first, then the arguments piece by piece.
        assert entries[0].id and entries[0].function.name == "get_weather", entries
        assert len(entries) > 2 and all(e.index == 0 and e.id is None for e in entries[1:])
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == "tool_calls" and not any(finishes[:-1])
        call_id = entries[0].id
        arguments = "".join(e.function.arguments or "" for e in entries)
    else:
        reply = api.chat.completions.create(
            model=model, messages=ask, tools=WEATHER, max_tokens=40, temperature=0,  # type: ignore[arg-type]
        )  # fmt: skip
        assert reply.choices[0].finish_reason == "tool_calls"
        call = reply.choices[0].message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather"
        call_id, arguments = call.id, call.function.arguments
    assert json.loads(arguments) == {"city": "Madrid"}
    # The tool's result goes back: the model answers from it.
    ask += [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function",
         "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "rainy"},
    ]  # fmt: skip
    final = api.chat.completions.create(
        model=model, messages=ask, tools=WEATHER, max_tokens=20, temperature=0,  # type: ignore[arg-type]
    )  # fmt: skip
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls
    assert "rainy" in (final.choices[0].message.content or ""), final


def test_a_named_tool_choice_calls_that_tool(tool_api: tuple[openai.OpenAI, str]) -> None:
    # llama-server reads a named tool_choice as "auto": the front sends it "required"
    # with the named tool alone, so the call is the named one, not the one the turns show.
    api, model = tool_api
    reply = api.chat.completions.create(
        model=model, messages=_examples(), tools=[*WEATHER, _tool("get_time", "zone")],  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False, max_tokens=40, temperature=0,
    )  # fmt: skip
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and calls and len(calls) == 1
    assert calls[0].function.name == "get_time", calls
    assert set(json.loads(calls[0].function.arguments)) == {"zone"}
