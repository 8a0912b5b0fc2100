"""Importing conversations (docs/http.md, "Import"): a ChatGPT export, this app's own
JSON export and back, all of a file or nothing, hostile files, whose imports are whose, and
the next turn of an imported conversation."""

from __future__ import annotations

import io
import json
import threading
import time
import zipfile
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chatapp.chat import conversations
from chatapp.chat.attachments import create_pending
from chatapp.chat.export import conversation_payload, export_all
from chatapp.chat.models import Attachment, Conversation, Message
from chatapp.chat.tool_blocks import block
from chatapp.jobs.models import Job
from tests.sockets import open_socket


def client_for(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def send_file(c: Client, body: bytes, content_type: str = "application/json") -> Any:
    return c.post("/api/conversations/import/", data=body, content_type=content_type)


def node(
    key: str,
    parent: str | None,
    role: str | None,
    parts: list[Any] | None = None,
    t: float = 0,
    **message: Any,
) -> dict[str, Any]:
    msg = None
    if role is not None:
        msg = {
            "id": key,
            "author": {"role": role, "name": None, "metadata": {}},
            "create_time": t or None,
            "content": {"content_type": "text", "parts": parts or []},
            "status": "finished_successfully",
            "recipient": "all",
            "metadata": {},
            **message,
        }
    return {"id": key, "message": msg, "parent": parent, "children": []}


def chatgpt_conversation(title: str = "Trip to Lisbon") -> dict[str, Any]:
    """The shape of a ChatGPT export's conversation: a root, a hidden system message, a
    question, a reply regenerated once (two branches), a tool round-trip on the branch on
    screen, and its follow-up."""
    nodes = [
        node("root", None, None),
        node(
            "sys", "root", "system", [""], metadata={"is_visually_hidden_from_conversation": True}
        ),
        node("u1", "sys", "user", ["Where should I eat in Lisbon?"], 1.0),
        node("a1", "u1", "assistant", ["Try Time Out Market."], 2.0),
        node("a2", "u1", "assistant", ["Try a tasca in Alfama."], 3.0),
        node("call", "a2", "assistant", ["search('tasca alfama')"], 4.0, recipient="browser"),
        node("tool", "call", "tool", ["results..."], 5.0),
        node("u2", "tool", "user", ["And for dessert?"], 6.0),
        node("a3", "u2", "assistant", ["Pastéis de nata, of course."], 7.0),
        node(
            "img",
            "a3",
            "user",
            [{"content_type": "image_asset_pointer", "asset_pointer": "x"}, "What is this?"],
            8.0,
        ),
    ]
    mapping = {n["id"]: n for n in nodes}
    for n in nodes:
        if n["parent"]:
            mapping[n["parent"]]["children"].append(n["id"])
    return {
        "title": title,
        "create_time": 1700000000.5,
        "update_time": 1700000900.25,
        "mapping": mapping,
        "current_node": "img",
        "conversation_id": "abc-123",
    }


def shown(conv: Conversation) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in conversations.active_branch(conv)]


# --- ChatGPT ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_chatgpt_export_comes_in_with_its_branches(make_user: Any) -> None:
    alice = make_user("alice")
    body = json.dumps([chatgpt_conversation()]).encode()
    answer = send_file(client_for(alice), body)
    assert answer.status_code == 201, answer.content
    assert answer.json()["imported"] == 1
    conv = Conversation.objects.get(owner=alice)
    assert conv.title == "Trip to Lisbon"
    assert conv.created_at.timestamp() == 1700000000.5
    # The branch through current_node; the system node left out, and the tool call and
    # its result, which no reply followed, as blocks at the end of the reply that made them.
    assert shown(conv) == [
        ("user", "Where should I eat in Lisbon?"),
        (
            "assistant",
            "Try a tasca in Alfama.\n\n```tool-call browser\nsearch('tasca alfama')\n```"
            "\n\n```tool-result tool\nresults...\n```",
        ),
        ("user", "And for dessert?"),
        ("assistant", "Pastéis de nata, of course."),
        ("user", "[an image, not imported]\n\nWhat is this?"),
    ]
    # The first reply is kept as the other alternative, in its order.
    second = conversations.active_branch(conv)[1]
    alternatives = conversations.alternatives(second)
    assert len(alternatives) == 2 and alternatives[1] == second.pk
    assert Message.objects.get(pk=alternatives[0]).text == "Try Time Out Market."
    assert all(not m.token_ids for m in Message.objects.filter(conversation=conv))


@pytest.mark.django_db
def test_tool_calls_and_results_come_in_as_readable_blocks_before_the_answer(
    make_user: Any,
) -> None:
    """The shapes ChatGPT writes them in: a GPT action's JSON arguments, code for its
    python tool and the code's output, then the reply that used them."""
    alice = make_user("alice")
    code = {"content_type": "code", "language": "unknown", "text": "print(6 * 7)"}
    output = {"content_type": "execution_output", "text": "42"}
    nodes = [
        node("u", None, "user", ["Weather in Paris, and 6 times 7?"], 1.0),
        node("c1", "u", "assistant", ['{"city":"Paris","units":"metric"}'], 2.0,
             recipient="weather.get_forecast"),
        node("r1", "c1", "tool", ['{"sky":"clear","c":21}'], 3.0,
             author={"role": "tool", "name": "weather.get_forecast"}),
        node("c2", "r1", "assistant", [], 4.0, recipient="python", content=code),
        node("r2", "c2", "tool", [], 5.0, author={"role": "tool", "name": "python"},
             content=output),
        node("a", "r2", "assistant", ["Clear, 21 °C; and 42."], 6.0),
    ]  # fmt: skip
    data = {"title": "Tools", "mapping": {n["id"]: n for n in nodes}, "current_node": "a"}
    assert send_file(client_for(alice), json.dumps(data).encode()).status_code == 201
    reply = shown(Conversation.objects.get(owner=alice))[1]
    assert reply == (
        "assistant",
        '```tool-call weather.get_forecast\n{\n  "city": "Paris",\n  "units": "metric"\n}\n```'
        '\n\n```tool-result weather.get_forecast\n{\n  "sky": "clear",\n  "c": 21\n}\n```'
        "\n\n```tool-call python\nprint(6 * 7)\n```\n\n```tool-result python\n42\n```"
        "\n\nClear, 21 °C; and 42.",
    )


def test_a_tool_block_fence_outlasts_the_backticks_inside_it() -> None:
    assert block("tool-result", "my tool!", "a ``` b") == "````tool-result my_tool_\na ``` b\n````"


@pytest.mark.django_db
def test_a_chatgpt_zip_is_read_from_its_conversations_json(make_user: Any) -> None:
    alice = make_user("alice")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("chat.html", "<html></html>")
        zf.writestr(
            "conversations.json", json.dumps([chatgpt_conversation("A"), chatgpt_conversation("B")])
        )
    answer = send_file(client_for(alice), buffer.getvalue(), "application/zip")
    assert answer.status_code == 201, answer.content
    assert sorted(Conversation.objects.values_list("title", flat=True)) == ["A", "B"]


@pytest.mark.django_db
def test_a_chatgpt_conversation_without_current_node_shows_its_newest_branch(
    make_user: Any,
) -> None:
    alice = make_user("alice")
    data = chatgpt_conversation()
    del data["current_node"]
    assert send_file(client_for(alice), json.dumps(data).encode()).status_code == 201
    assert shown(Conversation.objects.get())[-1] == (
        "user",
        "[an image, not imported]\n\nWhat is this?",
    )


# --- this app's own export, and back ----------------------------------------------------


def finish(reply: Message, text: str) -> None:
    Message.objects.filter(pk=reply.pk).update(text=text, status="complete", finish_reason="stop")


def tree_of(conv: Conversation) -> list[tuple[Any, ...]]:
    """A conversation's whole tree, ids left out: each message's place, role, text and
    documents and figures, and which branch is on screen."""
    by_id = {m.pk: m for m in Message.objects.filter(conversation=conv).order_by("id")}
    on_screen = {m.pk for m in conversations.active_branch(conv)}

    def path(m: Message) -> tuple[str, ...]:
        out: list[str] = []
        node: Message | None = m
        while node is not None:
            out.append(node.text)
            node = by_id.get(node.parent_id) if node.parent_id else None
        return tuple(reversed(out))

    return sorted(
        (
            path(m),
            m.role,
            m.pk in on_screen,
            tuple((a.name, a.kind, a.size, a.tokens, a.text) for a in m.attachments.all()),
            m.figures,
        )
        for m in by_id.values()
    )


@pytest.mark.django_db
def test_export_then_import_gives_the_same_conversation(make_user: Any) -> None:
    alice = make_user("alice")
    conv = conversations.create_conversation(
        alice, "Release plan", {"system_prompt": "Be terse.", "temperature": 0.2, "max_tokens": 77}
    )
    doc = create_pending(alice, "plan.md", b"# Plan\nShip Friday.", None)
    u1, a1 = conversations.add_exchange(conv, None, "When do we ship?", [], documents=[doc])
    finish(a1, "Friday.")
    _, a1b = conversations.add_exchange(conv, u1, None, [])  # regenerated
    finish(a1b, "On Friday.")
    Message.objects.filter(pk=a1b.pk).update(
        figures={"ttft_ms": 81.5, "tokens_per_s": 42.25, "output_tokens": 3, "replayed": True}
    )
    _, a2 = conversations.add_exchange(conv, None, "When exactly?", [])  # an edit
    finish(a2, "Friday at noon.")
    conversations.update_conversation(conv, {"active_message": a1b.pk})

    exported = json.dumps(conversation_payload(conv)).encode()
    bob = make_user("bob")
    answer = send_file(client_for(bob), exported)
    assert answer.status_code == 201, answer.content
    copy = Conversation.objects.get(owner=bob)
    assert (copy.title, copy.settings_dict) == (conv.title, conv.settings_dict)
    assert conversations.model_of(copy) == conversations.model_of(conv)
    assert tree_of(copy) == tree_of(conv)
    assert all(a.owner_id == bob.pk for a in Attachment.objects.filter(message__conversation=copy))
    # ... and once more: the copy's export is the original's, ids and dates aside.
    again = conversation_payload(copy)
    assert [m["text"] for m in again["messages"]] == [
        m["text"] for m in json.loads(exported)["messages"]
    ]


@pytest.mark.django_db
def test_the_export_job_of_all_conversations_imports_back(
    make_user: Any, job_files_in_tmp: None, settings: Any
) -> None:
    alice = make_user("alice")
    for title in ("One", "Two"):
        conv = conversations.create_conversation(alice, title)
        _, reply = conversations.add_exchange(conv, None, f"Question {title}", [])
        finish(reply, f"Answer {title}")
    job = Job.objects.create(kind=Job.Kind.EXPORT, user=alice, params={"format": "json"})
    export_all(job)
    job.refresh_from_db()
    archive = (settings.VAR_DIR / job.file).read_bytes()
    bob = make_user("bob")
    answer = send_file(client_for(bob), archive, "application/zip")
    assert answer.status_code == 201, answer.content
    assert sorted(Conversation.objects.filter(owner=bob).values_list("title", flat=True)) == [
        "One",
        "Two",
    ]


@pytest.mark.django_db
def test_an_old_export_without_other_branches_still_imports(make_user: Any) -> None:
    alice = make_user("alice")
    old = {
        "conversation": {"id": 3, "title": "Old", "settings": {"temperature": 0.5}},
        "messages": [
            {"id": 10, "role": "user", "text": "Hi", "parent_id": None},
            {"id": 11, "role": "assistant", "text": "Hello", "parent_id": 10},
        ],
    }
    assert send_file(client_for(alice), json.dumps(old).encode()).status_code == 201
    conv = Conversation.objects.get()
    assert shown(conv) == [("user", "Hi"), ("assistant", "Hello")] and conv.temperature == 0.5


@pytest.mark.django_db
def test_an_export_from_before_figures_were_named_so_keeps_its_stats(make_user: Any) -> None:
    """Exports written before the rename carry a reply's figures as `stats`: read either."""
    alice = make_user("alice")
    old = {
        "conversation": {"id": 3, "title": "Old"},
        "messages": [
            {"id": 10, "role": "user", "text": "Hi", "parent_id": None, "stats": {}},
            {
                "id": 11,
                "role": "assistant",
                "text": "Hello",
                "parent_id": 10,
                "stats": {"ttft_ms": 12.5, "output_tokens": 2, "tokens_per_s": None},
            },
        ],
        "other_messages": [
            {
                "id": 12,
                "role": "assistant",
                "text": "Hey",
                "parent_id": 10,
                # Not numbers, or not figures: left out, the reply still comes in.
                "figures": {"ttft_ms": "fast", "output_tokens": True, "secret": 1, "e2e_ms": 9},
            },
        ],
    }
    assert send_file(client_for(alice), json.dumps(old).encode()).status_code == 201
    figures = dict(Message.objects.filter(role="assistant").values_list("text", "figures"))
    assert figures == {
        "Hello": {"ttft_ms": 12.5, "output_tokens": 2, "tokens_per_s": None},
        "Hey": {"e2e_ms": 9},
    }
    reply = Message.objects.get(text="Hello")
    assert conversations.message_json(reply)["figures"] == figures["Hello"]


@pytest.mark.django_db
def test_lone_surrogates_in_a_file_become_the_replacement_character(make_user: Any) -> None:
    alice = make_user("alice")
    # As JSON escapes, the way an export writes text it could not encode: low, high, a
    # valid pair beside them, and an escaped backslash before "ud800" (plain text).
    body = (
        rb'{"conversation": {"title": "odd \udc00 \ud800"}, "messages": ['
        rb'{"id": 1, "role": "user", "text": "a\udc00b\ud800c \ud83d\ude00 \\ud800",'
        rb' "parent_id": null}]}'
    )
    answer = send_file(client_for(alice), body)
    assert answer.status_code == 201, answer.content
    conv = Conversation.objects.get(owner=alice)
    assert conv.title == "odd \ufffd \ufffd"
    assert Message.objects.get(conversation=conv).text == "a\ufffdb\ufffdc \U0001f600 \\ud800"


@pytest.mark.django_db
def test_negative_figures_in_a_file_are_left_out(make_user: Any) -> None:
    alice = make_user("alice")
    export = {
        "conversation": {"title": "Figures"},
        "messages": [
            {"id": 1, "role": "user", "text": "Hi", "parent_id": None},
            {
                "id": 2,
                "role": "assistant",
                "text": "Hello",
                "parent_id": 1,
                "figures": {"ttft_ms": -5, "e2e_ms": 40, "output_tokens": -1},
            },
        ],
    }
    assert send_file(client_for(alice), json.dumps(export).encode()).status_code == 201
    assert Message.objects.get(role="assistant").figures == {"e2e_ms": 40}


# --- refused files: nothing imported ------------------------------------------------------

GOOD = chatgpt_conversation()


def deep(levels: int) -> bytes:
    return b'[{"mapping": ' + b"[" * levels + b"]" * levels + b"}]"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"", 400, "empty"),
        (b"hello", 400, "not valid JSON"),
        (b"42", 400, "not a list of conversations"),
        (b'[{"mapping": {}', 400, "not valid JSON"),
        (json.dumps([GOOD]).encode() + b" trailing", 400, "not valid JSON"),
        (b"[1]", 400, "conversation 1: it is not an object"),
        (b'[{"title": "x"}]', 400, "neither a ChatGPT conversation"),
        (
            b'[{"title": "T", "mapping": []}]',
            400,
            "conversation 1 (\"T\"): 'mapping' must be an object",
        ),
        (b'[{"mapping": {"a": {"parent": "zz", "message": null}}}]', 400, "not in the file"),
        (b'[{"mapping": {"a": {"parent": "b"}, "b": {"parent": "a"}}}]', 400, "loop"),
        (
            b'[{"mapping": {"a": {"parent": null, "message": {"author": {"role": "user"},'
            b' "content": {"content_type": "text", "parts": "hi"}}}}}]',
            400,
            "'parts' that are not a list",
        ),
        (
            b'[{"mapping": {"a": {"parent": null, "message": {"author": {"role": "user"},'
            b' "content": {"content_type": "text", "parts": [5]}}}}}]',
            400,
            "must be text",
        ),
        (deep(100), 400, "nested more than 64 levels"),
        (deep(1_000_000), 400, "nested more than 64 levels"),
        (b'{"conversation": {"title": 5}, "messages": []}', 400, "the title must be text"),
        (
            b'{"conversation": {"settings": {"temperature": 9}}, "messages": []}',
            400,
            "its settings are refused: Temperature must be between 0 and 2.",
        ),
        (
            b'{"conversation": {}, "messages": [{"id": 1, "role": "wizard", "text": "x"}]}',
            400,
            "role must be 'user' or 'assistant'",
        ),
        (
            b'{"conversation": {}, "messages": [{"id": 1, "role": "user", "text": "x",'
            b' "attachments": [{"name": "a", "text": 3}]}]}',
            400,
            "the text of an attachment of message 1 must be text",
        ),
        (b"PK\x03\x04broken zip", 400, "zip file cannot be opened"),
        (b"    \n\n  42", 400, "not a list of conversations"),
        (
            json.dumps([{"mapping": {"r": {"parent": None, "message": None}}}]).encode(),
            400,
            "no conversation with messages",
        ),
    ],
)
def test_a_malformed_file_imports_nothing_and_says_why(
    make_user: Any, body: bytes, status: int, words: str
) -> None:
    alice = make_user("alice")
    answer = send_file(client_for(alice), body)
    assert answer.status_code == status, answer.content
    assert words in answer.json()["error"]["message"]
    assert not Conversation.objects.exists() and not Message.objects.exists()


@pytest.mark.django_db
def test_one_bad_conversation_means_none_of_the_file_is_imported(make_user: Any) -> None:
    alice = make_user("alice")
    broken = {"title": "Broken", "mapping": {"a": {"parent": "nowhere"}}}
    answer = send_file(client_for(alice), json.dumps([GOOD, GOOD, broken]).encode())
    assert answer.status_code == 400
    assert 'conversation 3 ("Broken")' in answer.json()["error"]["message"]
    assert not Conversation.objects.exists()


@pytest.mark.django_db
def test_a_file_over_the_limit_is_refused_declared_or_not(make_user: Any, settings: Any) -> None:
    settings.CHAT_IMPORT_MAX_BYTES = 1000
    c = client_for(make_user("alice"))
    answer = c.post(
        "/api/conversations/import/",
        data=b"[]",
        content_type="application/json",
        CONTENT_LENGTH="5000000",
    )
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "too_large"
    big = json.dumps([GOOD] * 5).encode()
    assert len(big) > 1000
    answer = send_file(c, big)
    assert answer.status_code == 413 and "1.0 KB" in answer.json()["error"]["message"]
    # A zip whose conversations.json inflates past the limit.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("conversations.json", b"[" + b" " * 100_000 + b"]")
    assert len(buffer.getvalue()) < 1000
    answer = send_file(c, buffer.getvalue(), "application/zip")
    assert answer.status_code == 413
    assert not Conversation.objects.exists()


@pytest.mark.django_db
def test_too_many_conversations_in_one_file_are_refused(make_user: Any, settings: Any) -> None:
    settings.CHAT_IMPORT_MAX_CONVERSATIONS = 2
    answer = send_file(client_for(make_user("alice")), json.dumps([GOOD] * 3).encode())
    assert (
        answer.status_code == 400
        and "more than 2 conversations" in answer.json()["error"]["message"]
    )
    assert not Conversation.objects.exists()


@pytest.mark.django_db
def test_text_no_database_can_store_is_repaired_not_refused(make_user: Any) -> None:
    alice = make_user("alice")
    data = chatgpt_conversation("Bad \\ud800 title")
    data["mapping"]["u1"]["message"]["content"]["parts"] = ["nul\u0000here"]
    body = json.dumps([data]).replace("Bad \\\\ud800", "Bad \\ud800").encode()
    assert send_file(client_for(alice), body).status_code == 201
    conv = Conversation.objects.get()
    assert "\x00" not in shown(conv)[0][1] and shown(conv)[0][1] == "nul\ufffdhere"
    conv.title.encode("utf-8")  # storable


@pytest.mark.django_db
def test_imports_belong_to_the_importer_only(make_user: Any) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    send_file(client_for(alice), json.dumps([GOOD]).encode())
    conv = Conversation.objects.get()
    assert conv.owner == alice
    assert client_for(bob).get("/api/conversations/").json()["conversations"] == []
    assert client_for(bob).get(f"/api/conversations/{conv.pk}/").status_code == 404
    assert (
        Client()
        .post("/api/conversations/import/", data=b"[]", content_type="application/json")
        .status_code
        == 401
    )


# --- the next turn ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_an_imported_conversation_goes_on_and_its_next_turns_reuse_the_cache(
    make_user: Any, tiny_engine: Any, settings: Any
) -> None:
    settings.RESPONSE_CACHE_ENABLED = False
    alice = await database_sync_to_async(make_user)("alice")
    answer = await database_sync_to_async(
        lambda: send_file(client_for(alice), json.dumps([GOOD]).encode())
    )()
    conv_id = answer.json()["conversations"][0]["id"]
    await database_sync_to_async(
        lambda: Conversation.objects.filter(pk=conv_id).update(max_tokens=4, temperature=0)
    )()
    sock, connected, _ = await open_socket(alice)
    assert connected
    greedy = {"type": "send", "conversation_id": conv_id}
    await sock.send({**greedy, "text": "Thanks!"})
    first = (await sock.recv_until("done"))[-1]
    assert first["status"] == "complete"
    # The history had no token ids: the engine read all of it once ...
    assert first["figures"]["prompt_tokens"] > 60
    await sock.send({**greedy, "text": "One more?"})
    second = (await sock.recv_until("done"))[-1]
    await sock.close()
    # ... and the next turn reuses it, since the history tokenizes the same each time.
    assert second["figures"]["cached_tokens"] >= first["figures"]["prompt_tokens"] - 16


@pytest.mark.django_db
def test_a_zip_whose_conversations_json_is_corrupt_imports_nothing(make_user: Any) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("conversations.json", json.dumps([GOOD] * 20))
    data = bytearray(buffer.getvalue())
    middle = len(data) // 2
    data[middle : middle + 40] = b"\xff" * 40  # the deflated stream, broken in the middle
    answer = send_file(client_for(make_user("alice")), bytes(data), "application/zip")
    assert answer.status_code == 400, answer.content
    assert "Nothing was imported" in answer.json()["error"]["message"]
    assert not Conversation.objects.exists()


def own_export_chains(conversations: int, messages: int) -> bytes:
    return json.dumps(
        [
            {
                "conversation": {"title": f"chat {c}"},
                "messages": [
                    {
                        "id": i,
                        "parent_id": i - 1 if i else None,
                        "role": "user" if i % 2 == 0 else "assistant",
                        "text": f"message {i} " * 8,
                    }
                    for i in range(messages)
                ],
            }
            for c in range(conversations)
        ]
    ).encode()


@pytest.mark.django_db(transaction=True)
def test_another_users_writes_wait_milliseconds_while_a_large_import_runs(
    make_user: Any,
) -> None:
    from django.db import connection

    from chatapp.chat.imports import import_file

    alice, bob = make_user("alice"), make_user("bob")
    # 6,000 messages: hundreds of the import's 10 ms write batches, and alice's writes
    # between them.
    body = own_export_chains(conversations=300, messages=20)
    importing = threading.Event()
    waits: list[float] = []

    def alice_keeps_writing() -> None:
        try:
            importing.wait()
            while importing.is_set():
                started = time.monotonic()
                Conversation.objects.create(owner=alice, title="mine")
                waits.append(time.monotonic() - started)
                time.sleep(0.01)
        finally:
            connection.close()

    writer = threading.Thread(target=alice_keeps_writing)
    writer.start()
    started = time.monotonic()
    importing.set()
    try:
        created = import_file(bob, io.BytesIO(body))
    finally:
        importing.clear()
        writer.join()
    took = time.monotonic() - started
    assert len(created) == 300 and Message.objects.filter(conversation__owner=bob).count() == 6000
    assert len(waits) >= 20, (took, waits)
    waits.sort()
    # Each of alice's writes waited for one short batch of the import at most.
    assert waits[-1] < 0.5, (took, waits[len(waits) // 2], waits[-5:])
    print(f"import {took:.1f} s; alice's {len(waits)} writes: median "
          f"{waits[len(waits) // 2] * 1000:.0f} ms, max {waits[-1] * 1000:.0f} ms")  # fmt: skip
