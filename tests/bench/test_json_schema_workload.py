"""vs_llama's json-schema workload: the request it sends with the schema (one our API takes
and our grammar enforces whole), and how it counts replies that parse and validate."""

from __future__ import annotations

import json

import jsonschema

from chatapp.openai_api.protocol import ResponseFormat
from inference.bench.api_clients import (
    JSON_SCHEMA,
    RESPONSE_FORMAT,
    SCHEMA,
    schema_check,
    workload_conversations,
)
from inference.bench.vs_llama import WITH_SCHEMA, request_modes, summarise
from inference.engine.json_schema_limits import unenforced_keyword

RECORD = {
    "title": "The Quiet Harbour",
    "kind": "book",
    "year": 1987,
    "rating": 8,
    "tags": ["sea", "mystery"],
    "creator": {"name": "Ana Lima", "country": "Portugal"},
}


def test_the_schema_run_sends_a_strict_json_schema_our_grammar_enforces_whole() -> None:
    modes = request_modes(JSON_SCHEMA)
    assert modes == {"": {}, WITH_SCHEMA: {"response_format": RESPONSE_FORMAT}}
    assert request_modes("chat") == {"": {}}
    fmt = ResponseFormat.model_validate(RESPONSE_FORMAT)
    assert fmt.type == "json_schema" and fmt.json_schema is not None
    assert fmt.json_schema.strict is True and fmt.json_schema.schema_ == SCHEMA
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    # Nothing in it that the grammar would drop: a reply under it must validate.
    assert unenforced_keyword(SCHEMA) is None
    # Every turn of every conversation asks for the record, with and without the schema.
    for conv in workload_conversations(JSON_SCHEMA, 16, 3):
        assert conv.kind == JSON_SCHEMA and len(conv.turns) == 3
        assert all("JSON object" in turn for turn in conv.turns)


def test_a_reply_counts_as_parsed_and_as_valid_only_when_it_is() -> None:
    assert schema_check(json.dumps(RECORD)) == (True, True)
    assert schema_check(f"\n{json.dumps(RECORD, indent=2)}\n") == (True, True)
    for bad in (
        {**RECORD, "year": 1850},  # out of bounds
        {**RECORD, "kind": "poem"},  # not in the enum
        {**RECORD, "tags": []},  # too few items
        {**RECORD, "creator": {"name": "Ana Lima"}},  # the nested object incomplete
        {**RECORD, "extra": 1},  # additionalProperties false
        {k: v for k, v in RECORD.items() if k != "rating"},  # a required key missing
    ):
        assert schema_check(json.dumps(bad)) == (True, False), bad
    assert schema_check(f"```json\n{json.dumps(RECORD)}\n```") == (False, False)
    assert schema_check(json.dumps(RECORD)[:-1]) == (False, False)  # cut short at the cap


def test_the_counts_add_up_over_a_systems_runs() -> None:
    runs = [
        {"asked": 48, "parsed": 47, "valid": 45, "tok_s": 100.0},
        {"asked": 48, "parsed": 48, "valid": 48, "tok_s": 120.0},
    ]
    out = summarise(runs)
    assert (out["asked"], out["parsed"], out["valid"]) == (96, 95, 93)
    assert out["tok_s"]["median"] == 110.0
    assert "valid" not in summarise([{"tok_s": 1.0}])
