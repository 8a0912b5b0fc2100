"""Two web replicas (real daphne processes) on one Redis channel layer and one PostgreSQL,
as behind compose's proxy: a reply started through one is resumed and stopped through
the other, the rate limits count across both, and each labels its /metrics."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.test_compose_configuration import REDIS_URL, postgres_url  # noqa: F401
from tests.servers import PASSWORD, frames_until
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow

RATE_LIMIT = 5


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,
    postgres_url: str,  # noqa: F811
) -> Iterator[tuple[LiveServer, LiveServer]]:
    shared = {
        "DATABASE_URL": postgres_url,
        "CHANNEL_LAYER": "redis",
        "REDIS_URL": REDIS_URL,
        "CHANNEL_LAYER_PREFIX": f"test-replicas-{uuid.uuid4().hex[:8]}",
        "CHAT_DISCONNECT_GRACE_S": "30",
        "CHAT_RATE_LIMIT_PER_MINUTE": str(RATE_LIMIT),
        "CHAT_MAX_CONCURRENT_STREAMS": "1",
    }
    servers: list[LiveServer] = []
    for name in ("web-a", "web-b"):
        server = LiveServer(tmp_path_factory.mktemp(name), tiny_model_dir, METRICS_REPLICA=name)
        server.env.update(shared)
        servers.append(server)
    try:
        # One migrates the shared database, then both start side by side (each start is
        # seconds of Django and engine loading) while the user is made.
        servers[0].migrate()
        servers[1].migrated = True
        with ThreadPoolExecutor(2) as pool:
            started = [pool.submit(srv.start) for srv in servers]
            servers[0].make_user("apiuser", PASSWORD)
            for future in started:
                future.result()
        yield servers[0], servers[1]
    finally:
        for srv in servers:
            srv.stop()


def send(sock: Any, text: str, max_tokens: int) -> None:
    settings = {"max_tokens": max_tokens, "temperature": 0}
    sock.send(json.dumps({"type": "send", "conversation_id": None, "text": text,
                          "settings": settings}))  # fmt: skip


def start_long_reply(server: LiveServer, max_tokens: int = 1500) -> int:
    """A long reply started through `server`, its socket closed once it streams."""
    with server.chat_socket("apiuser", PASSWORD) as sock:
        send(sock, "Long story", max_tokens)
        frames = frames_until(sock, "delta", "error")
        assert frames[-1]["type"] == "delta", frames
        return int(next(f for f in frames if f["type"] == "start")["message"]["id"])


def test_a_reply_started_on_one_replica_resumes_on_the_other(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    a, b = replicas
    # Long enough to be mid-reply when the other replica resumes it (asserted below), and
    # short enough that waiting for its end costs seconds, not a minute.
    message_id = start_long_reply(a, max_tokens=600)
    with b.chat_socket("apiuser", PASSWORD) as again:
        again.send(json.dumps({"type": "resume", "message_id": message_id}))
        after = frames_until(again, "done", "error", timeout=120)
    snapshot, done = after[0], after[-1]
    assert snapshot["type"] == "snapshot" and snapshot["message"]["status"] == "streaming"
    assert done["type"] == "done" and done["status"] == "complete", done
    since = snapshot["message"]["seq"]
    assert since > 0, "it resumed mid-reply"
    tail = "".join(f["text"] for f in after if f["type"] == "delta" and f["seq"] > since)
    assert tail, "the rest streamed through the other replica"
    assert done["message"]["text"] == snapshot["message"]["text"] + tail
    session = b.login("apiuser", PASSWORD)
    saved = session.get(f"/api/conversations/{done['message']['conversation_id']}/").json()
    session.close()
    assert saved["messages"][-1]["text"] == done["message"]["text"]


def test_a_reply_started_on_one_replica_stops_from_the_other(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    a, b = replicas
    message_id = start_long_reply(a)
    with b.chat_socket("apiuser", PASSWORD) as sock:
        sock.send(json.dumps({"type": "resume", "message_id": message_id}))
        assert frames_until(sock, "snapshot")[-1]["message"]["status"] == "streaming"
        sock.send(json.dumps({"type": "stop", "message_id": message_id}))
        done = frames_until(sock, "done", "error", timeout=60)[-1]
    assert done["type"] == "done" and done["status"] == "stopped", done
    assert done["finish_reason"] == "abort"


def test_the_message_rate_limit_counts_across_replicas(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    """Messages sent by turns through both replicas: the one past the limit is refused,
    though neither replica alone saw more than half of them. The limit's window is fixed to
    the clock, and one that turns mid-run resets the count: a second user tries again."""
    a, b = replicas
    refused_at = []
    for attempt in range(2):
        user = f"limited{attempt}"
        a.make_user(user, PASSWORD)
        with a.chat_socket(user, PASSWORD) as on_a, b.chat_socket(user, PASSWORD) as on_b:
            for n in range(RATE_LIMIT * 2):
                sock = (on_a, on_b)[n % 2]
                send(sock, "Hi", 1)
                last = frames_until(sock, "done", "error")[-1]
                if last["type"] == "error":
                    assert last["code"] == "rate_limited", last
                    refused_at.append(n)
                    break
        if refused_at and refused_at[-1] == RATE_LIMIT:
            return
    pytest.fail(f"refused at message {refused_at} (0-based), not at {RATE_LIMIT}")


def test_the_concurrent_stream_limits_hold_across_replicas(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    """One reply at a time for the user (CHAT_MAX_CONCURRENT_STREAMS=1) and per
    conversation, whichever replica the second asks through; the slot is free again once
    the reply ends."""
    a, b = replicas
    a.make_user("concurrent", PASSWORD)
    with (
        a.chat_socket("concurrent", PASSWORD) as on_a,
        b.chat_socket("concurrent", PASSWORD) as on_b,
    ):
        send(on_a, "Long story", 1500)
        started = frames_until(on_a, "delta", "error")
        assert started[-1]["type"] == "delta", started
        conv_id = next(f for f in started if f["type"] == "start")["conversation_id"]
        message_id = started[-1]["message_id"]
        on_b.send(json.dumps({"type": "send", "conversation_id": conv_id, "text": "And?"}))
        assert frames_until(on_b, "error")[-1]["code"] == "already_streaming"
        send(on_b, "Another", 4)
        refused = frames_until(on_b, "error")[-1]
        assert refused["code"] == "rate_limited" and "1 replies" in refused["message"], refused
        on_b.send(json.dumps({"type": "stop", "message_id": message_id}))
        assert frames_until(on_a, "done")[-1]["status"] == "stopped"
        send(on_b, "Another", 4)
        assert frames_until(on_b, "done", "error")[-1]["type"] == "done"


def test_an_api_keys_concurrency_cap_holds_across_replicas(
    replicas: tuple[LiveServer, LiveServer], tiny_model_dir: Path
) -> None:
    a, b = replicas
    key = a.make_key("apiuser", max_concurrent=1)
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": tiny_model_dir.name, "prompt": "go", "max_tokens": 1500, "stream": True,
            "temperature": 0}  # fmt: skip
    with httpx.stream(
        "POST", a.url + "/v1/completions", json=body, headers=headers, timeout=60
    ) as first:
        assert first.status_code == 200
        lines = first.iter_lines()  # kept: a dropped iterator closes the connection
        next(lines)
        second = httpx.post(
            b.url + "/v1/completions", json={**body, "stream": False}, headers=headers
        )
        assert second.status_code == 429, second.text
    # The first one's slot is given back when it ends (its client went away).
    deadline = time.monotonic() + 10
    while True:
        third = httpx.post(
            b.url + "/v1/completions",
            json={**body, "stream": False, "max_tokens": 2},
            headers=headers,
            timeout=60,
        )
        if third.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert third.status_code == 200, third.text


def test_each_replica_labels_its_metrics(replicas: tuple[LiveServer, LiveServer]) -> None:
    for server, name in zip(replicas, ("web-a", "web-b"), strict=True):
        server.make_user(f"staff-{name}", PASSWORD, staff=True)
        session = server.login(f"staff-{name}", PASSWORD)
        body = session.get("/metrics").text
        session.close()
        series = [line for line in body.splitlines() if line and not line.startswith("#")]
        assert series and all(f'replica="{name}"' in line for line in series), series[:3]
