"""The chat WebSocket, end to end through the real ASGI app and the real engine (on a
tiny random-weight llama: these tests are about the plumbing, not the words)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from channels.db import database_sync_to_async
from django.conf import settings as django_settings

from chatapp import slots
from chatapp.chat.generation import registry
from chatapp.chat.models import Conversation, Message
from tests.sockets import ChatSocket, open_socket

pytestmark = pytest.mark.django_db(transaction=True)

LONG = {"max_tokens": 400, "temperature": 0}


async def send_and_finish(sock: ChatSocket, text: str = "Hello!", **frame: Any) -> list[dict]:
    await sock.send({"type": "send", "conversation_id": None, "text": text, **frame})
    return await sock.recv_until("done")


def of_type(frames: list[dict], kind: str) -> list[dict]:
    return [f for f in frames if f["type"] == kind]


@database_sync_to_async
def messages_of(conversation_id: int) -> list[Message]:
    return list(Message.objects.filter(conversation_id=conversation_id).order_by("id"))


async def test_reply_streams_in_several_deltas_and_is_saved(
    alice_socket: ChatSocket, settings: Any
) -> None:
    settings.CHAT_FLUSH_INTERVAL_MS = 0
    frames = await send_and_finish(alice_socket, settings={"max_tokens": 24, "temperature": 0})
    kinds = [f["type"] for f in frames]
    assert kinds[:2] == ["conversation", "start"]
    deltas = of_type(frames, "delta")
    assert len(deltas) >= 2, "a reply must arrive as several frames, not one block"
    done = frames[-1]
    assert done["status"] == "complete"
    assert done["finish_reason"] in {"stop", "length"}
    figures = done["figures"]
    assert figures["output_tokens"] >= 1
    assert figures["ttft_ms"] > 0 and figures["prompt_tokens"] > 0
    conv_id = frames[0]["conversation"]["id"]
    user_msg, reply = await messages_of(conv_id)
    assert user_msg.role == "user" and user_msg.text == "Hello!" and user_msg.token_ids
    assert reply.role == "assistant" and reply.status == "complete"
    assert reply.text == "".join(d["text"] for d in deltas)
    assert len(reply.token_ids) == figures["output_tokens"]
    assert reply.figures["ttft_ms"] == figures["ttft_ms"]
    assert [d["seq"] for d in deltas] == sorted(d["seq"] for d in deltas)


async def test_deltas_are_coalesced_by_the_flush_interval(
    alice_socket: ChatSocket, settings: Any
) -> None:
    settings.CHAT_FLUSH_INTERVAL_MS = 250
    frames = await send_and_finish(alice_socket, settings={"max_tokens": 60, "temperature": 0})
    deltas = of_type(frames, "delta")
    tokens = frames[-1]["figures"]["output_tokens"]
    assert 1 <= len(deltas) < tokens, (len(deltas), tokens)


async def test_next_turn_continues_the_same_conversation(alice_socket: ChatSocket) -> None:
    first = await send_and_finish(alice_socket, settings={"max_tokens": 8, "temperature": 0})
    conv_id = first[0]["conversation"]["id"]
    await alice_socket.send({"type": "send", "conversation_id": conv_id, "text": "And then?"})
    second = await alice_socket.recv_until("done")
    assert second[0]["type"] == "start" and second[0]["conversation_id"] == conv_id
    msgs = await messages_of(conv_id)
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[2].parent_id == msgs[1].pk
    # The second prompt extends the first prompt and reply, so the engine reuses it.
    assert second[-1]["figures"]["prompt_tokens"] > first[-1]["figures"]["prompt_tokens"]


async def test_a_conversation_is_free_for_its_next_turn_when_done_arrives(
    alice_socket: ChatSocket,
) -> None:
    """A client sends the next turn the moment it sees `done` (the UI's send button comes
    back with it): by then the reply must have given up its conversation, in this process
    and in Redis's shared locks, or that turn is refused as already streaming."""
    conv_id = None
    for turn in range(3):
        await alice_socket.send({"type": "send", "conversation_id": conv_id, "text": f"Turn {turn}",
                                 "settings": {"max_tokens": 4, "temperature": 0}})  # fmt: skip
        frames = await alice_socket.recv_until("done")
        assert of_type(frames, "error") == [], frames
        conv_id = frames[0]["conversation_id"] if turn else frames[0]["conversation"]["id"]
        # Looked at before this loop lets anything else run: no await from `done` to here.
        assert registry.streaming_in(conv_id) is None
        if slots.enabled():
            lock = slots.key(f"chat-conversation:{conv_id}")
            assert redis.Redis.from_url(django_settings.REDIS_URL).exists(lock) == 0


async def test_stop_mid_reply_saves_what_was_generated(
    alice_socket: ChatSocket, settings: Any
) -> None:
    settings.CHAT_FLUSH_INTERVAL_MS = 0
    await alice_socket.send(
        {"type": "send", "conversation_id": None, "text": "Go on", "settings": LONG}
    )
    frames = await alice_socket.recv_until("delta")
    message_id = of_type(frames, "start")[0]["message"]["id"]
    await alice_socket.send({"type": "stop", "message_id": message_id})
    rest = await alice_socket.recv_until("done")
    done = rest[-1]
    assert done["status"] == "stopped" and done["finish_reason"] == "abort"
    saved = await database_sync_to_async(Message.objects.get)(pk=message_id)
    assert saved.status == "stopped" and saved.finish_reason == "abort"
    streamed = "".join(f["text"] for f in frames + rest if f["type"] == "delta")
    assert saved.text == streamed
    assert 0 < len(saved.token_ids) < 400


async def test_regenerate_keeps_the_old_reply_as_an_alternative(alice_socket: ChatSocket) -> None:
    first = await send_and_finish(alice_socket, settings={"max_tokens": 6, "temperature": 1.0})
    old_id = first[-1]["message_id"]
    await alice_socket.send({"type": "regenerate", "message_id": old_id})
    frames = await alice_socket.recv_until("done")
    new = frames[-1]["message"]
    assert new["id"] != old_id
    assert new["alternatives"] == [old_id, new["id"]] and new["alternative_index"] == 1
    conv = await database_sync_to_async(Conversation.objects.get)(pk=first[0]["conversation"]["id"])
    assert conv.active_leaf_id == new["id"]


async def test_edit_branches_from_the_edited_message(alice_socket: ChatSocket) -> None:
    first = await send_and_finish(alice_socket, "First question", settings={"max_tokens": 4})
    user_id = of_type(first, "start")[0]["user_message"]["id"]
    await alice_socket.send({"type": "edit", "message_id": user_id, "text": "Better question"})
    frames = await alice_socket.recv_until("done")
    start = of_type(frames, "start")[0]
    assert start["user_message"]["text"] == "Better question"
    assert start["user_message"]["alternatives"] == [user_id, start["user_message"]["id"]]
    msgs = await messages_of(start["conversation_id"])
    assert len(msgs) == 4  # both branches are kept


async def test_foreign_origin_is_refused(make_user: Any) -> None:
    user = await database_sync_to_async(make_user)("mallory")
    _, connected, _ = await open_socket(user, origin=b"http://evil.example")
    assert not connected


@pytest.mark.parametrize(
    "raw, code",
    [
        ("not json", "bad_frame"),
        ("[1, 2]", "bad_frame"),
        ('{"type": "launch_missiles"}', "bad_frame"),
        ('{"no_type": 1}', "bad_frame"),
        ('{"type": "send", "conversation_id": null, "text": 42}', "bad_frame"),
        ('{"type": "send", "conversation_id": "7", "text": "hi"}', "bad_frame"),
        ('{"type": "send", "conversation_id": null, "text": "   "}', "invalid"),
        ('{"type": "send", "conversation_id": null, "text": "\\ud800 lone"}', "invalid"),
        ('{"type": "send", "conversation_id": null, "text": "a\\u0000b"}', "invalid"),
        (
            '{"type": "send", "conversation_id": null, "text": "hi", '
            '"settings": {"temperature": 9}}',
            "invalid",
        ),
        (
            '{"type": "send", "conversation_id": null, "text": "hi", "settings": {"evil": 1}}',
            "invalid",
        ),
        ('{"type": "stop", "message_id": 999999}', "not_found"),
        ('{"type": "send", "conversation_id": 999999, "text": "hi"}', "not_found"),
    ],
)
async def test_malformed_frames_get_an_error_and_the_socket_stays_usable(
    alice_socket: ChatSocket, raw: str, code: str
) -> None:
    await alice_socket.c.send_to(text_data=raw)
    error = await alice_socket.recv()
    assert error["type"] == "error" and error["code"] == code, error
    assert error["message"]
    await alice_socket.send({"type": "ping"})
    assert (await alice_socket.recv())["type"] == "pong"
    assert await database_sync_to_async(Conversation.objects.count)() == 0


async def test_oversized_frame_is_refused(alice_socket: ChatSocket, settings: Any) -> None:
    settings.CHAT_MAX_FRAME_BYTES = 1000
    await alice_socket.send({"type": "send", "conversation_id": None, "text": "x" * 2000})
    error = await alice_socket.recv()
    assert error["code"] == "frame_too_large"
    await alice_socket.send({"type": "ping"})
    assert (await alice_socket.recv())["type"] == "pong"


async def test_binary_frame_is_refused(alice_socket: ChatSocket) -> None:
    await alice_socket.c.send_to(bytes_data=b"\x00\x01")
    assert (await alice_socket.recv())["code"] == "bad_frame"


async def test_prompt_longer_than_the_context_is_refused_and_nothing_saved(
    alice_socket: ChatSocket, tiny_engine: Any
) -> None:
    words = " ".join(["token"] * (tiny_engine.max_model_len + 10))
    await alice_socket.send({"type": "send", "conversation_id": None, "text": words})
    error = await alice_socket.recv()
    assert error["type"] == "error" and error["code"] == "too_long"
    assert await database_sync_to_async(Message.objects.count)() == 0
    assert await database_sync_to_async(Conversation.objects.count)() == 0


async def test_a_user_cannot_touch_another_users_conversation(
    alice_socket: ChatSocket, make_user: Any
) -> None:
    frames = await send_and_finish(alice_socket, settings={"max_tokens": 4})
    conv_id = frames[0]["conversation"]["id"]
    reply_id = frames[-1]["message_id"]
    user_id = of_type(frames, "start")[0]["user_message"]["id"]
    bob = await database_sync_to_async(make_user)("bob")
    bob_sock, connected, _ = await open_socket(bob)
    assert connected
    try:
        attempts = [
            {"type": "send", "conversation_id": conv_id, "text": "mine now"},
            {"type": "stop", "message_id": reply_id},
            {"type": "regenerate", "message_id": reply_id},
            {"type": "edit", "message_id": user_id, "text": "changed"},
            {"type": "resume", "message_id": reply_id},
        ]
        for frame in attempts:
            await bob_sock.send(frame)
            answer = await bob_sock.recv()
            assert answer["type"] == "error" and answer["code"] == "not_found", (frame, answer)
    finally:
        await bob_sock.close()
    assert len(await messages_of(conv_id)) == 2


async def test_second_send_while_streaming_is_refused(
    alice_socket: ChatSocket, settings: Any
) -> None:
    settings.CHAT_FLUSH_INTERVAL_MS = 0
    await alice_socket.send(
        {"type": "send", "conversation_id": None, "text": "One", "settings": LONG}
    )
    frames = await alice_socket.recv_until("start")
    conv_id = frames[-1]["conversation_id"]
    await alice_socket.send({"type": "send", "conversation_id": conv_id, "text": "Two"})
    seen = []
    while True:
        frame = await alice_socket.recv()
        seen.append(frame)
        if frame["type"] == "error":
            break
    assert seen[-1]["code"] == "already_streaming"
    await alice_socket.send({"type": "stop", "message_id": frames[-1]["message"]["id"]})
    await alice_socket.recv_until("done")


async def test_disconnect_stops_the_reply_and_saves_it(
    make_user: Any, tiny_engine: Any, settings: Any
) -> None:
    settings.CHAT_DISCONNECT_GRACE_S = 0
    settings.CHAT_FLUSH_INTERVAL_MS = 0
    user = await database_sync_to_async(make_user)("carol")
    sock, _, _ = await open_socket(user)
    await sock.send({"type": "send", "conversation_id": None, "text": "Talk", "settings": LONG})
    frames = await sock.recv_until("delta")
    message_id = of_type(frames, "start")[0]["message"]["id"]
    await sock.close()
    for _ in range(100):
        saved = await database_sync_to_async(Message.objects.get)(pk=message_id)
        if saved.status != "streaming":
            break
        await asyncio.sleep(0.05)
    assert saved.status == "stopped" and saved.finish_reason == "disconnect"
    assert saved.text and saved.token_ids
    assert tiny_engine.stats()["running"] == 0


async def test_reconnect_resumes_a_reply_still_being_generated(
    make_user: Any, tiny_engine: Any, settings: Any
) -> None:
    settings.CHAT_DISCONNECT_GRACE_S = 30
    settings.CHAT_FLUSH_INTERVAL_MS = 0
    user = await database_sync_to_async(make_user)("dave")
    sock, _, _ = await open_socket(user)
    await sock.send(
        {
            "type": "send",
            "conversation_id": None,
            "text": "Long story",
            "settings": {"max_tokens": 300},
        }
    )
    frames = await sock.recv_until("delta")
    message_id = of_type(frames, "start")[0]["message"]["id"]
    await sock.close()

    again, connected, _ = await open_socket(user)
    assert connected
    await again.send({"type": "resume", "message_id": message_id})
    after = await again.recv_until("done")
    snapshot = after[0]
    assert snapshot["type"] == "snapshot" and snapshot["message"]["id"] == message_id
    tail = "".join(
        f["text"]
        for f in after
        if f["type"] == "delta" and f["seq"] > snapshot["message"].get("seq", 0)
    )
    final = after[-1]["message"]
    assert final["status"] == "complete"
    assert final["text"] == snapshot["message"]["text"] + tail
    await again.close()


async def test_resume_of_a_finished_reply_sends_snapshot_and_done(alice_socket: ChatSocket) -> None:
    frames = await send_and_finish(alice_socket, settings={"max_tokens": 5})
    reply_id = frames[-1]["message_id"]
    await alice_socket.send({"type": "resume", "message_id": reply_id})
    snapshot = await alice_socket.recv()
    done = await alice_socket.recv()
    assert (
        snapshot["type"] == "snapshot"
        and snapshot["message"]["text"] == frames[-1]["message"]["text"]
    )
    assert done["type"] == "done" and done["status"] == "complete"


def test_protocol_doc_lists_every_frame_type() -> None:
    from pathlib import Path

    from chatapp.chat.consumers import ChatConsumer

    doc = (Path(__file__).resolve().parents[2] / "docs" / "websocket.md").read_text()
    for kind in ChatConsumer.HANDLERS:
        assert f"`{kind}`" in doc, kind


async def test_messages_per_minute_are_limited_per_user(
    alice_socket: ChatSocket, settings: Any
) -> None:
    settings.CHAT_RATE_LIMIT_PER_MINUTE = 2
    for _ in range(2):
        await send_and_finish(alice_socket, settings={"max_tokens": 2})
    await alice_socket.send({"type": "send", "conversation_id": None, "text": "One more"})
    error = await alice_socket.recv()
    assert error["type"] == "error" and error["code"] == "rate_limited"
    assert "minute" in error["message"]
    assert await database_sync_to_async(Message.objects.count)() == 4


async def test_concurrent_replies_are_capped_per_user(
    alice_socket: ChatSocket, settings: Any
) -> None:
    settings.CHAT_MAX_CONCURRENT_STREAMS = 1
    await alice_socket.send(
        {"type": "send", "conversation_id": None, "text": "A", "settings": LONG}
    )
    start = (await alice_socket.recv_until("start"))[-1]
    await alice_socket.send({"type": "send", "conversation_id": None, "text": "B"})
    while (frame := await alice_socket.recv())["type"] != "error":
        pass
    assert frame["code"] == "rate_limited"
    await alice_socket.send({"type": "stop", "message_id": start["message"]["id"]})
    await alice_socket.recv_until("done")
