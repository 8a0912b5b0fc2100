"""Faults of the distributed engine, against real processes: a worker killed mid-reply
(the chat user gets a clear error within seconds, the partial reply is saved, and the next
turn runs on the other worker), a worker stopped, Redis going away and coming back."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from inference.engine import SamplingParams
from inference.workers.protocol import EngineUnavailableError
from inference.workers.registry import Keys
from tests.engine_workers import (
    Worker,
    distributed_client,
    fresh_namespace,
    worker_env,
    workers_running,
)
from tests.reliability.test_faults import redis_server
from tests.servers import PASSWORD
from tools.live_server import LiveServer, free_port

pytestmark = pytest.mark.slow

LONG = SamplingParams(max_tokens=1500, temperature=0, ignore_eos=True)


@pytest.fixture
def namespace(redis: Redis) -> Iterator[str]:
    """One per test (conftest's is the module's): a stopped worker's keys go with it."""
    with fresh_namespace(redis) as ns:
        yield ns


def recv(sock: Any, timeout: float = 30) -> dict[str, Any]:
    return json.loads(sock.recv(timeout=timeout))


def send(sock: Any, conversation_id: int | None, text: str) -> None:
    frame = {"type": "send", "conversation_id": conversation_id, "text": text,
             "settings": {"max_tokens": 600, "temperature": 0}}  # fmt: skip
    sock.send(json.dumps(frame))


def wait_for_key(redis: Redis, key: str, timeout: float = 5) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = redis.get(key)
        if value is not None:
            return value.decode()
        time.sleep(0.02)
    raise AssertionError(f"{key} never appeared")


def test_a_worker_killed_mid_reply_gives_a_clear_error_and_the_next_turn_works(
    tmp_path: Path, tiny_model_dir: Path, namespace: str, redis: Redis
) -> None:
    with workers_running(tmp_path, tiny_model_dir, namespace, redis, "w1", "w2") as workers:
        (tmp_path / "web").mkdir()
        web = LiveServer(tmp_path / "web", tiny_model_dir, ENGINE_MODE="distributed",
                         **worker_env(namespace))  # fmt: skip
        try:
            web.start()
            web.make_user("apiuser", PASSWORD)
            with web.chat_socket("apiuser", PASSWORD) as sock:
                # A first turn completes: its KV is written to the Redis tier.
                send(sock, None, "Tell me a story")
                frames = [recv(sock)]
                while frames[-1]["type"] != "done":
                    frames.append(recv(sock))
                assert frames[-1]["status"] == "complete"
                conversation = next(f for f in frames if f["type"] == "conversation")
                cid = conversation["conversation"]["id"]
                # The second turn's worker dies while it writes.
                send(sock, cid, "Tell me a longer one")
                frames = [recv(sock)]
                while frames[-1]["type"] != "delta":
                    frames.append(recv(sock))
                session = Keys(namespace).affinity(f"conversation-{cid}", tiny_model_dir.name)
                serving = wait_for_key(redis, session)
                victim = next(w for w in workers if w.id == serving)
                victim.kill(signal.SIGKILL)
                killed = time.monotonic()
                while frames[-1]["type"] != "error":
                    frames.append(recv(sock, timeout=10))
                assert time.monotonic() - killed < 5, "a clear error within 5 s"
                error = frames[-1]
                assert error["code"] == "worker_lost"
                assert "send your message again" in error["message"]
                done = recv(sock)
                assert done["type"] == "done" and done["status"] == "error"
                streamed = "".join(f["text"] for f in frames if f["type"] == "delta")
                assert streamed and done["message"]["text"] == streamed, "partial reply kept"
                saved = web.python(
                    "from chatapp.chat.models import Message as M; "
                    f"m = M.objects.get(pk={done['message_id']}); print(m.status, repr(m.text))"
                )
                assert saved == f"error {streamed!r}"

                # The next turn runs on the worker still alive, the conversation's prefix
                # restored from the Redis tier rather than recomputed.
                send(sock, cid, "Go on")
                frames = [recv(sock)]
                while frames[-1]["type"] != "done":
                    frames.append(recv(sock))
                assert frames[-1]["status"] == "complete", frames[-1]
                survivor = next(w for w in workers if w is not victim)
                worker, from_redis = web.python(
                    "from chatapp.observability.models import RequestRecord as R; "
                    "r = R.objects.order_by('-id')[0]; print(r.worker, r.cached_tokens_redis)"
                ).split()
                assert worker == survivor.id and int(from_redis) > 0
        finally:
            web.stop()


@pytest.fixture
def solo(tmp_path: Path, tiny_model_dir: Path, namespace: str, redis: Redis) -> Iterator[Worker]:
    # No drain time: its replies are cut at once (tests/workers/test_drain.py drains).
    with workers_running(
        tmp_path, tiny_model_dir, namespace, redis, "solo", ENGINE_WORKER_DRAIN_S="0"
    ) as (worker,):
        yield worker


async def test_a_stopped_worker_ends_its_replies_at_once_and_deregisters(
    solo: Worker, tiny_model_dir: Path, namespace: str, redis: Redis
) -> None:
    with distributed_client(tiny_model_dir, namespace) as client:
        stream = client.generate([42, 43, 44], LONG)
        await stream.__anext__()
        solo.kill(signal.SIGTERM)
        stopped = time.monotonic()
        last = await drain(stream)
        assert time.monotonic() - stopped < 3
        assert last.finished and last.finish_reason == "error"
        assert "worker was stopped" in last.error
        assert solo.proc is not None and solo.proc.wait(timeout=30) == 0
        assert not redis.exists(solo.key), "deregistered"
        with pytest.raises(EngineUnavailableError, match="no engine worker"):
            await stream_all(client, [1, 2])


async def drain(stream: Any) -> Any:
    """The stream's last delta."""
    deltas = [delta async for delta in stream]
    return deltas[-1]


async def stream_all(client: Any, ids: list[int], sampling: SamplingParams = LONG) -> Any:
    return await drain(client.generate(ids, sampling))


async def test_redis_going_away_ends_replies_with_a_clear_error_and_service_comes_back(
    tmp_path: Path, tiny_model_dir: Path, namespace: str
) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = redis_server(port, tmp_path)
    worker = Worker(tmp_path / "w", tiny_model_dir, namespace, "w", ENGINE_WORKERS_REDIS_URL=url)
    try:
        worker.start().wait_registered(Redis.from_url(url))
        with distributed_client(tiny_model_dir, namespace, url=url) as client:
            stream = client.generate([42, 43, 44], LONG)
            await stream.__anext__()
            server.terminate()
            server.wait(timeout=10)
            gone = time.monotonic()
            last = await drain(stream)
            assert time.monotonic() - gone < 6
            assert last.finish_reason == "error" and "Redis" in last.error
            with pytest.raises(EngineUnavailableError, match="Redis"):
                await stream_all(client, [1, 2])

            server = redis_server(port, tmp_path)  # back, empty: the worker registers again
            worker.wait_registered(Redis.from_url(url), timeout=15)
            last = await stream_all(client, [1, 2], SamplingParams(max_tokens=4, temperature=0))
            assert last.finish_reason in ("stop", "length")
    finally:
        worker.stop()
        server.terminate()
        server.wait(timeout=10)
