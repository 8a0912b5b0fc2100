"""The one check for text a person sends, wherever it arrives (a declared shared module:
the chat, the OpenAI API and the key names all use it)."""

from __future__ import annotations

from typing import Any


class InvalidText(ValueError):
    """User text that cannot be stored or used; `code` is the error code a client sees
    (`invalid`, or `too_long` for text over its limit)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def clean_text(
    value: Any, label: str, max_chars: int, *, allow_empty: bool = True, stored: bool = True
) -> str:
    """The one check for text a person sends (a message, a title, a system prompt, a key
    name, a search): a string, within `max_chars`, and storable on every database the app
    runs on. A lone surrogate cannot be encoded as UTF-8 at all, and PostgreSQL refuses NUL
    in text columns; both are refused here, before anything is written, rather than
    surfacing later as a 500 or a misleading "database unavailable". Text that is never
    `stored` (the OpenAI API's messages) may hold NUL: a model's reply can (a byte token),
    and a client sends it back in the next turn's history."""
    if not isinstance(value, str):
        raise InvalidText("invalid", f"{label} must be a string.")
    if not allow_empty and not value.strip():
        raise InvalidText("invalid", f"{label} is empty.")
    if len(value) > max_chars:
        raise InvalidText("too_long", f"{label} is longer than {max_chars} characters.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidText("invalid", f"{label} contains invalid Unicode.") from exc
    if stored and "\x00" in value:
        raise InvalidText("invalid", f"{label} contains a NUL character.")
    return value


def without_surrogates(value: str) -> str:
    """`value` with each lone surrogate (from a JSON escape; UTF-8 cannot encode one) as
    U+FFFD, for text that is shown or stored as given rather than refused."""
    return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
