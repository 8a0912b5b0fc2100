"""Structured output through the official SDK's `parse`: twenty pydantic models, each sent
as OpenAI's strict json_schema, and the reply must come back parsed into the model. The
tiny random-weight model writes whatever the grammar lets it, so each reply tests the
constraint, not the model. A schema asking for what the grammar does not enforce is a 400
naming the keyword."""

from __future__ import annotations

import datetime
import uuid
from enum import IntEnum, StrEnum
from typing import Annotated, Any, Literal

import jsonschema
import openai
import pytest
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field

from tools.live_server import LiveServer

Short = Annotated[str, Field(max_length=12)]


class Colour(StrEnum):
    red = "red"
    green = "green"
    blue = "blue"


class Priority(IntEnum):
    low = 1
    high = 3


class Flat(BaseModel):
    count: int = Field(ge=0, le=100)
    ok: bool


class Point(BaseModel):
    x: int = Field(ge=-5, le=5)
    y: int = Field(ge=-5, le=5)


class Line(BaseModel):
    start: Point
    end: Point


class Tags(BaseModel):
    tags: list[Short] = Field(min_length=1, max_length=3)


class Painted(BaseModel):
    colour: Colour
    priority: Priority


class Mode(BaseModel):
    mode: Literal["fast", "slow"]
    version: Literal[2]


class Note(BaseModel):
    title: Short
    body: Annotated[str, Field(max_length=8)] | None


class Measure(BaseModel):
    celsius: float = Field(ge=-40.5, le=60.25)
    ratio: float = Field(gt=0, lt=1)


class Stock(BaseModel):
    boxes: int = Field(multiple_of=5, ge=0, le=50)


class Code(BaseModel):
    code: str = Field(pattern=r"^[A-Z]{2}-[0-9]{3}$")


class Word(BaseModel):
    word: str = Field(min_length=3, max_length=5)


class Item(BaseModel):
    name: Short
    qty: int = Field(ge=1, le=9)


class Order(BaseModel):
    items: list[Item] = Field(min_length=1, max_length=2)


class Counts(BaseModel):
    counts: dict[Annotated[str, Field(max_length=4)], Annotated[int, Field(ge=0, le=9)]] = Field(
        max_length=2
    )


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):
    pet: Cat | Dog


class Pair(BaseModel):
    pair: tuple[Annotated[int, Field(ge=0, le=9)], bool]


class Dated(BaseModel):
    day: datetime.date
    id: uuid.UUID


class Maybe(BaseModel):
    where: Point | None


class Leaf(BaseModel):
    value: bool


class Branch(BaseModel):
    leaves: list[Leaf] = Field(max_length=2)


class Tree(BaseModel):
    left: Branch
    right: Branch


class Palette(BaseModel):
    colours: list[Colour] = Field(min_length=2, max_length=4)
    default: Colour


class Described(BaseModel):
    """A person, with documented fields: titles and descriptions shape nothing."""

    name: Short = Field(description="their name", title="Name")
    age: int = Field(ge=0, le=120, description="in years")


class Survey(BaseModel):
    answer: Literal["yes", "no"] | None
    score: int | None = Field(ge=1, le=5)
    comment: Annotated[str, Field(max_length=6)] | None


SCHEMAS: list[type[BaseModel]] = [
    Flat, Line, Tags, Painted, Mode, Note, Measure, Stock, Code, Word,
    Order, Counts, Pet, Pair, Dated, Maybe, Tree, Palette, Described, Survey,
]  # fmt: skip


@pytest.fixture
def client(server: LiveServer, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=60)


def test_twenty_kinds_of_schema() -> None:
    assert len(set(SCHEMAS)) == 20


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
def test_the_reply_parses_into_the_pydantic_model(
    client: openai.OpenAI, model_id: str, schema: type[BaseModel]
) -> None:
    reply = client.beta.chat.completions.parse(
        model=model_id, messages=[{"role": "user", "content": "Fill it in"}],
        response_format=schema, max_tokens=200, temperature=1.0, seed=7,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, schema)
    # The JSON schema sent, not only pydantic's reading of the reply (which coerces).
    jsonschema.validate(
        choice.message.parsed.model_dump(mode="json"),
        to_strict_json_schema(schema),
        format_checker=jsonschema.FormatChecker(),
    )


class Unique(BaseModel):
    names: set[Short]


def test_a_keyword_the_grammar_does_not_enforce_is_a_400_naming_it(
    client: openai.OpenAI, model_id: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.beta.chat.completions.parse(
            model=model_id, messages=[{"role": "user", "content": "Hi"}], response_format=Unique
        )
    body = err.value.body
    assert isinstance(body, dict)
    assert body["param"] == "response_format"
    assert "'uniqueItems' at #/properties/names" in body["message"]
    not_zero = {"type": "object", "properties": {"n": {"type": "integer", "not": {"const": 0}}}}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "n", "schema": not_zero}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Hi"}], response_format=fmt
        )
    assert "'not' at #/properties/n" in str(err.value)
