"""Which schemas structured output refuses because the grammar would drop a keyword."""

from __future__ import annotations

import re
from typing import Any

import pytest

from inference.engine.errors import InvalidRequestError
from inference.engine.json_schema_limits import check_enforceable, unenforced_keyword

INT = {"type": "integer"}


@pytest.mark.parametrize(
    ("schema", "found"),
    [
        ({"type": "array", "items": INT, "uniqueItems": True}, ("uniqueItems", "#")),
        ({"properties": {"a": {"anyOf": [INT, {"not": INT}]}}}, ("not", "#/properties/a/anyOf/1")),
        ({"$defs": {"d": {"if": INT, "then": INT}}}, ("if", "#/$defs/d")),
        ({"allOf": [INT, {"minimum": 1}]}, ("allOf with more than one schema", "#")),
        ({"items": {"$ref": "https://example.com/s.json"}}, ("$ref outside the schema", "#/items")),
        ({"type": "string", "pattern": "^(?!x)a$"}, ("a lookahead in pattern", "#")),
        ({"type": "array", "contains": INT}, ("contains", "#")),
    ],
)
def test_a_keyword_the_grammar_drops_is_named_with_where_it_is(
    schema: dict[str, Any], found: tuple[str, str]
) -> None:
    assert unenforced_keyword(schema) == found
    with pytest.raises(InvalidRequestError, match=re.escape(found[0])):
        check_enforceable(schema)


def test_what_the_grammar_enforces_passes_and_names_of_properties_are_not_keywords() -> None:
    schema = {
        "type": "object",
        "properties": {"not": INT, "if": {"type": "string", "pattern": "^[a-z]+(?:-[a-z]+)?$"}},
        "required": ["not"],
        "$defs": {"p": {"allOf": [{"$ref": "#/$defs/q"}]}, "q": INT},
        "additionalProperties": False,
        "enum": [{"not": 1}],
    }
    assert unenforced_keyword(schema) is None
    assert unenforced_keyword({"type": "array", "uniqueItems": False}) is None
