"""The chat socket's frame schemas (chatapp/chat/protocol.py): each malformed frame gets
the error frame's code and words the protocol documents (docs/websocket.md), from the one
declaration of its type."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from chatapp.chat.protocol import EditFrame, SendFrame, frame_error, parse_frame


@pytest.mark.parametrize(
    ("content", "code", "words", "echo"),
    [
        ([1, 2], "bad_frame", "A frame must be a JSON object.", False),
        ({"no_type": 1}, "bad_frame", "Unknown frame type: 'None'.", False),
        ({"type": "SEND"}, "bad_frame", "Unknown frame type: 'SEND'.", False),
        ({"type": "send", "text": 42}, "bad_frame", "'text' must be a string", True),
        ({"type": "send", "text": "hi", "conversation_id": "7"}, "bad_frame",
         "'conversation_id' must be an integer", True),
        ({"type": "stop"}, "bad_frame", "'message_id' must be an integer", True),
        ({"type": "resume", "message_id": True}, "bad_frame",
         "'message_id' must be an integer", True),
        ({"type": "ping", "client_id": "x" * 65}, "bad_frame",
         "'client_id' must be a string of at most 64 chars.", False),
        ({"type": "send", "text": "   "}, "invalid", "The message is empty.", True),
        ({"type": "send", "text": "a\x00b"}, "invalid",
         "The message contains a NUL character.", True),
        ({"type": "send", "text": "hi", "attachments": [1, 1]}, "bad_frame",
         "an attachment is listed twice", True),
        ({"type": "send", "text": "hi", "settings": {"top_p": 0}}, "invalid",
         "Top-p must be more than 0 and at most 1.", True),
        ({"type": "send", "text": "hi", "settings": {"system_prompt": "\ud800"}}, "invalid",
         "The system prompt contains invalid Unicode.", True),
        ({"type": "regenerate", "message_id": 1, "model": ""}, "invalid",
         "The model must be a model's name of at most 200 characters.", True),
        ({"type": "send", "text": "hi", "temporary": "yes"}, "bad_frame",
         "'temporary' must be true or false", True),
        # Names quoted from the frame: a lone surrogate in one failed pydantic's own
        # rendering of the error (the socket closed with no answer); long ones are cut.
        ({"type": "send", "text": "hi", "settings": {"\udbff\x1b0": None}}, "invalid",
         "Unknown setting: \ufffd\x1b0.", True),
        ({"type": "send", "text": "hi", "settings": {"k" * 99: 1, **dict.fromkeys("abcdef")}},
         "invalid", "Unknown settings: a, b, c, d, e and 2 more.", True),
    ],
)  # fmt: skip
def test_a_malformed_frame_is_refused_in_words(
    content: Any, code: str, words: str, echo: bool
) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_frame(content)
    assert frame_error(refused.value, content) == (code, words, echo)


def test_a_well_formed_frame_parses_to_its_type() -> None:
    send = parse_frame(
        {"type": "send", "text": "", "attachments": [3], "settings": {"max_tokens": 5},
         "client_id": "c1", "unknown_field": True}
    )  # fmt: skip
    assert isinstance(send, SendFrame) and send.conversation_id is None
    assert send.settings is not None and send.settings.given() == {"max_tokens": 5}
    # Whether an edit named its attachments at all decides whether it keeps the old ones.
    edit = parse_frame({"type": "edit", "message_id": 4, "text": "x"})
    assert isinstance(edit, EditFrame) and "attachments" not in edit.model_fields_set
