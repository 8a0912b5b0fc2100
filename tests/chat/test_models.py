"""A model per conversation (issue 17, item 2): the chat names the model each turn goes
to, remembers it on the conversation, and names it on each reply; switching models never
feeds one model's token ids to another. Three real engines in this process: the tiny
model (the default), a twin with other weights and the same tokenizer, and a tiny model
with a tokenizer of its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chatapp.chat import conversations
from chatapp.chat.models import Conversation, Message
from inference.backends.embedded import EmbeddedClient
from inference.client import install_engine_clients, set_engine_client
from tests.engines import make_engine_client
from tests.sockets import ChatSocket, user_socket
from tests.tiny_model import build_tiny_llama, build_tiny_llama_own_tokenizer

pytestmark = pytest.mark.django_db(transaction=True)

MAIN, TWIN, OWN = "main", "twin", "own"
SHORT = {"max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def engines(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, real_model_dir: Path
) -> Iterator[dict[str, EmbeddedClient]]:
    folder = tmp_path_factory.mktemp("models")
    served = {
        MAIN: make_engine_client(tiny_model_dir, MAIN),
        TWIN: make_engine_client(build_tiny_llama(folder / "twin", real_model_dir, seed=1), TWIN),
        OWN: make_engine_client(
            build_tiny_llama_own_tokenizer(folder / "own", real_model_dir), OWN
        ),
    }
    install_engine_clients(served)
    yield served
    set_engine_client(None)


@pytest.fixture
async def sock(make_user: Any, engines: dict[str, EmbeddedClient]) -> Any:
    async with user_socket(make_user) as sock:
        yield sock


async def turn(sock: ChatSocket, conversation_id: int | None, text: str, **frame: Any) -> list:
    await sock.send({"type": "send", "conversation_id": conversation_id, "text": text, **frame})
    return await sock.recv_until("done")


def of_type(frames: list[dict], kind: str) -> dict:
    return next(f for f in frames if f["type"] == kind)


@database_sync_to_async
def saved(conversation_id: int) -> tuple[Conversation, list[Message]]:
    conv = Conversation.objects.get(pk=conversation_id)
    return conv, list(Message.objects.filter(conversation=conv).order_by("id"))


async def test_a_new_chat_is_on_the_default_model_and_each_reply_names_its_model(
    sock: ChatSocket, engines: dict[str, EmbeddedClient]
) -> None:
    frames = await turn(sock, None, "Hello!", settings=SHORT)
    assert of_type(frames, "conversation")["conversation"]["model"] == MAIN
    assert of_type(frames, "start")["message"]["model"] == MAIN
    done = frames[-1]
    assert done["status"] == "complete" and done["message"]["model"] == MAIN
    conv, (user, reply) = await saved(done["message"]["conversation_id"])
    assert conv.model == MAIN
    assert (user.model, user.tokenizer) == (MAIN, engines[MAIN].tokenizer_id)
    assert (reply.model, reply.tokenizer) == (MAIN, engines[MAIN].tokenizer_id)


async def test_the_model_a_turn_names_answers_it_and_stays_the_conversation_s(
    sock: ChatSocket,
) -> None:
    first = await turn(sock, None, "Hello!", settings=SHORT, model=TWIN)
    conv_id = first[-1]["message"]["conversation_id"]
    assert of_type(first, "conversation")["conversation"]["model"] == TWIN
    second = await turn(sock, conv_id, "And then?")  # names no model: the remembered one
    assert second[-1]["message"]["model"] == TWIN
    third = await turn(sock, conv_id, "Once more", model=MAIN)
    assert third[-1]["message"]["model"] == MAIN
    conv, messages = await saved(conv_id)
    assert conv.model == MAIN
    assert [m.model for m in messages] == [TWIN, TWIN, TWIN, TWIN, MAIN, MAIN]


async def test_a_regenerated_reply_from_another_model_is_an_alternative_naming_it(
    sock: ChatSocket,
) -> None:
    first = await turn(sock, None, "Hello!", settings=SHORT)
    old = first[-1]["message"]
    await sock.send({"type": "regenerate", "message_id": old["id"], "model": TWIN})
    new = (await sock.recv_until("done"))[-1]["message"]
    assert (old["model"], new["model"]) == (MAIN, TWIN)
    assert new["alternatives"] == [old["id"], new["id"]]


async def test_a_model_with_another_tokenizer_gets_the_replies_as_text_never_their_ids(
    sock: ChatSocket, engines: dict[str, EmbeddedClient]
) -> None:
    first = await turn(sock, None, "Hello there, tell me a joke", settings=SHORT)
    conv_id = first[-1]["message"]["conversation_id"]
    # The default model's reply ids run up to 49,151; the other vocabulary has 406 ids.
    second = await turn(sock, conv_id, "Another one?", model=OWN)
    assert second[-1]["status"] == "complete", second
    conv, messages = await saved(conv_id)
    vocab = len(engines[OWN].tokenizer)
    assert messages[2].tokenizer == messages[3].tokenizer == engines[OWN].tokenizer_id
    assert messages[2].token_ids and max(messages[2].token_ids) < vocab
    branch = await database_sync_to_async(conversations.active_branch)(conv)
    turns = conversations.turns_for(conv, branch, engines[OWN].tokenizer_id)
    assert [t.token_ids for t in turns if t.role == "assistant"] == [None, messages[3].token_ids]
    # Back to the default model: its own reply keeps its ids (so its KV of the first turn
    # is reused), the other model's reply goes as text.
    turns = conversations.turns_for(conv, branch, engines[MAIN].tokenizer_id)
    assert [t.token_ids for t in turns if t.role == "assistant"] == [messages[1].token_ids, None]
    third = await turn(sock, conv_id, "Thanks", model=MAIN)
    figures = third[-1]["figures"]
    assert third[-1]["status"] == "complete" and figures["cached_tokens"] > 0
    assert figures["cached_tokens"] >= first[-1]["figures"]["prompt_tokens"] // 16 * 16


async def test_a_twin_tokenizer_takes_the_replies_ids_as_they_are(
    sock: ChatSocket, engines: dict[str, EmbeddedClient]
) -> None:
    assert engines[TWIN].tokenizer_id == engines[MAIN].tokenizer_id != engines[OWN].tokenizer_id
    first = await turn(sock, None, "Hello!", settings=SHORT)
    conv, _ = await saved(first[-1]["message"]["conversation_id"])
    branch = await database_sync_to_async(conversations.active_branch)(conv)
    turns = conversations.turns_for(conv, branch, engines[TWIN].tokenizer_id)
    assert turns[-1].token_ids == branch[-1].token_ids


def test_replies_from_before_models_were_named_keep_their_ids_for_the_default_only(
    make_user: Any, engines: dict[str, EmbeddedClient]
) -> None:
    conv = Conversation.objects.create(owner=make_user("bob"))
    user = Message.objects.create(conversation=conv, role="user", text="Hi")
    reply = Message.objects.create(
        conversation=conv, role="assistant", parent=user, text="Hello", token_ids=[19556, 2]
    )
    branch = [user, reply]
    assert conversations.turns_for(conv, branch, "abc", legacy=True)[-1].token_ids == [19556, 2]
    assert conversations.turns_for(conv, branch, "abc")[-1].token_ids is None
    assert conversations.turns_for(conv, branch, None, legacy=True)[-1].token_ids is None
    assert conversations.conversation_json(conv)["model"] == MAIN  # blank: the default's


async def test_a_model_nobody_serves_is_an_error_frame_and_nothing_is_saved(
    sock: ChatSocket,
) -> None:
    await sock.send({"type": "send", "conversation_id": None, "text": "Hi", "model": "gpt-4o"})
    error = await sock.recv()
    assert error["type"] == "error" and error["code"] == "model_not_found"
    assert "gpt-4o" in error["message"]
    assert await database_sync_to_async(Conversation.objects.count)() == 0
    first = await turn(sock, None, "Hello!", settings=SHORT)
    conv_id, reply_id = first[-1]["message"]["conversation_id"], first[-1]["message_id"]
    for frame in (
        {"type": "send", "conversation_id": conv_id, "text": "Hi", "model": "gpt-4o"},
        {"type": "regenerate", "message_id": reply_id, "model": "gpt-4o"},
        {"type": "send", "conversation_id": conv_id, "text": "Hi", "model": 7},
        {"type": "send", "conversation_id": conv_id, "text": "Hi", "model": "x" * 201},
    ):
        await sock.send(frame)
        error = await sock.recv()
        assert error["type"] == "error", frame
        assert error["code"] == ("model_not_found" if frame["model"] == "gpt-4o" else "invalid")
    conv, messages = await saved(conv_id)
    assert conv.model == MAIN and len(messages) == 2


async def test_a_conversation_whose_model_is_no_longer_served_says_so_on_its_next_turn(
    sock: ChatSocket,
) -> None:
    first = await turn(sock, None, "Hello!", settings=SHORT)
    conv_id = first[-1]["message"]["conversation_id"]
    await database_sync_to_async(Conversation.objects.filter(pk=conv_id).update)(model="retired")
    await sock.send({"type": "send", "conversation_id": conv_id, "text": "Still there?"})
    error = await sock.recv()
    assert error["code"] == "model_not_found" and "retired" in error["message"]
    again = await turn(sock, conv_id, "Still there?", model=MAIN)
    assert again[-1]["status"] == "complete"


# --- over HTTP: the picker's list, and the model saved with the conversation -------------


@pytest.fixture
def browser(make_user: Any, engines: dict[str, EmbeddedClient]) -> Client:
    c = Client()
    c.force_login(make_user("carol"))
    return c


def patch(c: Client, url: str, body: Any) -> Any:
    return c.patch(url, data=json.dumps(body), content_type="application/json")


def test_the_models_endpoint_lists_what_a_conversation_can_use(
    browser: Client, engines: dict[str, EmbeddedClient]
) -> None:
    answer = browser.get("/api/models/").json()
    assert answer["default"] == MAIN
    assert answer["models"] == [
        {
            "id": name,
            "default": name == MAIN,
            "context_tokens": engines[name].max_model_len,
            "architecture": "LlamaForCausalLM",
            "weight_format": "safetensors fp32",
        }
        for name in (MAIN, TWIN, OWN)
    ]
    assert Client().get("/api/models/").status_code == 401


def test_a_conversation_s_model_is_saved_with_it_and_checked(browser: Client) -> None:
    made = browser.post("/api/conversations/", data={"model": OWN}, content_type="application/json")
    assert made.status_code == 201 and made.json()["model"] == OWN
    url = f"/api/conversations/{made.json()['id']}/"
    assert patch(browser, url, {"model": TWIN}).json()["conversation"]["model"] == TWIN
    refused = patch(browser, url, {"model": "gpt-4o"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "model_not_found" and MAIN in error["message"]
    assert patch(browser, url, {"model": ""}).status_code == 400
    assert browser.get(url).json()["conversation"]["model"] == TWIN
    listed = browser.get("/api/conversations/").json()["conversations"]
    assert [c["model"] for c in listed] == [TWIN]
    plain = browser.post("/api/conversations/", data={}, content_type="application/json")
    assert plain.json()["model"] == MAIN


def test_an_export_names_the_model_of_each_reply(browser: Client, make_user: Any) -> None:
    conv = Conversation.objects.get(
        pk=browser.post(
            "/api/conversations/", data={"model": TWIN}, content_type="application/json"
        ).json()["id"]
    )
    user = Message.objects.create(conversation=conv, role="user", text="Hi", model=TWIN)
    reply = Message.objects.create(
        conversation=conv, role="assistant", parent=user, text="Hello", model=TWIN
    )
    Conversation.objects.filter(pk=conv.pk).update(active_leaf=reply)
    exported = browser.get(f"/api/conversations/{conv.pk}/export.json").json()
    assert exported["conversation"]["model"] == TWIN
    assert [m["model"] for m in exported["messages"]] == [TWIN, TWIN]
