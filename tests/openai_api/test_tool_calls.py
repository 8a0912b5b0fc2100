"""Tool calling over /v1/chat/completions, driven by the official `openai` SDK against a real
server process serving two tiny random-weight models: one whose chat template has the
Hermes tool format (tests/tool_model.py) and one with the bundled ChatML template, which
has none. The random model chooses nothing wisely: with tool_choice "required" or a named
function decoding is constrained, so the calls must parse and fit their schemas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.servers import started, users_code
from tests.tiny_model import build_tiny_llama
from tests.tool_model import build_tiny_tool_llama
from tools.live_server import LiveServer

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, real_model_dir: Path) -> Iterator[LiveServer]:
    tools_model = build_tiny_tool_llama(tmp_path_factory.mktemp("tool-llama"), real_model_dir)
    plain = build_tiny_llama(tmp_path_factory.mktemp("plain-llama"), real_model_dir)
    srv = LiveServer(
        tmp_path_factory.mktemp("tools-server"),
        tools_model,
        CHATAPP_MODELS=f"plain={plain}",
    )
    started(srv, users_code("apiuser"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    key = server.make_key("apiuser")
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(server: LiveServer) -> str:
    return str(Path(server.env["CHATAPP_MODEL"]).name)


def assert_valid_call(call: Any, name: str | None = None) -> dict[str, Any]:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in SCHEMAS and (name is None or call.function.name == name)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def test_required_tool_choice_answers_with_calls_that_fit_their_schemas(
    client: openai.OpenAI, model_id: str
):
    reply = client.chat.completions.create(
        model=model_id, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200,
        temperature=1, seed=7, parallel_tool_calls=False,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    assert_valid_call(choice.message.tool_calls[0])


def test_a_named_function_is_the_one_called(client: openai.OpenAI, model_id: str):
    for seed in range(3):
        reply = client.chat.completions.create(
            model=model_id, messages=ASK, tools=TOOLS, max_tokens=200, seed=seed,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )  # fmt: skip
        (call,) = reply.choices[0].message.tool_calls
        assert_valid_call(call, "get_time")


def test_streamed_calls_add_up_to_the_unstreamed_reply(client: openai.OpenAI, model_id: str):
    kwargs: dict[str, Any] = dict(
        model=model_id, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=300,
        temperature=0, parallel_tool_calls=False,
    )  # fmt: skip
    whole = client.chat.completions.create(**kwargs).choices[0].message
    calls: dict[int, dict[str, Any]] = {}
    finish, argument_pieces = None, 0
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for tc in c.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": tc.id, "name": None, "arguments": ""})
                if tc.function.name:
                    assert entry["name"] is None, "the name comes once, first"
                    entry["name"] = tc.function.name
                if tc.function.arguments:
                    entry["arguments"] += tc.function.arguments
                    argument_pieces += 1
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (t.function.name, t.function.arguments) for t in whole.tool_calls
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert argument_pieces > len(calls), "arguments are streamed bit by bit"


def test_a_tool_result_round_trip_ends_in_an_answer(client: openai.OpenAI, model_id: str):
    first = client.chat.completions.create(
        model=model_id, messages=ASK, tools=TOOLS, max_tokens=200, seed=1,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    call = first.choices[0].message.tool_calls[0]
    history: list[Any] = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear", "c": 21}'},
    ]
    for stream in (False, True):
        kwargs: dict[str, Any] = dict(
            model=model_id, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8
        )
        if stream:
            chunks = list(client.chat.completions.create(**kwargs, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = chunks[-1].choices[0].finish_reason
        else:
            answer = client.chat.completions.create(**kwargs).choices[0]
            text, finish = answer.message.content, answer.finish_reason
            assert answer.message.tool_calls is None
        assert text and finish in ("stop", "length")


def test_the_prompt_is_rendered_by_the_models_template_with_tools(
    client: openai.OpenAI, model_id: str, real_model_dir: Path, tmp_path: Path
):
    from transformers import AutoTokenizer

    model_dir = build_tiny_tool_llama(tmp_path, real_model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    messages: list[Any] = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1",
         "type": "function", "function": {"name": "get_time", "arguments": '{"zone": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]  # fmt: skip
    reply = client.chat.completions.create(
        model=model_id, messages=messages, tools=TOOLS, max_tokens=1, tool_choice="auto"
    )
    for m in messages:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    text = tok.apply_chat_template(
        messages, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert "<tool_response>\n12:00\n</tool_response>" in text and '"get_weather"' in text
    assert reply.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))


def test_a_model_whose_template_has_no_tool_format_is_a_400_naming_it(client: openai.OpenAI):
    for extra in (
        {"tools": TOOLS},
        {"messages": [*ASK, {"role": "tool", "tool_call_id": "c", "content": "x"}]},
    ):
        body: dict[str, Any] = {"model": "plain", "messages": ASK, **extra}
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(**body)
        assert "plain" in err.value.message and "tool" in err.value.message
    # Without tools the same model answers.
    assert client.chat.completions.create(model="plain", messages=ASK, max_tokens=2).choices


def test_a_constrained_tool_choice_refuses_a_response_format_beside_it(
    client: openai.OpenAI, model_id: str
):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model_id, messages=ASK, tools=TOOLS, tool_choice="required",
            response_format={"type": "json_object"},
        )  # fmt: skip
    assert err.value.body["param"] == "tool_choice"  # type: ignore[index]
