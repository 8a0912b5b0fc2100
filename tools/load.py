"""Load generator: N simulated people chatting multi-turn over real WebSockets.

    python -m tools.load --users 64 --duration 600            # starts its own server
    python -m tools.load --url http://127.0.0.1:8000 --password ... --users 16 --duration 60

Each person logs in, opens the chat socket and keeps a conversation going: send, wait for
the reply to finish, think for a moment, send the next turn (a new conversation every
--turns turns). At the end every conversation is read back over HTTP and compared with
what the person saw stream in, so a lost or truncated message is counted. It reports
errors by code, TTFT and ITL percentiles as people see them, replies and tokens per
second, and the server's memory (RSS) over time; a table on stdout and --json FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websockets

QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Explain what a KV cache is in one paragraph.",
    "Write a short poem about the sea.",
    "How do I reverse a list in Python?",
    "What is 12 times 7?",
    "Name a few uses of Redis.",
    "Tell me a fun fact about octopuses.",
]
FOLLOW_UPS = [
    "Tell me more.",
    "Can you make it shorter?",
    "Why?",
    "Give an example.",
    "Thanks! And?",
]
# A person told to wait (a refusal before anything was stored) waits this long.
REFUSED_WAIT_S = 3.0


@dataclass
class Person:
    name: str
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    replies: int = 0
    tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    # conversation id -> list of (user text, reply text as streamed)
    seen: dict[int, list[tuple[str, str]]] = field(default_factory=dict)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


async def login(base: str, username: str, password: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=base, timeout=30)
    await client.get("/accounts/login/")
    answer = await client.post(
        "/accounts/login/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Referer": base + "/accounts/login/"},
    )
    if answer.status_code != 302:
        raise RuntimeError(f"login failed for {username}: {answer.status_code}")
    return client


async def chat(
    person: Person,
    base: str,
    password: str,
    deadline: float,
    turns: int,
    max_tokens: int,
    think: tuple[float, float],
) -> None:
    http = await login(base, person.name, password)
    cookie = "; ".join(f"{k}={v}" for k, v in http.cookies.items())
    url = base.replace("http", "ws", 1) + "/ws/chat/"
    conv_id: int | None = None
    turn = 0
    try:
        async with websockets.connect(
            url, additional_headers={"Cookie": cookie, "Origin": base}, max_size=2**22
        ) as sock:
            while time.monotonic() < deadline:
                if turn % turns == 0:
                    conv_id, text = None, random.choice(QUESTIONS)
                else:
                    text = random.choice(FOLLOW_UPS)
                frame: dict[str, Any] = {"type": "send", "conversation_id": conv_id, "text": text}
                if conv_id is None:
                    frame["settings"] = {"max_tokens": max_tokens}
                sent = time.monotonic()
                await sock.send(json.dumps(frame))
                reply, last, first = "", None, None
                refused = False
                while True:
                    msg = json.loads(await asyncio.wait_for(sock.recv(), timeout=300))
                    kind = msg["type"]
                    if kind == "conversation":
                        conv_id = msg["conversation"]["id"]
                    elif kind == "delta":
                        now = time.monotonic()
                        if first is None:
                            first = now
                            person.ttft.append(now - sent)
                        elif last is not None:
                            person.itl.append(now - last)
                        last = now
                        reply += msg["text"]
                    elif kind == "error":
                        person.errors[msg["code"]] += 1
                        if msg.get("message_id") is None:
                            # Refused before anything was stored (rate_limited, busy...):
                            # the message was never sent, so there is nothing to find later.
                            refused = True
                            break
                    elif kind == "done":
                        person.replies += 1
                        person.tokens += int(msg["figures"].get("output_tokens") or 0)
                        if msg["status"] != "complete":
                            person.errors[f"reply_{msg['status']}"] += 1
                        break
                if refused:
                    # Then the same turn again (not counted: nothing of it was stored).
                    await asyncio.sleep(REFUSED_WAIT_S)
                    continue
                if conv_id is not None:
                    person.seen.setdefault(conv_id, []).append((text, reply))
                turn += 1
                await asyncio.sleep(random.uniform(*think))
    except Exception as exc:  # a dropped socket is a finding, not a crash of the tool
        person.errors[f"client_{type(exc).__name__}"] += 1
    finally:
        await verify(person, http)
        await http.aclose()


async def verify(person: Person, http: httpx.AsyncClient) -> None:
    """Every exchange the person saw must be stored, reply text identical."""
    for conv_id, exchanges in person.seen.items():
        answer = await http.get(f"/api/conversations/{conv_id}/")
        if answer.status_code != 200:
            person.errors["lost_conversation"] += 1
            continue
        stored = answer.json()["messages"]
        pairs = [(stored[i]["text"], stored[i + 1]["text"]) for i in range(0, len(stored) - 1, 2)]
        for i, (text, reply) in enumerate(exchanges):
            if i >= len(pairs) or pairs[i][0] != text:
                person.errors["lost_message"] += 1
            elif pairs[i][1] != reply:
                person.errors["reply_mismatch"] += 1


async def watch_rss(
    pid: int | None, samples: list[tuple[float, float]], stop: asyncio.Event
) -> None:
    start = time.monotonic()
    while not stop.is_set():
        if pid is not None:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        samples.append((time.monotonic() - start, int(line.split()[1]) / 1024))
            except OSError:
                pass
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=5)


async def run(args: argparse.Namespace, base: str, pid: int | None) -> dict[str, Any]:
    people = [Person(f"{args.user_prefix}{i}") for i in range(args.users)]
    deadline = time.monotonic() + args.duration
    rss: list[tuple[float, float]] = []
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_rss(pid, rss, stop))
    started = time.monotonic()

    async def person_task(i: int, p: Person) -> None:
        await asyncio.sleep(i * args.ramp / max(1, args.users))  # arrive over the ramp
        await chat(
            p,
            base,
            args.password,
            deadline,
            args.turns,
            args.max_tokens,
            (args.think_min, args.think_max),
        )

    await asyncio.gather(*(person_task(i, p) for i, p in enumerate(people)))
    elapsed = time.monotonic() - started
    stop.set()
    await watcher
    ttft = [t for p in people for t in p.ttft]
    itl = [t for p in people for t in p.itl]
    errors: Counter[str] = Counter()
    for p in people:
        errors.update(p.errors)
    lost = errors["lost_message"] + errors["lost_conversation"] + errors["reply_mismatch"]
    return {
        "users": args.users,
        "duration_s": round(elapsed, 1),
        "replies": sum(p.replies for p in people),
        "output_tokens": sum(p.tokens for p in people),
        "tokens_per_s": round(sum(p.tokens for p in people) / elapsed, 1),
        "ttft_ms": {q: _ms(pct(ttft, q)) for q in (50, 90, 99)},
        "itl_ms": {q: _ms(pct(itl, q)) for q in (50, 90, 99)},
        "errors": dict(errors),
        "lost_messages": lost,
        "rss_mb": {
            "start": rss[0][1] if rss else None,
            "end": rss[-1][1] if rss else None,
            "max": max((r for _, r in rss), default=None),
        },
        "rss_samples": rss,
    }


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)


def print_table(r: dict[str, Any]) -> None:
    rows = [
        ("people", r["users"]),
        ("duration (s)", r["duration_s"]),
        ("replies", r["replies"]),
        ("output tokens/s (all people)", r["tokens_per_s"]),
        ("TTFT p50 / p90 / p99 (ms)", " / ".join(str(r["ttft_ms"][q]) for q in (50, 90, 99))),
        ("ITL p50 / p90 / p99 (ms)", " / ".join(str(r["itl_ms"][q]) for q in (50, 90, 99))),
        ("errors", r["errors"] or "none"),
        ("lost messages", r["lost_messages"]),
        (
            "server RSS start / end / max (MB)",
            " / ".join(str(round(v)) if v else "-" for v in r["rss_mb"].values()),
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--url", help="a running server; without it one is started (real default model)"
    )
    ap.add_argument("--pid", type=int, help="the server's process id, for RSS (with --url)")
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds")
    ap.add_argument("--ramp", type=float, default=5.0, help="seconds over which people arrive")
    ap.add_argument("--turns", type=int, default=4, help="turns per conversation")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--think-min", type=float, default=0.5)
    ap.add_argument("--think-max", type=float, default=2.0)
    ap.add_argument("--user-prefix", default="load")
    ap.add_argument("--password", default="load-test-password-1")
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args(argv)
    server = None
    base, pid = args.url, args.pid
    if base is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from inference.model_files import ensure_default_model
        from tools.live_server import LiveServer

        server = LiveServer(
            Path(tempfile.mkdtemp(prefix="load-")),
            ensure_default_model(),
            ENGINE_DTYPE="auto",
            CHAT_DISCONNECT_GRACE_S="5",
        ).start()
        server.python(
            "from django.contrib.auth import get_user_model as g; U = g(); "
            f"[U.objects.create_user('{args.user_prefix}%d' % i, password={args.password!r}) "
            f"for i in range({args.users})]"
        )
        base, pid = server.url, server.proc.pid if server.proc else None
    try:
        result = asyncio.run(run(args, base.rstrip("/"), pid))
    finally:
        if server is not None:
            server.stop()
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if result["lost_messages"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
