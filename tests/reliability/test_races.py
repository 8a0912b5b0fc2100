"""Requests that race each other against a real server (daphne, a file database, real
sockets from several threads released together): limits hold, and what one request
deleted or renamed stays deleted or renamed whatever another was doing meanwhile."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client

from tests.servers import started, users_code
from tools.live_server import LiveServer

PASSWORD = "a-long-test-password-1"
LONG = {"max_tokens": 1500, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LiveServer]:
    srv = LiveServer(tmp_path_factory.mktemp("races"), tiny_model_dir)
    started(srv, users_code("alice", "bob", "carol", password=PASSWORD))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def model_id(tiny_model_dir: Path) -> str:
    return tiny_model_dir.name


class Browser:
    """One logged-in browser: an HTTP session (CSRF included) and its sockets."""

    def __init__(self, server: LiveServer, username: str) -> None:
        self.server = server
        self.http = server.login(username, PASSWORD)
        self.http.headers["X-CSRFToken"] = self.http.cookies["csrftoken"]
        self.http.headers["Referer"] = server.url + "/"

    def socket(self) -> Any:
        cookie = "; ".join(f"{k}={v}" for k, v in self.http.cookies.items())
        url = self.server.url.replace("http://", "ws://") + "/ws/chat/"
        return ws_client.connect(
            url, additional_headers={"Cookie": cookie, "Origin": self.server.url}
        )

    def close(self) -> None:
        self.http.close()


def answer(sock: Any) -> dict[str, Any]:
    """The frame that says whether a send was taken: `start` or an `error`."""
    while True:
        frame = json.loads(sock.recv(timeout=30))
        if frame["type"] in ("start", "error"):
            return frame


def until_done(sock: Any) -> dict[str, Any]:
    while True:
        frame = json.loads(sock.recv(timeout=60))
        if frame["type"] == "done":
            return frame


def all_at_once(*actions: Callable[[], Any]) -> list[Any]:
    """Run the actions in threads released together by a barrier."""
    barrier = threading.Barrier(len(actions))

    def run(action: Callable[[], Any]) -> Any:
        barrier.wait()
        return action()

    with ThreadPoolExecutor(len(actions)) as pool:
        return list(pool.map(run, actions))


def send_frame(conv_id: int | None, text: str, sampling: dict[str, Any]) -> str:
    return json.dumps(
        {"type": "send", "conversation_id": conv_id, "text": text, "settings": sampling}
    )


def test_eight_sockets_sending_at_once_get_no_more_streams_than_the_cap(server: LiveServer) -> None:
    alice = Browser(server, "alice")
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(alice.socket()) for _ in range(8)]
        answers = all_at_once(
            *(
                lambda s=s, i=i: (s.send(send_frame(None, f"Hi {i}", LONG)), answer(s))[1]
                for i, s in enumerate(socks)
            )
        )
        started = [(s, a) for s, a in zip(socks, answers, strict=True) if a["type"] == "start"]
        assert len(started) == 4, [a.get("code", a["type"]) for a in answers]
        assert {a["code"] for a in answers if a["type"] == "error"} == {"rate_limited"}
        for sock, start in started:
            sock.send(json.dumps({"type": "stop", "message_id": start["message"]["id"]}))
            assert until_done(sock)["status"] == "stopped"
    alice.close()


def test_three_sends_into_one_conversation_at_once_start_one_reply(server: LiveServer) -> None:
    bob = Browser(server, "bob")
    conv_id = bob.http.post("/api/conversations/", json={"title": "Race"}).json()["id"]
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(bob.socket()) for _ in range(3)]
        answers = all_at_once(
            *(lambda s=s: (s.send(send_frame(conv_id, "Go", LONG)), answer(s))[1] for s in socks)
        )
        started = [(s, a) for s, a in zip(socks, answers, strict=True) if a["type"] == "start"]
        assert len(started) == 1, [a.get("code", a["type"]) for a in answers]
        sock, start = started[0]
        sock.send(json.dumps({"type": "stop", "message_id": start["message"]["id"]}))
        until_done(sock)
        messages = bob.http.get(f"/api/conversations/{conv_id}/").json()["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert messages[0]["alternatives"] == [messages[0]["id"]]  # no sibling branches
    bob.close()


def test_api_requests_at_once_get_no_more_streams_than_the_key_allows(
    server: LiveServer, model_id: str
) -> None:
    key = server.python(
        "from django.contrib.auth import get_user_model as g; "
        "from chatapp.openai_api.keys import create_key; "
        "k, raw = create_key(g().objects.get(username='carol'), 'race'); "
        "type(k).objects.filter(pk=k.pk).update(max_concurrent=2); print(raw)"
    )
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": model_id, "prompt": "go", "max_tokens": 120, "temperature": 0}

    def complete() -> int:
        return httpx.post(
            server.url + "/v1/completions", json=body, headers=headers, timeout=60
        ).status_code

    codes = all_at_once(*([complete] * 6))
    assert sorted(codes) == [200, 200, 429, 429, 429, 429], codes
    assert complete() == 200  # every slot came back


SHORT = {"max_tokens": 8, "temperature": 0}


def send_and_finish(sock: Any, conv_id: int) -> dict[str, Any]:
    """Send into `conv_id`; its `done` frame, or the error that refused it."""
    sock.send(send_frame(conv_id, "Hello", SHORT))
    first = answer(sock)
    return until_done(sock) if first["type"] == "start" else first


@pytest.mark.parametrize("delay_ms", [0, 0.5, 1, 2])
def test_a_conversation_deleted_while_a_send_into_it_starts_stays_deleted(
    server: LiveServer, delay_ms: float
) -> None:
    alice = Browser(server, "alice")

    def delete(conv_id: int) -> int:
        time.sleep(delay_ms / 1000)
        return alice.http.delete(f"/api/conversations/{conv_id}/").status_code

    try:
        with alice.socket() as sock:
            for _ in range(3):
                conv_id = alice.http.post("/api/conversations/", json={"settings": SHORT}).json()[
                    "id"
                ]
                outcome, status = all_at_once(
                    partial(send_and_finish, sock, conv_id), partial(delete, conv_id)
                )
                assert status == 204
                assert outcome["type"] == "done" or outcome["code"] == "not_found", outcome
                assert alice.http.get(f"/api/conversations/{conv_id}/").status_code == 404
                listed = alice.http.get("/api/conversations/").json()["conversations"]
                assert conv_id not in [c["id"] for c in listed]
    finally:
        alice.close()


@pytest.mark.parametrize("delay_ms", [0, 0.5, 1, 2])
def test_a_rename_made_while_a_send_starts_is_kept(server: LiveServer, delay_ms: float) -> None:
    bob = Browser(server, "bob")

    def rename(conv_id: int, fields: dict[str, Any]) -> int:
        time.sleep(delay_ms / 1000)
        return bob.http.patch(f"/api/conversations/{conv_id}/", json=fields).status_code

    try:
        with bob.socket() as sock:
            for attempt in range(3):
                conv_id = bob.http.post(
                    "/api/conversations/", json={"title": "Old", "settings": SHORT}
                ).json()["id"]
                fields = {"title": f"New {attempt}", "settings": {"system_prompt": "Be brief."}}
                done, status = all_at_once(
                    partial(send_and_finish, sock, conv_id), partial(rename, conv_id, fields)
                )
                assert status == 200 and done["type"] == "done", done
                stored = bob.http.get(f"/api/conversations/{conv_id}/").json()
                assert stored["conversation"]["title"] == fields["title"]
                assert stored["conversation"]["settings"]["system_prompt"] == "Be brief."
                # ...and the rename did not hide the new reply either.
                assert stored["messages"][-1]["id"] == done["message_id"]
    finally:
        bob.close()
