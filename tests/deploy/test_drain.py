"""SIGTERM on a real web server (daphne) mid-reply: it starts no new reply, lets the
running ones finish for up to CHAT_DRAIN_S, saves them, and exits; a reply past the
deadline is cut, saved with what it had, and marked (finish "shutdown")."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from tests.servers import frames_until, started, users_code
from tools.live_server import LiveServer

PASSWORD = "a-long-test-password-1"


def send(sock: Any, text: str, max_tokens: int) -> None:
    settings = {"max_tokens": max_tokens, "temperature": 0}
    sock.send(json.dumps({"type": "send", "conversation_id": None, "text": text,
                          "settings": settings}))  # fmt: skip


def stored_reply(server: LiveServer, message_id: int) -> dict[str, Any]:
    return json.loads(
        server.python(
            "import json; from chatapp.chat.models import Message; "
            f"m = Message.objects.get(pk={message_id}); "
            "print(json.dumps({'status': m.status, 'finish_reason': m.finish_reason, "
            "'text': m.text, 'tokens': len(m.token_ids)}))"
        )
    )


def test_sigterm_lets_a_running_reply_finish_and_refuses_new_ones(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    server = started(LiveServer(tmp_path, tiny_model_dir, CHAT_DRAIN_S="60"),
                     users_code("drainer", password=PASSWORD))  # fmt: skip
    try:
        with (
            server.chat_socket("drainer", PASSWORD) as running,
            server.chat_socket("drainer", PASSWORD) as late,
        ):
            # Long enough to outlast the late send's refusal (milliseconds after the
            # signal), short enough that the drain it waits for costs seconds: 400 tokens
            # took 10 s on a loaded 2-core machine.
            send(running, "Tell me a long story", 200)
            frames = frames_until(running, "delta", timeout=120)
            assert server.proc is not None
            server.proc.send_signal(signal.SIGTERM)
            send(late, "Hello?", 4)
            refused = frames_until(late, "error", "done", timeout=120)[-1]
            assert refused["type"] == "error" and refused["code"] == "draining", refused
            frames += frames_until(running, "done", timeout=120)
        done = frames[-1]
        assert done["status"] == "complete", done
        assert server.proc.wait(timeout=60) == 0
        streamed = "".join(f["text"] for f in frames if f["type"] == "delta")
        saved = stored_reply(server, done["message_id"])
        assert saved["status"] == "complete" and saved["text"] == streamed
    finally:
        server.stop()


def test_a_reply_past_the_drain_deadline_is_saved_and_marked_cut(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    server = started(LiveServer(tmp_path, tiny_model_dir, CHAT_DRAIN_S="0.5"),
                     users_code("drainer", password=PASSWORD))  # fmt: skip
    try:
        with server.chat_socket("drainer", PASSWORD) as sock:
            send(sock, "Tell me a very long story", 2048)
            frames = frames_until(sock, "delta", timeout=120)
            message_id = frames[-1]["message_id"]
            assert server.proc is not None
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(timeout=60) == 0
        streamed = "".join(f["text"] for f in frames if f["type"] == "delta")
        saved = stored_reply(server, message_id)
        assert saved["status"] == "stopped" and saved["finish_reason"] == "shutdown", saved
        assert saved["text"].startswith(streamed) and saved["tokens"] > 0
    finally:
        server.stop()
