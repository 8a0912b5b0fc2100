"""Readiness tells the truth (docs/reliability.md, "Readiness"): /healthz names each
dependency with its live state and answers 503 while chat cannot work; the chat socket
refuses with 4503 while the channel layer is away; an export with no broker answering
fails at once instead of staying queued; and all of it recovers, without a restart, once
the dependency is back. Real servers, a real Redis of the test's own (stopped and started
again), real engine workers."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from django.test import Client
from redis import Redis

from inference.client import set_engine_client
from tests.engine_workers import REDIS_URL as WORKERS_REDIS_URL
from tests.engine_workers import Worker
from tests.servers import PASSWORD
from tools.live_server import LiveServer, free_port

pytestmark = pytest.mark.slow


class PrivateRedis:
    """A redis-server of this test's own on a free port, to stop and start at will."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> PrivateRedis:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                Redis(port=self.port, socket_connect_timeout=0.5).ping()
                return self
            except Exception:
                time.sleep(0.1)
        raise RuntimeError("the private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def health(server: LiveServer, query: str = "") -> tuple[int, dict[str, Any]]:
    answer = httpx.get(server.url + "/healthz" + query, timeout=10)
    return answer.status_code, answer.json()


def states(body: dict[str, Any]) -> dict[str, str]:
    return {name: check["state"] for name, check in body["checks"].items()}


def wait_for(probe: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def socket_outcome(server: LiveServer) -> str:
    """ "pong" when the chat socket answers a ping, else how it closed ("closed 4503")."""
    try:
        with server.chat_socket("alice", PASSWORD) as sock:
            sock.send(json.dumps({"type": "ping"}))
            return str(json.loads(sock.recv(timeout=10))["type"])
    except websockets.exceptions.ConnectionClosed as exc:
        return f"closed {exc.rcvd.code if exc.rcvd else None}"
    except websockets.exceptions.InvalidStatus as exc:
        return f"handshake {exc.response.status_code}"


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    redis = PrivateRedis(tmp_path).start()
    yield redis
    redis.stop()


def test_redis_away_makes_health_503_the_socket_4503_and_exports_fail_then_all_recover(
    tmp_path: Path, tiny_model_dir: Path, private_redis: PrivateRedis
) -> None:
    server = LiveServer(
        tmp_path / "web",
        tiny_model_dir,
        CHANNEL_LAYER="redis",
        REDIS_URL=private_redis.url(0),
        CELERY_BROKER_URL=private_redis.url(1),
        CELERY_TASK_ALWAYS_EAGER="false",
        ENGINE_KV_TIER_URL=private_redis.url(4),
    )
    (tmp_path / "web").mkdir()
    server.start()
    try:
        server.make_user("alice", PASSWORD)
        status, body = health(server)
        assert status == 200 and body["status"] == "ok", body
        assert states(body) == {"database": "ok", "channel_layer": "ok", "broker": "ok",
                                "engine": "ok", "kv_tier": "ok"}  # fmt: skip
        assert socket_outcome(server) == "pong"

        private_redis.stop()
        status, body = health(server)
        assert status == 503 and body["status"] == "unavailable", body
        assert states(body) == {"database": "ok", "channel_layer": "down", "broker": "down",
                                "engine": "ok", "kv_tier": "down"}  # fmt: skip
        # Was a 500 at the handshake: now a close code the page explains and retries.
        assert socket_outcome(server) == "closed 4503"
        web = server.login("alice", PASSWORD)
        started = time.monotonic()
        answer = web.post("/api/exports/", json={"format": "md"},
                          headers={"X-CSRFToken": web.cookies["csrftoken"]})  # fmt: skip
        assert answer.status_code == 503 and answer.json()["status"] == "failed", answer.text
        assert time.monotonic() - started < 15
        listed = web.get("/api/exports/").json()["exports"]
        assert [e["status"] for e in listed] == ["failed"]

        private_redis.start()
        assert wait_for(lambda: health(server)[0] == 200), health(server)
        assert set(states(health(server)[1]).values()) == {"ok"}
        assert wait_for(lambda: socket_outcome(server) == "pong"), socket_outcome(server)
        answer = web.post("/api/exports/", json={"format": "md"},
                          headers={"X-CSRFToken": web.cookies["csrftoken"]})  # fmt: skip
        assert answer.status_code == 202 and answer.json()["status"] == "queued", answer.text
        web.close()
    finally:
        server.stop()


def test_distributed_mode_is_ready_only_while_a_worker_serves_the_model(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    namespace = f"test-readiness-{uuid.uuid4().hex[:8]}"
    redis = Redis.from_url(WORKERS_REDIS_URL)
    workers = {
        "ENGINE_WORKERS_REDIS_URL": WORKERS_REDIS_URL,
        "ENGINE_WORKERS_NAMESPACE": namespace,
        "ENGINE_WORKER_DEAD_AFTER_S": "3",
    }
    first = Worker(tmp_path / "w1", tiny_model_dir, namespace, "w1").start()
    second = Worker(tmp_path / "w2", tiny_model_dir, namespace, "w2")
    (tmp_path / "web").mkdir()
    server = LiveServer(tmp_path / "web", tiny_model_dir, ENGINE_MODE="distributed", **workers)
    try:
        server.start()  # answers at once in distributed mode: while the worker loads
        first.wait_registered(redis)
        status, body = health(server, "?engine=1")
        assert status == 200 and body["checks"]["engine"]["state"] == "ok", body

        first.kill()  # no deregistering: its heartbeat lapses
        assert wait_for(lambda: health(server)[0] == 503, timeout=15), health(server)
        body = health(server)[1]
        assert body["checks"]["engine"]["state"] == "down"
        assert "no live engine worker" in body["checks"]["engine"]["detail"]

        second.start().wait_registered(redis)
        assert wait_for(lambda: health(server)[0] == 200), health(server)
    finally:
        server.stop()
        first.stop()
        second.stop()
        for key in redis.scan_iter(match=f"{namespace}:*"):
            redis.delete(key)


class _Upstream(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "up-model", "created": 1, "owned_by": "x"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.django_db
def test_upstream_mode_notices_an_upstream_that_goes_down_after_start(settings: Any) -> None:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{upstream.server_address[1]}/v1"
    settings.ENGINE = {**settings.ENGINE, "MODE": "upstream", "UPSTREAM_URL": url}
    set_engine_client(None)
    try:
        answer = Client().get("/healthz")
        assert answer.status_code == 200, answer.json()
        assert answer.json()["checks"]["engine"]["state"] == "ok"
        upstream.shutdown()
        upstream.server_close()
        answer = Client().get("/healthz")
        assert answer.status_code == 503
        assert answer.json()["checks"]["engine"]["state"] == "down"
    finally:
        set_engine_client(None)
