"""logprobs, n, penalties, logit_bias and structured outputs over the /v1 API, driven by
the official `openai` SDK against a real server process on the tiny random-weight model.
The model chooses nothing wisely: these check the protocol and the constraints."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tools.live_server import LiveServer


@pytest.fixture
def client(server: LiveServer, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=120)


HI = [{"role": "user", "content": "Hi"}]


def test_chat_logprobs_cover_each_token_streamed_or_not(client: openai.OpenAI, model_id: str):
    kwargs: dict[str, Any] = dict(
        model=model_id, messages=HI, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    reply = client.chat.completions.create(**kwargs)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 3 for t in content)
    # Greedy: each sampled token is its step's most likely one.
    assert all(t.top_logprobs[0].token == t.token for t in content)
    streamed = [
        lp
        for chunk in client.chat.completions.create(**kwargs, stream=True)
        for c in chunk.choices
        if c.logprobs is not None
        for lp in c.logprobs.content or []
    ]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [
        (t.token, round(t.logprob, 4)) for t in content
    ]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_id, messages=HI, top_logprobs=21, logprobs=True)


def test_completion_logprobs_list_tokens_with_offsets(client: openai.OpenAI, model_id: str):
    reply = client.completions.create(
        model=model_id, prompt="Once upon a", max_tokens=5, temperature=0, logprobs=2
    )
    lp = reply.choices[0].logprobs
    assert "".join(lp.tokens) == reply.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == 5
    assert lp.text_offset[0] == 0 and all(len(t) == 2 for t in lp.top_logprobs)


def test_n_choices_with_a_seed_repeat_and_count_the_prompt_once(
    client: openai.OpenAI, model_id: str
):
    kwargs: dict[str, Any] = dict(
        model=model_id, messages=HI, max_tokens=8, temperature=1.0, seed=42, n=3
    )
    first = client.chat.completions.create(**kwargs)
    again = client.chat.completions.create(**kwargs)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) > 1  # seeds 42, 43, 44: different draws
    single = client.chat.completions.create(**{**kwargs, "n": 1})
    assert first.usage.prompt_tokens == single.usage.prompt_tokens
    assert single.usage.completion_tokens <= first.usage.completion_tokens <= 3 * 8
    stream = client.chat.completions.create(**kwargs, stream=True)
    streamed = ["", "", ""]
    for chunk in stream:
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert streamed == texts


def test_logit_bias_and_penalties_are_applied(client: openai.OpenAI, model_id: str):
    reply = client.completions.create(
        model=model_id, prompt="x", max_tokens=6, temperature=0, logit_bias={"42": 100},
        logprobs=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert reply.choices[0].logprobs.tokens == [reply.choices[0].logprobs.tokens[0]] * 6
    worn = client.completions.create(
        model=model_id, prompt="x", max_tokens=30, temperature=0, logit_bias={"42": 30},
        frequency_penalty=2.0, logprobs=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert len(set(worn.choices[0].logprobs.tokens)) > 1
    for bad in ({"frequency_penalty": 3}, {"presence_penalty": "x"}, {"logit_bias": {"a": 1}}):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=model_id, messages=HI, **bad)
        assert err.value.body["param"] == next(iter(bad))  # type: ignore[index]


class Colour(StrEnum):
    red = "red"
    green = "green"


class Point(BaseModel):
    x: int = Field(ge=-5, le=5)
    y: float


class Shape(BaseModel):
    name: str = Field(max_length=10)
    colour: Colour
    points: list[Point] = Field(max_length=3)
    closed: bool
    note: str | None = Field(default=None, max_length=8)


class Flat(BaseModel):
    count: int = Field(ge=0, le=100)
    ok: bool


@pytest.mark.parametrize("schema", [Shape, Flat], ids=["nested", "flat"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_structured_output_parses_into_the_pydantic_model(
    client: openai.OpenAI, model_id: str, schema: type[BaseModel], temperature: float
):
    reply = client.beta.chat.completions.parse(
        model=model_id, messages=[{"role": "user", "content": "Describe it"}],
        response_format=schema, max_tokens=400, temperature=temperature, seed=3,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, schema)


def test_json_object_mode_and_vllm_extras(client: openai.OpenAI, model_id: str):
    schema = {"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"],
              "additionalProperties": False}  # fmt: skip
    reply = client.chat.completions.create(
        model=model_id, messages=HI, max_tokens=50, temperature=0,
        extra_body={"guided_json": schema},
    )  # fmt: skip
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    choice = client.chat.completions.create(
        model=model_id, messages=HI, max_tokens=10,
        extra_body={"structured_outputs": {"choice": ["left", "right"]}},
    )  # fmt: skip
    assert choice.choices[0].message.content in ("left", "right")
    regex = client.completions.create(
        model=model_id,
        prompt="Code:",
        max_tokens=10,
        extra_body={"guided_regex": "[A-Z]{3}-[0-9]{2}"},
    )
    assert len(regex.choices[0].text) == 6 and regex.choices[0].text[3] == "-"
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=model_id,
            messages=HI,
            max_tokens=60,
            stream=True,
            response_format={"type": "json_object"},
        )
        if c.choices
    )
    assert streamed.startswith("{")


def test_a_schema_or_grammar_that_does_not_compile_is_a_400(client: openai.OpenAI, model_id: str):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=model_id, messages=HI, extra_body={"grammar": "root ::= nowhere"}
        )
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model_id, messages=HI, response_format={"type": "json_object"},
            extra_body={"guided_regex": "a+"},
        )  # fmt: skip
    assert err.value.body["param"] == "guided_regex"  # type: ignore[index]


def test_echo_puts_the_prompt_before_the_completion(client: openai.OpenAI, model_id: str):
    kwargs: dict[str, Any] = dict(
        model=model_id, prompt="Once upon a", max_tokens=4, temperature=0, echo=True
    )
    plain = client.completions.create(**{**kwargs, "echo": False}).choices[0].text
    assert client.completions.create(**kwargs).choices[0].text == "Once upon a" + plain
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True))
    assert streamed == "Once upon a" + plain
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**kwargs, logprobs=1)
    assert err.value.body["param"] == "echo"  # type: ignore[index]
