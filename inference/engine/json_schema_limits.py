"""The JSON Schema keywords the grammar engine does not enforce, and the check that refuses
a schema using them.

xgrammar turns most of JSON Schema into a grammar (types, properties and `required`,
`enum`/`const`, `anyOf`/`oneOf`, local `$ref`s, numeric bounds and `multipleOf`, string
lengths, patterns and formats, array lengths, `prefixItems`, property counts), and drops
the keywords below without a word: the reply would then be held to a looser schema than
the client sent, and could fail to validate against it. A schema that uses one is refused
up front, naming it, as OpenAI's strict mode refuses what it does not support.
"""

from __future__ import annotations

import re
from typing import Any

from inference.engine.errors import InvalidRequestError

# Keywords the grammar leaves out whatever their value.
UNENFORCED = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "contains",
        "minContains",
        "maxContains",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "unevaluatedItems",
        "$dynamicRef",
        "$recursiveRef",
    }
)

# Where a schema holds subschemas: one, a list of them, or a map of names to them. Values
# of other keywords (`enum`, `const`, `default`, `examples`) are data, never walked.
ONE = ("items", "additionalItems", "additionalProperties", "unevaluatedProperties",
       "propertyNames")  # fmt: skip
MANY = ("prefixItems", "allOf", "anyOf", "oneOf", "items")
NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")

# A lookahead in a pattern is ignored by xgrammar's regex engine (lookbehinds and
# backreferences it already refuses).
LOOKAHEAD = re.compile(r"\(\?[=!]")


def unenforced_keyword(schema: Any, where: str = "#") -> tuple[str, str] | None:
    """(keyword, where it is) of the first part of `schema` the grammar would not enforce,
    or None when it enforces all of it."""
    if not isinstance(schema, dict):
        return None
    for key in schema:
        if key in UNENFORCED:
            return key, where
    if schema.get("uniqueItems") is True:
        return "uniqueItems", where
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        return "allOf with more than one schema", where
    ref = schema.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        return "$ref outside the schema", where
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and LOOKAHEAD.search(pattern):
        return "a lookahead in pattern", where
    return _in_subschemas(schema, where)


def _in_subschemas(schema: dict[str, Any], where: str) -> tuple[str, str] | None:
    for key in ONE:
        found = unenforced_keyword(schema.get(key), f"{where}/{key}")
        if found:
            return found
    for key in MANY:
        parts = schema.get(key)
        for i, part in enumerate(parts if isinstance(parts, list) else []):
            found = unenforced_keyword(part, f"{where}/{key}/{i}")
            if found:
                return found
    for key in NAMED:
        parts = schema.get(key)
        for name, part in (parts if isinstance(parts, dict) else {}).items():
            found = unenforced_keyword(part, f"{where}/{key}/{name}")
            if found:
                return found
    return None


def check_enforceable(schema: Any) -> None:
    """InvalidRequestError naming the first keyword of `schema` the grammar would drop."""
    found = unenforced_keyword(schema)
    if found is not None:
        keyword, where = found
        raise InvalidRequestError(
            f"the JSON schema uses {keyword!r} at {where}, which structured output does not "
            "enforce; leave it out of the schema"
        )
