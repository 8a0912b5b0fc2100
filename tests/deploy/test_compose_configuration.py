"""The chat as docker compose deploys it: real server processes on the Redis channel layer
and PostgreSQL (docker-compose.yml's CHANNEL_LAYER=redis and DATABASE_URL), not the
in-memory layer and SQLite of `make run`. The chat, reconnect and resume paths once more,
and sockets held open well past the layer's blocking read (which closed every chat socket
with 1011 after 5 s when the Redis client's read timeout equalled it)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.servers import (
    PASSWORD,
    chat_through_the_socket,
    frames_until,
    logged_in,
    started,
    users_code,
)
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow

PG_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/9"
# Twice the layer's blocking read (channels_redis' brpop_timeout, 5 s) and a second: the
# sockets were closed when a read timed out, so the first timeout shows that, the second
# that a later one does not either.
HOLD_S = 11.0


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A database of its own on the local PostgreSQL, dropped afterwards."""
    name = f"test_compose_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL does not answer at {PG_ADMIN_URL}: {exc}")
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


@pytest.fixture(scope="module")
def front(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, postgres_url: str
) -> Iterator[LiveServer]:
    srv = LiveServer(
        tmp_path_factory.mktemp("compose-config"),
        tiny_model_dir,
        DATABASE_URL=postgres_url,
        CHANNEL_LAYER="redis",
        REDIS_URL=REDIS_URL,
        CHANNEL_LAYER_PREFIX=f"test-compose-{uuid.uuid4().hex[:8]}",
        CHAT_DISCONNECT_GRACE_S="30",
    )
    started(srv, users_code("apiuser"))
    yield srv
    srv.stop()


def test_the_server_runs_on_the_redis_layer_and_postgresql(front: LiveServer) -> None:
    out = front.python(
        "from django.conf import settings as s; from django.db import connection as c; "
        "print(s.CHANNEL_LAYERS['default']['BACKEND'], c.vendor)"
    )
    assert out == "channels_redis.core.RedisChannelLayer postgresql"


def test_a_chat_turn_streams_and_is_saved(front: LiveServer) -> None:
    done = chat_through_the_socket(front, max_tokens=40)
    assert done["message"]["status"] == "complete"


def test_a_reconnect_resumes_the_reply(front: LiveServer) -> None:
    with front.chat_socket("apiuser", PASSWORD) as sock:
        sock.send(json.dumps({"type": "send", "conversation_id": None, "text": "Long story",
                              "settings": {"max_tokens": 600, "temperature": 0}}))  # fmt: skip
        frames = frames_until(sock, "delta", "error")
        assert frames[-1]["type"] == "delta", frames
        message_id = next(f for f in frames if f["type"] == "start")["message"]["id"]
    with front.chat_socket("apiuser", PASSWORD) as again:
        again.send(json.dumps({"type": "resume", "message_id": message_id}))
        after = frames_until(again, "done", "error", timeout=120)
    snapshot, done = after[0], after[-1]
    assert snapshot["type"] == "snapshot" and snapshot["message"]["id"] == message_id
    # Taken mid-reply: a reply already over when the socket came back resumes nothing.
    assert snapshot["message"]["status"] == "streaming", snapshot
    assert done["type"] == "done" and done["message"]["status"] == "complete", done
    since = snapshot["message"].get("seq", 0)
    tail = "".join(f["text"] for f in after if f["type"] == "delta" and f["seq"] > since)
    assert done["message"]["text"] == snapshot["message"]["text"] + tail
    session = logged_in(front)
    saved = session.get(f"/api/conversations/{done['message']['conversation_id']}/").json()
    session.close()
    assert saved["messages"][-1]["text"] == done["message"]["text"]


def test_sockets_held_idle_and_pinging_past_the_layers_blocking_read_stay_open(
    front: LiveServer,
) -> None:
    """One socket sends nothing for HOLD_S, another pings every second meanwhile; both
    then still answer and chat. The layer's blocking read (5 s) comes and goes twice."""
    errors: list[BaseException] = []
    pongs = 0

    def ping_while_held(sock: Any) -> None:
        nonlocal pongs
        try:
            end = time.monotonic() + HOLD_S
            while time.monotonic() < end:
                sock.send(json.dumps({"type": "ping"}))
                assert json.loads(sock.recv(timeout=10))["type"] == "pong"
                pongs += 1
                time.sleep(1.0)
        except BaseException as exc:  # reported by the test's thread below
            errors.append(exc)

    with (
        front.chat_socket("apiuser", PASSWORD) as idle,
        front.chat_socket("apiuser", PASSWORD) as pinging,
    ):
        pinger = threading.Thread(target=ping_while_held, args=(pinging,))
        pinger.start()
        pinger.join(HOLD_S + 30)
        assert not errors, errors
        assert pongs >= HOLD_S * 0.8
        for sock in (idle, pinging):
            sock.send(json.dumps({"type": "ping"}))
            assert json.loads(sock.recv(timeout=10))["type"] == "pong"
        idle.send(json.dumps({"type": "send", "conversation_id": None, "text": "Still there?",
                              "settings": {"max_tokens": 20, "temperature": 0}}))  # fmt: skip
        frames = frames_until(idle, "done", "error")
        assert frames[-1]["type"] == "done" and frames[-1]["status"] == "complete", frames
    assert "TimeoutError" not in front.log.read_text()
