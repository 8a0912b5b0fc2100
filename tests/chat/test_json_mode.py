"""JSON mode, a conversation's setting: its replies are held to a JSON object while decoding
(the grammar of the API's `response_format: json_object`), and the setting is saved with
the conversation (docs/websocket.md, "Settings"). That such a reply parses, which the
tiny random model here never finishes, is tests/chat/test_real_model.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chatapp.chat.models import Conversation, Message
from inference.engine.structured import GrammarState, StructuredOutputs
from tests.sockets import ChatSocket

pytestmark = pytest.mark.django_db(transaction=True)

JSON_MODE = {"json_mode": True, "max_tokens": 200, "temperature": 0}


async def turn(sock: ChatSocket, conversation_id: int | None, **extra: Any) -> list[dict]:
    await sock.send(
        {"type": "send", "conversation_id": conversation_id, "text": "List two fruits.", **extra}
    )
    return await sock.recv_until("done")


async def test_json_mode_holds_each_reply_to_an_object_and_is_saved_with_the_chat(
    alice_socket: ChatSocket,
) -> None:
    frames = await turn(alice_socket, None, settings=JSON_MODE)
    conv_id = frames[0]["conversation"]["id"]
    assert frames[0]["conversation"]["settings"]["json_mode"] is True
    # The tiny random model never closes its object within the budget, but it opens one
    # with a key, which it never does unconstrained (below).
    streamed = "".join(f["text"] for f in frames if f["type"] == "delta")
    assert streamed.startswith('{"'), streamed[:80]
    conv = await Conversation.objects.aget(pk=conv_id)
    assert conv.json_mode and conv.settings_dict["json_mode"] is True
    # The next turn, with no settings in its frame, is held by the saved setting.
    frames = await turn(alice_socket, conv_id)
    assert frames[-1]["message"]["text"].startswith('{"')


async def test_without_json_mode_the_same_turn_is_free_text(alice_socket: ChatSocket) -> None:
    frames = await turn(alice_socket, None, settings={**JSON_MODE, "json_mode": False})
    assert frames[0]["conversation"]["settings"]["json_mode"] is False
    assert not frames[-1]["message"]["text"].startswith("{")


async def test_a_json_mode_reply_cut_short_goes_on_inside_its_object(
    alice_socket: ChatSocket, tiny_model_dir: Path
) -> None:
    frames = await turn(alice_socket, None, settings={**JSON_MODE, "max_tokens": 3})
    assert frames[-1]["finish_reason"] == "length", frames[-1]
    conv_id = frames[0]["conversation"]["id"]
    before = await Message.objects.aget(conversation_id=conv_id, role="assistant")
    await alice_socket.send({"type": "continue", "message_id": before.pk})
    done = (await alice_socket.recv_until("done"))[-1]
    assert done["status"] == "complete", done
    after = await Message.objects.aget(pk=before.pk)
    assert len(after.token_ids) > len(before.token_ids)
    # Every token, the first three and the new ones, is one the JSON grammar allows in
    # that place: the grammar took the reply so far, then went on (a grammar started
    # afresh would have opened a second object).
    grammar = json_grammar(tiny_model_dir)
    assert all(grammar.accept(t) for t in after.token_ids), after.text


def json_grammar(model_dir: Path) -> GrammarState:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return StructuredOutputs(tokenizer, len(tokenizer), [2]).start("json", "")


async def test_json_mode_must_be_true_or_false(alice_socket: ChatSocket) -> None:
    await alice_socket.send(
        {"type": "send", "conversation_id": None, "text": "Hi", "settings": {"json_mode": "yes"}}
    )
    error = await alice_socket.recv()
    assert error["type"] == "error" and error["code"] == "invalid", error
    assert error["message"] == "JSON mode must be true or false."
