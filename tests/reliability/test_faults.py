"""Faults a real deployment meets, each against a real server process (daphne) with a
file database: the database locked by someone else, Redis (the rate-limit cache) going
away and coming back. The user sees a clear message; nothing half-written is left."""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import PASSWORD, started, users_code
from tools.live_server import LiveServer, free_port


def connect(server: LiveServer) -> Any:
    return server.chat_socket("apiuser", PASSWORD)


def exchange(sock: Any, text: str) -> list[dict]:
    sock.send(
        json.dumps(
            {"type": "send", "conversation_id": None, "text": text, "settings": {"max_tokens": 6}}
        )
    )
    frames: list[dict[str, Any]] = []
    while True:
        frame = json.loads(sock.recv(timeout=60))
        frames.append(frame)
        if frame["type"] == "done" or (frame["type"] == "error" and "message_id" not in frame):
            return frames


def chat_once(server: LiveServer, text: str) -> list[dict]:
    with connect(server) as sock:
        return exchange(sock, text)


def counts(db: Path) -> tuple[int, int]:
    with sqlite3.connect(db) as con:
        return (
            con.execute("select count(*) from chatapp_conversation").fetchone()[0],
            con.execute("select count(*) from chatapp_message").fetchone()[0],
        )


@pytest.fixture
def server(tmp_path: Path, tiny_model_dir: Path) -> Iterator[LiveServer]:
    srv = started(LiveServer(tmp_path, tiny_model_dir, SQLITE_BUSY_TIMEOUT_S="0.5"),
                  users_code("apiuser"))  # fmt: skip
    yield srv
    srv.stop()


def test_a_locked_database_gives_a_clear_error_and_leaves_nothing_half_written(
    server: LiveServer, tmp_path: Path
) -> None:
    db = tmp_path / "db.sqlite3"
    assert chat_once(server, "Before the lock")[-1]["status"] == "complete"
    before = counts(db)
    with connect(server) as sock:
        locker = sqlite3.connect(db, isolation_level=None, timeout=5)
        locker.execute("BEGIN EXCLUSIVE")  # another process holds the database
        try:
            frames = exchange(sock, "During the lock")
            page = httpx.get(server.url + "/accounts/login/")
            assert page.status_code in (200, 503)  # a clear page either way, never a 500
            api = logged_out_api(server)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
    assert api in (401, 503)
    error = frames[-1]
    assert error["type"] == "error" and error["code"] == "unavailable", frames
    assert "not sent" in error["message"]
    assert counts(db) == before, "no conversation or message may be half-written"
    assert chat_once(server, "After the lock")[-1]["status"] == "complete"
    assert counts(db) == (before[0] + 1, before[1] + 2)


def redis_server(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def logged_out_api(server: LiveServer) -> int:
    return httpx.get(server.url + "/api/conversations/").status_code


def test_chat_keeps_working_while_redis_is_away_and_after_it_returns(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    port = free_port()
    redis = redis_server(port, tmp_path)
    srv = LiveServer(tmp_path, tiny_model_dir, CACHE_URL=f"redis://127.0.0.1:{port}/0")
    try:
        started(srv, users_code("apiuser"))
        assert chat_once(srv, "Redis is up")[-1]["status"] == "complete"
        redis.terminate()
        redis.wait(timeout=10)
        assert chat_once(srv, "Redis is gone")[-1]["status"] == "complete"
        assert "rate-limit counters unavailable" in srv.log.read_text()
        redis = redis_server(port, tmp_path)
        assert chat_once(srv, "Redis is back")[-1]["status"] == "complete"
    finally:
        srv.stop()
        redis.terminate()


def test_server_keeps_serving_other_sockets_when_one_floods_garbage(server: LiveServer) -> None:
    stop = threading.Event()

    def flood() -> None:
        with connect(server) as s:
            while not stop.is_set():
                s.send("{{{{ not json")
                s.recv(timeout=10)

    flooder = threading.Thread(target=flood)
    flooder.start()
    try:
        assert chat_once(server, "Hello through the noise")[-1]["status"] == "complete"
    finally:
        stop.set()
        flooder.join(timeout=15)
