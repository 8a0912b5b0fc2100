"""A real server process (daphne) of this app on the tiny model, with a user and an API
key, and the helpers the API and backend tests drive it with. The conftests of
tests/openai_api and tests/backends offer its fixtures: one server for each of those
packages (a start costs seconds: Django, the engine, a user made by `manage.py`), and an
API key of its own for each module, so that no module meets another's per-key limits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.live_server import LiveServer

PASSWORD = "a-long-test-password-1"


def users_code(*usernames: str, password: str = PASSWORD) -> str:
    """ORM code for LiveServer.python that makes these users (LiveServer.make_user's, for
    several at once and for `started`)."""
    return (
        "from django.contrib.auth import get_user_model as g; "
        f"[g().objects.create_user(n, password={password!r}) for n in {usernames!r}]"
    )


def started(server: LiveServer, *setup: str) -> LiveServer:
    """`server` started, with each of `setup` (ORM code for LiveServer.python: its users,
    say) run against its database while it starts: a `manage.py` call costs a second of
    Django start-up, which the server's own start-up no longer waits for. Stopped again if
    either fails."""
    server.migrate()
    try:
        with ThreadPoolExecutor(1) as pool:
            up = pool.submit(server.start)
            try:
                for code in setup:
                    server.python(code)
            finally:
                up.result()
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LiveServer]:
    srv = started(LiveServer(tmp_path_factory.mktemp("api-server"), tiny_model_dir),
                  users_code("apiuser"))  # fmt: skip
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_key(server: LiveServer) -> str:
    return server.make_key("apiuser")


@pytest.fixture(scope="module")
def model_id(tiny_model_dir: Path) -> str:
    return tiny_model_dir.name


def logged_in(server: LiveServer, username: str = "apiuser") -> httpx.Client:
    return server.login(username, PASSWORD)


def engine_stats(server: LiveServer) -> dict[str, Any]:
    c = logged_in(server)
    try:
        return c.get("/api/engine/").json()["stats"]
    finally:
        c.close()


def chat_through_the_socket(front: LiveServer, max_tokens: int) -> dict[str, Any]:
    """One chat-UI turn over the WebSocket ("Hi there", greedy): checks that it streamed,
    completed and was saved as streamed; returns the `done` frame."""
    session = logged_in(front)
    frames = []
    with front.chat_socket("apiuser", PASSWORD) as sock:
        settings = {"max_tokens": max_tokens, "temperature": 0}
        sock.send(json.dumps({"type": "send", "conversation_id": None, "text": "Hi there",
                              "settings": settings}))  # fmt: skip
        while True:
            frame = json.loads(sock.recv(timeout=60))
            frames.append(frame)
            if frame["type"] in ("done", "error"):
                break
    done = frames[-1]
    assert done["type"] == "done" and done["status"] == "complete", frames
    assert [f["type"] for f in frames[:2]] == ["conversation", "start"]
    text = "".join(f["text"] for f in frames if f["type"] == "delta")
    assert text and done["message"]["text"] == text
    conv_id = frames[0]["conversation"]["id"]
    saved = session.get(f"/api/conversations/{conv_id}/").json()["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant"] and saved[1]["text"] == text
    session.close()
    return done


def frames_until(sock: Any, *types: str, timeout: float = 60) -> list[dict[str, Any]]:
    """The chat socket's frames up to and including the first of one of `types`."""
    frames = []
    while True:
        frame = json.loads(sock.recv(timeout=timeout))
        frames.append(frame)
        if frame["type"] in types:
            return frames
