"""Soak: a distributed deployment under chat and API load, with an engine worker and the web
server killed (SIGKILL) along the way; at the end what the clients saw is checked against
the database.

    python -m tools.soak --duration 1800 --json soak.json     # 32 chat users, 4 API clients
    python -m tools.soak --duration 20 --users 4 --faults worker

It starts, on this machine only (127.0.0.1), a deployment of its own: a fresh PostgreSQL
database (dropped at the end), daphne in ENGINE_MODE=distributed with the Redis channel
layer, and two engine workers (`manage.py run_engine`) in a Redis namespace of their own,
all serving the tiny random llama (tests/tiny_model.py, the bundled tokenizer) unless
--model names a model folder. Then:

- N chat users on the WebSocket hold multi-turn conversations with think times; when the
  socket drops they reconnect with backoff and `resume` the reply they were reading, as
  the chat UI does (docs/websocket.md);
- M API clients call /v1/chat/completions, streamed and not, each with its own key;
- after a third of the run one engine worker is SIGKILLed and a replacement started; after
  two thirds the web server is SIGKILLed and started again on the same database.

The invariants, from the clients' own records against the database:

1. every user message the server acknowledged (a `start` frame) is saved, with its text;
2. every reply's saved text and what its reader was shown are prefixes of one another, the
   saved text covers all the text shown up to --loss-bound-s (1 s) before the fault that
   cut the stream, and a reply that ended normally is saved exactly as it streamed;
3. every accepted request (a `start` frame, an HTTP 200) ended with a completion or a clear
   error (an `error` frame, an HTTP error, an error chunk; an API connection cut by the
   web server's SIGKILL is counted apart, by name): none hung or vanished.

It reports requests, tokens, errors by code, the worst text loss, TTFT p50/p90 before and
after each fault, and the recovery time after each kill: a table on stdout and --json.
Exit status 1 when an invariant failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websockets

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.live_server import DjangoProcess, LiveServer  # noqa: E402
from tools.load import FOLLOW_UPS, QUESTIONS, REFUSED_WAIT_S, pct  # noqa: E402

REDIS = "redis://127.0.0.1:6379"
PG_HOST, PG_PORT, PG_USER = "127.0.0.1", 5432, "postgres"
PASSWORD = "soak-test-password-1"
# No frame for this long while a reply is expected: the request hung.
HANG_S = 120.0
# After the run's end, replies still streaming get this long to finish.
SETTLE_S = 90.0
# An API connection that breaks this soon after the web server's kill was cut by it.
SERVER_KILL_WINDOW_S = 5.0


# --------------------------------------------------------------------------- deployment


class Worker(DjangoProcess):
    """One `manage.py run_engine` (as tests/engine_workers.py starts them)."""

    def __init__(self, workdir: Path, model_dir: Path, worker_id: str, **env: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(workdir, model_dir, ENGINE_WORKER_ID=worker_id, **env)
        self.id = worker_id
        self.log = workdir / f"worker-{worker_id}.log"

    def start(self) -> Worker:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "run_engine"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def wait_registered(self, key: str, timeout: float = 180) -> float:
        from redis import Redis

        assert self.proc is not None
        started = time.monotonic()
        redis = Redis.from_url(REDIS + "/3")
        try:
            while time.monotonic() - started < timeout:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"worker {self.id} exited:\n{self.log.read_text()}")
                if redis.exists(key):
                    return time.monotonic() - started
                time.sleep(0.2)
        finally:
            redis.close()
        raise RuntimeError(f"worker {self.id} did not register:\n{self.log.read_text()}")


def _pg(sql: str) -> None:
    import psycopg

    with psycopg.connect(
        host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(sql.encode())


class Deployment:
    def __init__(self, workdir: Path, model_dir: Path, tag: str) -> None:
        self.workdir = workdir
        self.model_dir = model_dir
        self.namespace = f"soak-{tag}"
        self.database = f"soak_{tag}"
        self.shared = {
            "DATABASE_URL": f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{self.database}",
            "ENGINE_WORKERS_REDIS_URL": REDIS + "/3",
            "ENGINE_WORKERS_NAMESPACE": self.namespace,
            "ENGINE_KV_TIER_URL": REDIS + "/4",
            "ENGINE_KV_TIER_NAMESPACE": f"kv-{self.namespace}",
            "ENGINE_KV_CACHE_MEMORY_MB": "64",
            "ENGINE_NUM_THREADS": "1",
        }
        (workdir / "web").mkdir(parents=True, exist_ok=True)
        self.web = LiveServer(
            workdir / "web",
            model_dir,
            ENGINE_MODE="distributed",
            CHANNEL_LAYER="redis",
            CHANNEL_LAYER_PREFIX=f"asgi-{self.namespace}",
            REDIS_URL=REDIS + "/0",
            **self.shared,
        )
        self.workers: list[Worker] = []
        self.web_starts = 0
        self.db_created = False

    def worker_key(self, worker: Worker) -> str:
        return f"{self.namespace}:worker:{worker.id}"

    def start_worker(self) -> Worker:
        wid = f"w{len(self.workers) + 1}"
        w = Worker(self.workdir / wid, self.model_dir, wid, **self.shared).start()
        self.workers.append(w)
        return w

    def start(self, workers: int) -> None:
        _pg(f'CREATE DATABASE "{self.database}"')
        self.db_created = True
        self.web.manage("migrate", "--noinput", "-v", "0")
        started = [self.start_worker() for _ in range(workers)]
        for w in started:
            w.wait_registered(self.worker_key(w))
        self.start_web()

    def start_web(self) -> float:
        """(Re)start daphne on the same port and database; seconds until /healthz answers."""
        began = time.monotonic()
        self.web_starts += 1
        self.web.log = self.workdir / "web" / f"server-{self.web_starts}.log"
        self.web.start()
        return time.monotonic() - began

    def stop(self) -> None:
        self.web.stop()
        for w in self.workers:
            w.stop()
        from redis import Redis

        for db, pattern in ((3, f"{self.namespace}:*"), (4, f"kv-{self.namespace}:*"),
                            (0, f"asgi-{self.namespace}*")):  # fmt: skip
            r = Redis.from_url(f"{REDIS}/{db}")
            try:
                keys = list(r.scan_iter(pattern, count=1000))
                for i in range(0, len(keys), 500):
                    r.delete(*keys[i : i + 500])
            finally:
                r.close()
        if self.db_created:
            _pg(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            self.db_created = False


# --------------------------------------------------------------------------- records


@dataclass
class Reply:
    """One acknowledged chat request: the `start` frame's ids and what its reader saw."""

    user: str
    conversation_id: int
    user_message_id: int
    user_text: str
    message_id: int
    sent_at: float
    first_at: float | None = None
    view: str = ""  # the text on the reader's screen
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time, len(view))
    cut_at: float | None = None  # the live stream broke (socket closed)
    seen_at_cut: str | None = None
    arrivals_at_cut: list[tuple[float, int]] = field(default_factory=list)
    after_seq: int | None = None  # after a snapshot: apply only later deltas
    resumes: int = 0
    error_code: str | None = None
    status: str | None = None  # the `done` frame's
    finish_reason: str | None = None
    done_text: str | None = None
    ended_at: float | None = None
    end: str | None = None  # "done", "hung", "resume_<code>", "gave_up"
    tokens: int = 0


@dataclass
class ApiCall:
    client: int
    stream: bool
    sent_at: float
    first_at: float | None = None
    ended_at: float | None = None
    outcome: str = ""  # "ok", "http_<status>_<code>", "stream_error_<code>", "cut", "hung"
    accepted: bool = False
    tokens: int = 0
    detail: str = ""  # the last SSE data line of a stream that did not end well


@dataclass
class Soak:
    args: argparse.Namespace
    base: str
    started: float
    deadline: float
    replies: list[Reply] = field(default_factory=list)
    api_calls: list[ApiCall] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)  # errors before anything was saved
    client_events: Counter[str] = field(default_factory=Counter)
    faults: list[dict[str, Any]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    model: str = ""

    def now(self) -> float:
        return time.monotonic()


# --------------------------------------------------------------------------- chat users


async def login_cookie(base: str, username: str) -> str:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        await client.get("/accounts/login/")
        answer = await client.post(
            "/accounts/login/",
            data={"username": username, "password": PASSWORD,
                  "csrfmiddlewaretoken": client.cookies["csrftoken"]},
            headers={"Referer": base + "/accounts/login/"},
        )  # fmt: skip
        if answer.status_code != 302:
            raise RuntimeError(f"login failed for {username}: {answer.status_code}")
        return "; ".join(f"{k}={v}" for k, v in client.cookies.items())


class ChatUser:
    def __init__(self, soak: Soak, name: str) -> None:
        self.soak = soak
        self.name = name
        self.cookie: str | None = None
        self.conversation_id: int | None = None
        self.turn = 0
        self.pending: Reply | None = None

    async def run(self) -> None:
        soak = self.soak
        backoff = 0.5
        hard_stop = soak.deadline + SETTLE_S
        while (soak.now() < soak.deadline or self.pending) and soak.now() < hard_stop:
            try:
                if self.cookie is None:
                    self.cookie = await login_cookie(soak.base, self.name)
                url = soak.base.replace("http", "ws", 1) + "/ws/chat/"
                async with websockets.connect(
                    url,
                    additional_headers={"Cookie": self.cookie, "Origin": soak.base},
                    max_size=2**24,
                    open_timeout=10,
                ) as sock:
                    backoff = 0.5
                    soak.client_events["ws_connected"] += 1
                    await self.session(sock, hard_stop)
                    return
            except Exception as exc:  # a dropped or refused socket: reconnect, as the UI
                soak.client_events[f"ws_{type(exc).__name__}"] += 1
                rcvd = getattr(exc, "rcvd", None)
                if rcvd is not None and rcvd.code == 4401:
                    self.cookie = None  # signed out: log in again
                if self.pending is not None and self.pending.cut_at is None:
                    self.cut(self.pending)
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, 8.0)
        if self.pending is not None:
            self.pending.end = "gave_up"
            self.pending = None

    def cut(self, r: Reply) -> None:
        r.cut_at = self.soak.now()
        r.seen_at_cut = r.view
        r.arrivals_at_cut = list(r.arrivals)

    async def session(self, sock: Any, hard_stop: float) -> None:
        soak = self.soak
        if self.pending is not None:
            self.pending.resumes += 1
            await sock.send(json.dumps({"type": "resume", "message_id": self.pending.message_id}))
            await self.read_reply(sock, self.pending)
        while soak.now() < soak.deadline:
            await asyncio.sleep(random.uniform(soak.args.think_min, soak.args.think_max))
            if soak.now() >= soak.deadline:
                break
            if self.turn % soak.args.turns == 0:
                self.conversation_id, text = None, random.choice(QUESTIONS)
            else:
                text = random.choice(FOLLOW_UPS)
            text = f"{text} ({self.name} turn {self.turn})"
            frame: dict[str, Any] = {
                "type": "send",
                "conversation_id": self.conversation_id,
                "text": text,
            }
            if self.conversation_id is None:
                frame["settings"] = {"max_tokens": soak.args.max_tokens}
            sent = soak.now()
            await sock.send(json.dumps(frame))
            reply = await self.await_start(sock, text, sent)
            if reply is None:
                continue
            await self.read_reply(sock, reply)
            self.turn += 1

    async def await_start(self, sock: Any, text: str, sent: float) -> Reply | None:
        soak = self.soak
        try:
            while True:
                msg = json.loads(await asyncio.wait_for(sock.recv(), timeout=HANG_S))
                kind = msg["type"]
                if kind == "conversation":
                    self.conversation_id = msg["conversation"]["id"]
                elif kind == "start":
                    r = Reply(
                        user=self.name,
                        conversation_id=msg["conversation_id"],
                        user_message_id=msg["user_message"]["id"],
                        user_text=text,
                        message_id=msg["message"]["id"],
                        sent_at=sent,
                    )
                    self.conversation_id = r.conversation_id
                    soak.replies.append(r)
                    self.pending = r
                    return r
                elif kind == "error" and msg.get("message_id") is None:
                    soak.refused[msg["code"]] += 1
                    await asyncio.sleep(REFUSED_WAIT_S)
                    return None
        except TimeoutError:
            soak.client_events["send_unanswered"] += 1
            self.conversation_id = None
            return None
        except BaseException:
            # The socket went before the `start` frame: not acknowledged, so not counted;
            # the next turn opens a new conversation (this one may hold the lost turn).
            soak.client_events["send_unacknowledged"] += 1
            self.conversation_id = None
            raise

    async def read_reply(self, sock: Any, r: Reply) -> None:
        soak = self.soak
        while True:
            try:
                raw = await asyncio.wait_for(sock.recv(), timeout=HANG_S)
            except TimeoutError:
                r.end, r.ended_at = "hung", soak.now()
                self.pending = None
                return
            msg = json.loads(raw)
            kind = msg["type"]
            if msg.get("message_id") not in (None, r.message_id) and kind != "snapshot":
                continue
            if kind == "delta":
                if r.after_seq is not None and msg.get("seq", 0) <= r.after_seq:
                    continue
                now = soak.now()
                if r.first_at is None:
                    r.first_at = now
                r.view += msg["text"]
                r.arrivals.append((now, len(r.view)))
            elif kind == "snapshot":
                m = msg["message"]
                if m["id"] != r.message_id:
                    continue
                r.view = m["text"]
                r.after_seq = m.get("seq")
            elif kind == "error":
                if msg.get("message_id") == r.message_id and msg["code"] == "not_found":
                    r.end, r.ended_at, r.error_code = "resume_not_found", soak.now(), "not_found"
                    self.pending = None
                    return
                r.error_code = msg["code"]
            elif kind == "done":
                r.status, r.finish_reason = msg["status"], msg["finish_reason"]
                r.done_text = (msg.get("message") or {}).get("text")
                r.tokens = int((msg.get("figures") or {}).get("output_tokens") or 0)
                r.end, r.ended_at = "done", soak.now()
                self.pending = None
                return


# --------------------------------------------------------------------------- API clients


async def api_client(soak: Soak, index: int) -> None:
    headers = {"Authorization": f"Bearer {soak.keys[index]}"}
    timeout = httpx.Timeout(HANG_S, connect=5.0)
    backoff = 0.5
    turn = 0
    async with httpx.AsyncClient(base_url=soak.base, headers=headers, timeout=timeout) as http:
        while soak.now() < soak.deadline:
            await asyncio.sleep(random.uniform(soak.args.think_min, soak.args.think_max))
            stream = turn % 2 == 0
            turn += 1
            body = {
                "model": soak.model,
                "messages": [{"role": "user", "content": random.choice(QUESTIONS)}],
                "max_tokens": soak.args.max_tokens,
                "stream": stream,
            }
            call = ApiCall(index, stream, soak.now())
            try:
                if stream:
                    await api_stream(soak, http, body, call)
                else:
                    answer = await http.post("/v1/chat/completions", json=body)
                    call.accepted = True
                    if answer.status_code == 200:
                        data = answer.json()
                        call.first_at = soak.now()
                        call.tokens = int(data.get("usage", {}).get("completion_tokens") or 0)
                        call.outcome = "ok"
                    else:
                        call.outcome = f"http_{answer.status_code}_{_api_code(answer)}"
                backoff = 0.5
            except httpx.ConnectError:
                call.outcome = "connect_refused"  # never reached a server: not accepted
                call.accepted = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 8.0)
            except httpx.TimeoutException:
                call.outcome = "hung"
            except (httpx.TransportError, httpx.StreamError):
                call.outcome = "cut"
            call.ended_at = soak.now()
            if call.outcome == "connect_refused":
                soak.client_events["api_connect_refused"] += 1
            else:
                soak.api_calls.append(call)
            if call.outcome.startswith("http_429"):
                await asyncio.sleep(REFUSED_WAIT_S)


def _api_code(answer: httpx.Response) -> str:
    try:
        err = answer.json().get("error") or {}
        return str(err.get("code") or err.get("type") or "none")
    except Exception:
        return "not_json"


async def api_stream(soak: Soak, http: httpx.AsyncClient, body: dict, call: ApiCall) -> None:
    async with http.stream("POST", "/v1/chat/completions", json=body) as answer:
        call.accepted = True
        if answer.status_code != 200:
            await answer.aread()
            call.outcome = f"http_{answer.status_code}_{_api_code(answer)}"
            return
        finished = False
        async for line in answer.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                if not call.outcome:
                    call.outcome = "ok" if finished else "done_without_finish"
                return
            call.detail = data[:500]
            chunk = json.loads(data)
            if "error" in chunk:
                err = chunk["error"] or {}
                call.outcome = f"stream_error_{err.get('code') or err.get('type')}"
                continue
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    call.first_at = call.first_at or soak.now()
                    call.tokens += 1
                if choice.get("finish_reason"):
                    finished = True
        if not call.outcome:
            call.outcome = "cut"


# --------------------------------------------------------------------------- faults


async def inject_faults(soak: Soak, deployment: Deployment) -> None:
    d = soak.args.duration
    waits: list[asyncio.Task[None]] = []
    plan = [(f, soak.started + d * (i + 1) / 3) for i, f in enumerate(("worker", "server"))]
    for fault, at in plan:
        if fault not in soak.args.faults:
            continue
        await asyncio.sleep(max(0.0, at - soak.now()))
        record: dict[str, Any] = {"fault": fault}
        if fault == "worker":
            victim = deployment.workers[0]
            assert victim.proc is not None
            record["worker"] = victim.id
            record["at"] = soak.now()
            os.kill(victim.proc.pid, signal.SIGKILL)
            await asyncio.to_thread(victim.proc.wait)
            spare = deployment.start_worker()
            record["replacement"] = spare.id
            waits.append(asyncio.create_task(replacement_ready(deployment, spare, record)))
        else:
            proc = deployment.web.proc
            assert proc is not None
            record["at"] = soak.now()
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)
            record["restart_s"] = round(await asyncio.to_thread(deployment.start_web), 1)
        record["at_s"] = round(record["at"] - soak.started, 1)
        soak.faults.append(record)
    await asyncio.gather(*waits)


async def replacement_ready(deployment: Deployment, spare: Worker, record: dict) -> None:
    """A replacement worker loads while the soak goes on; when it registered."""
    waited = await asyncio.to_thread(spare.wait_registered, deployment.worker_key(spare))
    record["replacement_ready_s"] = round(waited, 1)


# --------------------------------------------------------------------------- checks


def saved_messages(deployment: Deployment) -> dict[int, dict[str, Any]]:
    code = (
        "import json; from chatapp.chat.models import Message; "
        "print(json.dumps(list(Message.objects.values("
        "'id', 'role', 'text', 'status', 'finish_reason', 'conversation_id'))))"
    )
    rows = json.loads(deployment.web.python(code).splitlines()[-1])
    return {row["id"]: row for row in rows}


def fault_before(soak: Soak, t: float) -> dict[str, Any] | None:
    """The fault that cut a stream at `t`: the latest one before it (within a minute)."""
    best = None
    for f in soak.faults:
        if f["at"] <= t + 0.5 and t - f["at"] < 60:
            best = f
    return best


def check(soak: Soak, saved: dict[int, dict[str, Any]]) -> dict[str, Any]:
    bound = soak.args.loss_bound_s
    violations: list[dict[str, Any]] = []
    worst: dict[str, Any] = {"seconds": 0.0, "chars": 0, "message_id": None}
    lost_replies = 0
    cut_replies = 0
    ends: Counter[str] = Counter()
    for r in soak.replies:
        um = saved.get(r.user_message_id)
        if um is None or um["role"] != "user" or um["text"] != r.user_text:
            violations.append({"kind": "user_message_not_saved", "id": r.user_message_id,
                               "user": r.user, "saved": um})  # fmt: skip
        row = saved.get(r.message_id)
        end = r.end or "none"
        if end == "done":
            end = f"done_{r.status}_{r.finish_reason}"
            if r.error_code:
                end += f"_{r.error_code}"
        ends[end] += 1
        if r.end != "done":
            violations.append({"kind": "request_without_end", "id": r.message_id,
                               "user": r.user, "end": r.end})  # fmt: skip
        if row is None:
            violations.append({"kind": "reply_not_saved", "id": r.message_id, "user": r.user})
            continue
        text = row["text"]
        if r.done_text is not None and r.done_text != text:
            violations.append({"kind": "done_differs_from_saved", "id": r.message_id,
                               "done": r.done_text, "saved": text})  # fmt: skip
        if r.cut_at is None:
            # One live stream from start to end: saved exactly as shown.
            if r.end == "done" and r.view != text:
                violations.append({"kind": "reply_mismatch", "id": r.message_id,
                                   "shown": r.view, "saved": text})  # fmt: skip
            continue
        cut_replies += 1
        seen = r.seen_at_cut or ""
        if not (seen.startswith(text) or text.startswith(seen)):
            violations.append({"kind": "reply_diverged", "id": r.message_id,
                               "seen": seen, "saved": text})  # fmt: skip
            continue
        if len(text) >= len(seen):
            continue
        lost_replies += 1
        fault = fault_before(soak, r.cut_at)
        cut_time = fault["at"] if fault else r.cut_at
        first_lost = next((t for t, n in r.arrivals_at_cut if n > len(text)), cut_time)
        loss_s = max(0.0, cut_time - first_lost)
        chars = len(seen) - len(text)
        if loss_s > worst["seconds"] or (loss_s == worst["seconds"] and chars > worst["chars"]):
            worst = {"seconds": round(loss_s, 3), "chars": chars, "message_id": r.message_id,
                     "fault": fault["fault"] if fault else None}  # fmt: skip
        if loss_s > bound:
            violations.append({"kind": "text_loss_over_bound", "id": r.message_id,
                               "loss_s": round(loss_s, 3), "chars": chars,
                               "fault": fault["fault"] if fault else None})  # fmt: skip
    server_kills = [f["at"] for f in soak.faults if f["fault"] == "server"]
    api_outcomes: Counter[str] = Counter()
    for c in soak.api_calls:
        outcome = c.outcome
        ended = c.ended_at or c.sent_at
        if outcome == "cut" and any(0 <= ended - k <= SERVER_KILL_WINDOW_S for k in server_kills):
            outcome = "cut_by_server_kill"
        api_outcomes[outcome] += 1
        if outcome in ("cut", "hung", "done_without_finish"):
            violations.append({"kind": f"api_{outcome}", "client": c.client, "stream": c.stream,
                               "at_s": round(c.sent_at - soak.started, 1),
                               "ended_s": round(ended - soak.started, 1),
                               "last_data": c.detail})  # fmt: skip
    streaming_left = sum(
        1 for row in saved.values() if row["status"] == "streaming" and row["role"] == "assistant"
    )
    return {
        "violations": violations,
        "worst_text_loss": worst,
        "replies_cut_by_a_fault": cut_replies,
        "replies_with_text_lost": lost_replies,
        "chat_endings": dict(ends),
        "api_outcomes": dict(api_outcomes),
        "replies_left_streaming_in_db": streaming_left,
    }


# --------------------------------------------------------------------------- report


def phases(soak: Soak) -> list[tuple[str, float, float]]:
    cuts = [f["at"] for f in soak.faults]
    names = ["before faults"] + [f"after {f['fault']} kill" for f in soak.faults]
    bounds = [soak.started, *cuts, float("inf")]
    return [(names[i], bounds[i], bounds[i + 1]) for i in range(len(names))]


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)


def summarize(soak: Soak, checks: dict[str, Any], elapsed: float) -> dict[str, Any]:
    ttft = []
    for name, lo, hi in phases(soak):
        chat = [r.first_at - r.sent_at for r in soak.replies
                if r.first_at and lo <= r.sent_at < hi and r.cut_at is None]  # fmt: skip
        api = [c.first_at - c.sent_at for c in soak.api_calls
               if c.first_at and c.stream and lo <= c.sent_at < hi]  # fmt: skip
        ttft.append({
            "phase": name,
            "chat_n": len(chat),
            "chat_p50_ms": _ms(pct(chat, 50)), "chat_p90_ms": _ms(pct(chat, 90)),
            "api_n": len(api), "api_p50_ms": _ms(pct(api, 50)), "api_p90_ms": _ms(pct(api, 90)),
        })  # fmt: skip
    recovery = []
    for f in soak.faults:
        firsts = [r.first_at for r in soak.replies if r.sent_at >= f["at"] and r.first_at]
        firsts += [c.first_at for c in soak.api_calls if c.sent_at >= f["at"] and c.first_at]
        done = [r.ended_at for r in soak.replies if r.sent_at >= f["at"] and r.ended_at
                and r.status == "complete"]  # fmt: skip
        recovery.append({
            "fault": f["fault"], "at_s": f["at_s"],
            "first_token_after_s": round(min(firsts) - f["at"], 2) if firsts else None,
            "first_complete_reply_after_s": round(min(done) - f["at"], 2) if done else None,
            **{k: v for k, v in f.items() if k in ("worker", "replacement",
                                                   "replacement_ready_s", "restart_s")},
        })  # fmt: skip
    errors: Counter[str] = Counter()
    for r in soak.replies:
        if r.error_code:
            errors[f"chat_{r.error_code}"] += 1
    for code, n in soak.refused.items():
        errors[f"chat_refused_{code}"] += n
    for c in soak.api_calls:
        if c.outcome != "ok":
            errors[f"api_{c.outcome}"] += 1
    chat_tokens = sum(r.tokens for r in soak.replies)
    api_tokens = sum(c.tokens for c in soak.api_calls)
    return {
        "model": soak.args.model_label,
        "users": soak.args.users,
        "api_clients": soak.args.api_clients,
        "duration_s": round(elapsed, 1),
        "faults": [{k: v for k, v in f.items() if k != "at"} for f in soak.faults],
        "chat_requests": len(soak.replies),
        "chat_refused_before_start": dict(soak.refused),
        "api_requests": len(soak.api_calls),
        "output_tokens": {"chat": chat_tokens, "api": api_tokens},
        "tokens_per_s": round((chat_tokens + api_tokens) / max(elapsed, 1e-9), 1),
        "errors": dict(errors),
        "client_events": dict(soak.client_events),
        "ttft": ttft,
        "recovery": recovery,
        **checks,
        "violation_counts": dict(Counter(v["kind"] for v in checks["violations"])),
        "ok": not checks["violations"],
    }


def print_table(r: dict[str, Any]) -> None:
    loss = r["worst_text_loss"]
    rows: list[tuple[str, Any]] = [
        ("model", r["model"]),
        ("chat users / API clients", f"{r['users']} / {r['api_clients']}"),
        ("duration (s)", r["duration_s"]),
        ("chat requests (acknowledged)", r["chat_requests"]),
        ("chat refused before start", r["chat_refused_before_start"] or "none"),
        ("API requests (accepted)", r["api_requests"]),
        ("output tokens chat / API", f"{r['output_tokens']['chat']} / {r['output_tokens']['api']}"),
        ("output tokens/s (all)", r["tokens_per_s"]),
        ("errors by code", r["errors"] or "none"),
        ("chat endings", r["chat_endings"]),
        ("API outcomes", r["api_outcomes"]),
        ("replies cut by a fault / with text lost",
         f"{r['replies_cut_by_a_fault']} / {r['replies_with_text_lost']}"
         " (socket cut: server kill; a worker kill ends a reply with worker_lost)"),
        ("worst text loss",
         f"{loss['seconds']} s, {loss['chars']} chars (message {loss['message_id']})"),
        ("replies left streaming in the DB", r["replies_left_streaming_in_db"]),
        ("client events", r["client_events"]),
    ]  # fmt: skip
    for t in r["ttft"]:
        rows.append((
            f"TTFT p50/p90 ms, {t['phase']}",
            f"chat {t['chat_p50_ms']} / {t['chat_p90_ms']} (n={t['chat_n']}); "
            f"API {t['api_p50_ms']} / {t['api_p90_ms']} (n={t['api_n']})",
        ))  # fmt: skip
    for rec in r["recovery"]:
        extra = (f"replacement ready {rec.get('replacement_ready_s')} s" if rec["fault"] == "worker"
                 else f"server back {rec.get('restart_s')} s")  # fmt: skip
        rows.append((
            f"recovery after {rec['fault']} kill at {rec['at_s']} s",
            f"first token {rec['first_token_after_s']} s, first complete reply "
            f"{rec['first_complete_reply_after_s']} s, {extra}",
        ))  # fmt: skip
    rows.append(("invariant violations", r["violation_counts"] or "none"))
    rows.append(("result", "PASS" if r["ok"] else "FAIL"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")


# --------------------------------------------------------------------------- main


async def drive(args: argparse.Namespace, deployment: Deployment, soak: Soak) -> None:
    users = [ChatUser(soak, f"soak{i}") for i in range(args.users)]

    async def user_task(i: int, u: ChatUser) -> None:
        await asyncio.sleep(i * args.ramp / max(1, args.users))
        await u.run()

    tasks = [user_task(i, u) for i, u in enumerate(users)]
    tasks += [api_client(soak, i) for i in range(args.api_clients)]
    faults = asyncio.create_task(inject_faults(soak, deployment))
    await asyncio.gather(*tasks)
    await faults


def model_dir_for(args: argparse.Namespace, workdir: Path) -> Path:
    from inference.model_files import default_model_path, ensure_default_model

    if args.model:
        args.model_label = str(args.model)
        return Path(args.model)
    from tests.tiny_model import build_tiny_llama

    args.model_label = "tiny random llama (tests/tiny_model.py, bundled tokenizer)"
    return build_tiny_llama(workdir / "tiny-llama", ensure_default_model(default_model_path()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of load")
    ap.add_argument("--users", type=int, default=32, help="chat users on the WebSocket")
    ap.add_argument("--api-clients", type=int, default=4, help="/v1/chat/completions clients")
    ap.add_argument(
        "--faults",
        default="worker,server",
        help="comma-separated: worker (SIGKILL at 1/3), server (at 2/3), or none",
    )
    ap.add_argument("--model", type=Path, help="a model folder (default: the tiny random llama)")
    ap.add_argument("--workers", type=int, default=2, help="engine workers at the start")
    ap.add_argument("--ramp", type=float, default=10.0, help="seconds over which users arrive")
    ap.add_argument("--turns", type=int, default=4, help="turns per conversation")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--think-min", type=float, default=1.0)
    ap.add_argument("--think-max", type=float, default=5.0)
    ap.add_argument("--loss-bound-s", type=float, default=1.0,
                    help="the most seconds of shown text a fault may lose")  # fmt: skip
    ap.add_argument("--json", type=Path, help="write the result here")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.faults = {f for f in args.faults.split(",") if f and f != "none"}
    random.seed(args.seed)
    # A SIGTERM (a test's timeout, a Ctrl-C elsewhere) still stops the deployment and
    # drops its database: the `finally` below runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    print(f"work folder: {workdir}", flush=True)
    deployment = Deployment(workdir, model_dir_for(args, workdir), uuid.uuid4().hex[:10])
    result: dict[str, Any] | None = None
    try:
        deployment.start(args.workers)
        names = ", ".join(f"'soak{i}'" for i in range(args.users + args.api_clients))
        keys = deployment.web.python(
            "from django.contrib.auth import get_user_model as g; "
            "from chatapp.openai_api.keys import create_key; U = g(); "
            f"us = [U.objects.create_user(n, password={PASSWORD!r}) for n in [{names}]]; "
            f"print(' '.join(create_key(u, 'soak')[1] for u in us[{args.users}:]))"
        )
        base = deployment.web.url
        model = httpx.get(
            base + "/v1/models",
            headers={"Authorization": f"Bearer {keys.split()[0]}"} if args.api_clients else {},
            timeout=30,
        )
        started = time.monotonic()
        soak = Soak(args, base, started, started + args.duration, keys=keys.split())
        if args.api_clients:
            soak.model = model.json()["data"][0]["id"]
        print(
            f"deployment up at {base}: {args.users} users, {args.api_clients} API clients, "
            f"{args.duration:.0f} s, faults {sorted(args.faults) or 'none'}",
            flush=True,
        )
        asyncio.run(drive(args, deployment, soak))
        elapsed = time.monotonic() - started
        saved = saved_messages(deployment)
        result = summarize(soak, check(soak, saved), elapsed)
        result["work_folder"] = str(workdir)
    finally:
        try:
            deployment.stop()
        except Exception as exc:  # said, not hidden: a database may be left behind
            print(f"cleanup failed: {exc!r}", file=sys.stderr)
        if result is not None and result["ok"] and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
