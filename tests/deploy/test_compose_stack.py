"""The docker compose stack run for real (`make test-compose`, not part of `make test`): the
images built, `up -d`, and then, through the proxy's port as a browser and an API client
reach it: sign up and a long chat over the WebSocket, an API call with a key, an export job
run by the long-queue Celery worker and downloaded through web, and an engine worker
restarted mid-reply. `down -v` at the end, whatever happened; the services' logs go to
test-artifacts/compose-stack.log.

Skipped unless CHATAPP_COMPOSE_TEST=1 (what `make test-compose` sets): it needs docker and
minutes of building."""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client

from tests.servers import frames_until
from tools.live_server import ROOT, free_port

pytestmark = pytest.mark.skipif(
    os.environ.get("CHATAPP_COMPOSE_TEST") != "1",
    reason="the compose stack test runs with `make test-compose` (docker, minutes)",
)

PROJECT = "chatapp-compose-test"
PASSWORD = "a-long-compose-password-1"
UP_TIMEOUT_S = 900.0  # the first start converts the model into the cache volume


def compose_command() -> list[str]:
    """Compose v2 (`docker compose`) where the plugin is installed, else v1 (docker-compose)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("neither `docker compose` nor docker-compose is installed")


class Stack:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(40),
            "CHATAPP_PORT": str(self.port),
            "COMPOSE_PROJECT_NAME": PROJECT,
        }
        self.compose = compose_command()

    def run(self, *args: str, timeout: float = 600) -> str:
        out = subprocess.run(
            [*self.compose, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)}: {out.stdout}\n{out.stderr}")
        return out.stdout

    def health(self, engine: bool = True) -> tuple[int, dict[str, Any]]:
        """The status and JSON body of /healthz through the proxy (the proxy's own 502
        page, with no JSON, while web is not up yet)."""
        url = self.url + "/healthz" + ("?engine=1" if engine else "")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                status, raw = answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except OSError as exc:
            return 0, {"error": str(exc)}
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, {"body": raw[:200].decode(errors="replace")}

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Until /healthz?engine=1 answers 200 through the proxy: the database, the layer
        and an engine worker with its model loaded."""
        deadline = time.monotonic() + timeout
        status: int = 0
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status, body = self.health()
            if status == 200:
                return body
            time.sleep(2)
        raise AssertionError(f"not ready in {timeout:.0f} s: {status} {body}\n{self.ps()}")

    def ps(self) -> str:
        return self.run("ps", timeout=60)

    def client(self) -> httpx.Client:
        """An HTTP session with the proxy. The session and CSRF cookies are Secure
        (production settings); browsers send them to http://127.0.0.1 and localhost (a
        secure context), httpx's cookie jar does not over plain HTTP, so this client sends
        every cookie it holds, as a browser would here."""
        c = httpx.Client(base_url=self.url, follow_redirects=False, timeout=60)

        def send_cookies(request: httpx.Request) -> None:
            if c.cookies:
                request.headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in c.cookies.items())

        c.event_hooks["request"] = [send_cookies]
        return c

    def sign_up(self, username: str) -> httpx.Client:
        c = self.client()
        assert c.get("/accounts/signup/").status_code == 200
        answer = c.post(
            "/accounts/signup/",
            data={"username": username, "password1": PASSWORD, "password2": PASSWORD,
                  "csrfmiddlewaretoken": c.cookies["csrftoken"]},
            headers={"Referer": self.url + "/accounts/signup/"},
        )  # fmt: skip
        assert answer.status_code == 302, answer.text[:500]
        assert c.get("/api/conversations/").status_code == 200
        return c

    def chat_socket(self, session: httpx.Client) -> Any:
        cookie = "; ".join(f"{k}={v}" for k, v in session.cookies.items())
        return ws_client.connect(
            self.url.replace("http://", "ws://") + "/ws/chat/",
            additional_headers={"Cookie": cookie, "Origin": self.url},
        )


def post_json(c: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    return c.post(path, json=body, headers={"X-CSRFToken": c.cookies["csrftoken"]})


def send(sock: Any, text: str, max_tokens: int) -> None:
    sock.send(json.dumps({"type": "send", "conversation_id": None, "text": text,
                          "settings": {"max_tokens": max_tokens, "temperature": 0}}))  # fmt: skip


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = Stack()
    s.run("down", "-v", "--remove-orphans", timeout=300)  # a run killed before its own down
    started = time.monotonic()
    s.run("build", timeout=1800)
    print(f"\ncompose build: {time.monotonic() - started:.0f} s")
    started = time.monotonic()
    try:
        s.run("up", "-d", timeout=600)
        s.wait_ready(UP_TIMEOUT_S)
        print(f"compose up to ready: {time.monotonic() - started:.0f} s")
        yield s
    finally:
        logs = subprocess.run(
            [*s.compose, "logs", "--no-color", "--timestamps"],
            cwd=ROOT, env=s.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        artifacts = ROOT / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "compose-stack.log").write_text(logs.stdout + logs.stderr)
        s.run("down", "-v", "--remove-orphans", timeout=300)


def test_health_names_every_dependency_ok(stack: Stack) -> None:
    status, body = stack.health()
    assert status == 200 and body["status"] == "ok", body
    states = {name: check["state"] for name, check in body["checks"].items()}
    expected = ("database", "channel_layer", "broker", "engine", "kv_tier")
    assert states == dict.fromkeys(expected, "ok"), body


def test_sign_up_and_a_long_chat_over_the_socket(stack: Stack) -> None:
    """Replies streamed over one socket for more than 10 s, each saved as streamed. A
    reply is at most 2,048 tokens (the chat's cap), which the tiny model may write in
    under 10 s: the conversation then goes on, on the same socket, until it has."""
    session = stack.sign_up("composer")
    conv_id = None
    replies: list[tuple[str, float]] = []
    with stack.chat_socket(session) as sock:
        started = time.monotonic()
        while time.monotonic() - started <= 10 and len(replies) < 5:
            text = "Tell me a long story about a lighthouse keeper." if not replies else "Go on."
            sock.send(json.dumps({"type": "send", "conversation_id": conv_id, "text": text,
                                  "settings": {"max_tokens": 2048, "temperature": 0}}))  # fmt: skip
            turn = time.monotonic()
            frames = frames_until(sock, "done", "error", timeout=120)
            done = frames[-1]
            assert done["type"] == "done" and done["status"] == "complete", done
            conv_id = conv_id or frames[0]["conversation"]["id"]
            streamed = "".join(f["text"] for f in frames if f["type"] == "delta")
            replies.append((streamed, time.monotonic() - turn))
        took = time.monotonic() - started
    print(f"\nchat: {[f'{len(t)} chars in {s:.1f} s' for t, s in replies]}, {took:.1f} s in all")
    assert took > 10, f"the socket streamed for {took:.1f} s only"
    saved = session.get(f"/api/conversations/{conv_id}/").json()["messages"]
    assert [m["text"] for m in saved if m["role"] == "assistant"] == [t for t, _ in replies]
    session.close()


def test_an_api_call_with_a_key(stack: Stack) -> None:
    session = stack.sign_up("keyholder")
    made = post_json(session, "/api/keys/", {"name": "compose"})
    assert made.status_code == 201, made.text
    key = made.json()["secret"]
    session.close()
    api = httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    models = api.get("/v1/models")
    assert models.status_code == 200, models.text
    model = models.json()["data"][0]["id"]
    answer = api.post(
        "/v1/chat/completions",
        json={"model": model, "max_tokens": 16, "temperature": 0,
              "messages": [{"role": "user", "content": "Say hello."}]},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    assert api.get("/v1/models", headers={"Authorization": "Bearer sk-wrong"}).status_code == 401
    api.close()


def test_an_export_runs_on_the_celery_worker_and_downloads_through_web(stack: Stack) -> None:
    session = stack.sign_up("exporter")
    with stack.chat_socket(session) as sock:
        send(sock, "Name three colours.", 24)
        assert frames_until(sock, "done", "error")[-1]["type"] == "done"
    queued = post_json(session, "/api/exports/", {"format": "json"})
    assert queued.status_code == 202, queued.text
    job = queued.json()
    deadline = time.monotonic() + 120
    while job["status"] != "done" and time.monotonic() < deadline:
        assert job["status"] in ("queued", "running"), job
        time.sleep(1)
        job = next(
            j for j in session.get("/api/exports/").json()["exports"] if j["id"] == job["id"]
        )
    assert job["status"] == "done", f"the export stayed {job['status']}"
    download = session.get(job["download"])
    assert download.status_code == 200, download.status_code
    with zipfile.ZipFile(io.BytesIO(download.content)) as archive:
        exported = archive.read("conversations.json").decode()
    assert "Name three colours." in exported
    session.close()


def test_an_engine_worker_restarted_mid_reply(stack: Stack) -> None:
    """The reply running when the worker gets SIGTERM ends with a clear error or completes
    (it finishes its replies up to the grace period); the next turn, once a worker is
    back, works."""
    session = stack.sign_up("restarter")
    with stack.chat_socket(session) as sock:
        send(sock, "Tell me a very long story about the sea.", 2048)
        frames = frames_until(sock, "delta", "error", timeout=120)
        assert frames[-1]["type"] == "delta", frames
        restart = subprocess.Popen(
            [*stack.compose, "restart", "engine"], cwd=ROOT, env=stack.env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        end = frames_until(sock, "done", "error", timeout=120)[-1]
        assert restart.wait(timeout=180) == 0, restart.stdout.read() if restart.stdout else ""
        if end["type"] == "error":
            assert end.get("code") and end.get("message"), end
        else:
            assert end["status"] in ("complete", "stopped"), end
        print(f"\nthe reply across the restart: {end}")
    stack.wait_ready(300)
    with stack.chat_socket(session) as sock:
        send(sock, "Hello again.", 24)
        after = frames_until(sock, "done", "error", timeout=120)[-1]
    assert after["type"] == "done" and after["status"] == "complete", after
    session.close()
