"""Several models over engine workers (issue 17, item 2): each `manage.py run_engine`
registers the model it serves, and the web side routes a request to a worker of the
model it names, keeping session and prefix affinity within that model's workers. Real
workers (one on the default model, two on the tiny one, `--model tiny=FOLDER`), a real
Redis, the web side's client in this process and a real web process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis

from inference.backends.remote import prefix_keys
from inference.catalog import created_at
from inference.client import ModelNotFoundError, get_engine_client, list_models
from inference.engine import SamplingParams
from inference.model_files import MODEL_NAME
from inference.workers.registry import WorkerInfo
from tests.engine_workers import Worker, cleanup, distributed_client, worker_env
from tests.servers import PASSWORD, started, users_code
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow  # the real default model in a worker, and a web process

TINY = "tiny"
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def workers(
    tmp_path_factory: pytest.TempPathFactory,
    real_model_dir: Path,
    tiny_model_dir: Path,
    namespace: str,
    redis: Redis,
) -> Iterator[list[Worker]]:
    tmp = tmp_path_factory.mktemp("model-workers")
    tiny = ("--model", f"{TINY}={tiny_model_dir}")
    running = [
        Worker(tmp / "d1", real_model_dir, namespace, "d1").start(),
        Worker(tmp / "t1", real_model_dir, namespace, "t1", args=tiny).start(),
        Worker(tmp / "t2", real_model_dir, namespace, "t2", args=tiny).start(),
    ]
    try:
        for w in running:
            w.wait_registered(redis)
        yield running
    finally:
        for w in running:
            w.stop()
        cleanup(redis, namespace)


@pytest.fixture(scope="module")
def web_side(workers: list[Worker], real_model_dir: Path, namespace: str) -> Iterator[Any]:
    with distributed_client(real_model_dir, namespace) as default:
        yield default


async def served_by(client: Any, ids: list[int], **kw: Any) -> str:
    last = None
    async for delta in client.generate(ids, GREEDY, **kw):
        last = delta
    assert last is not None and last.finished and last.finish_reason != "error", last
    return str(last.figures.worker)


def registration(redis: Redis, namespace: str, worker_id: str) -> WorkerInfo:
    return WorkerInfo.from_json(redis.get(f"{namespace}:worker:{worker_id}"))


def test_each_worker_registers_the_model_it_serves(
    web_side: Any,
    redis: Redis,
    namespace: str,
    real_model_dir: Path,
    tiny_model_dir: Path,
) -> None:
    default, tiny = (registration(redis, namespace, w) for w in ("d1", "t1"))
    assert (default.model, default.model_path) == (MODEL_NAME, str(real_model_dir))
    assert (tiny.model, tiny.model_path) == (TINY, str(tiny_model_dir))
    assert tiny.model_created == created_at(str(tiny_model_dir)) > 0
    models = list_models()
    assert [(m.id, m.default) for m in models] == [(MODEL_NAME, True), (TINY, False)]
    assert [m.context_tokens for m in models] == [default.max_model_len, tiny.max_model_len]
    assert models[1].created == tiny.model_created


async def test_requests_go_to_the_workers_of_the_model_they_name(web_side: Any) -> None:
    tiny = get_engine_client(TINY)
    assert tiny.kind == "distributed" and tiny.model_name == TINY
    ids = list(tiny.tokenizer.encode("Which worker?", add_special_tokens=False))
    assert {await served_by(tiny, ids) for _ in range(4)} <= {"t1", "t2"}
    assert {await served_by(web_side, ids) for _ in range(2)} == {"d1"}


async def test_a_session_keeps_its_worker_per_model_across_a_switch(
    web_side: Any, redis: Redis, namespace: str
) -> None:
    tiny = get_engine_client(TINY)
    ids = list(tiny.tokenizer.encode("A conversation that switches", add_special_tokens=False))
    home = await served_by(tiny, ids, session_id="conversation-41")
    assert await served_by(web_side, ids, session_id="conversation-41") == "d1"
    # Back on the tiny model: the worker that holds the session's tiny KV, not the least
    # loaded one, and not the default model's worker the session saw last.
    for _ in range(3):
        assert await served_by(tiny, ids, session_id="conversation-41") == home
    assert redis.get(f"{namespace}:affinity:{TINY}:conversation-41") == home.encode()
    assert redis.get(f"{namespace}:affinity:{MODEL_NAME}:conversation-41") == b"d1"


async def test_a_growing_history_without_a_session_stays_on_one_worker_of_its_model(
    web_side: Any,
) -> None:
    tiny = get_engine_client(TINY)
    history = list(range(2000, 2000 + 40))
    first = await served_by(tiny, history, cache_salt="owner-a")
    for n in (60, 80, 100):
        history += list(range(3000 + n, 3000 + n + 20))
        assert await served_by(tiny, history, cache_salt="owner-a") == first
    # The same ids for another model are another prefix: its digests differ.
    assert not set(prefix_keys(history, "owner-a", TINY)) & set(
        prefix_keys(history, "owner-a", MODEL_NAME)
    )


def test_a_model_nobody_serves_is_not_found_naming_those_served(web_side: Any) -> None:
    with pytest.raises(ModelNotFoundError) as missing:
        get_engine_client("gpt-4o")
    assert missing.value.served == [MODEL_NAME, TINY]


def test_a_worker_asked_for_an_unknown_model_refuses_to_start(
    tmp_path: Path, real_model_dir: Path, namespace: str
) -> None:
    worker = Worker(tmp_path, real_model_dir, namespace, "bad")
    with pytest.raises(RuntimeError, match="neither a model name"):
        worker.manage("run_engine", "--check", "--model", "no-such-model")


# --- through a web process: /v1 and the chat socket -------------------------------------


@pytest.fixture(scope="module")
def web(
    tmp_path_factory: pytest.TempPathFactory,
    workers: list[Worker],
    real_model_dir: Path,
    namespace: str,
) -> Iterator[LiveServer]:
    srv = LiveServer(tmp_path_factory.mktemp("web"), real_model_dir, ENGINE_MODE="distributed",
                     **worker_env(namespace))  # fmt: skip
    try:
        started(srv, users_code("apiuser", password=PASSWORD))
        yield srv
    finally:
        srv.stop()


def test_the_web_process_lists_and_routes_every_served_model(web: LiveServer) -> None:
    headers = {"Authorization": f"Bearer {web.make_key('apiuser')}"}
    listed = httpx.get(web.url + "/v1/models", headers=headers).json()["data"]
    assert [m["id"] for m in listed] == [MODEL_NAME, TINY]
    for model in (MODEL_NAME, TINY):
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        answer = httpx.post(
            web.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
        )
        assert answer.status_code == 200 and answer.json()["model"] == model, answer.text
    body = {"model": "gpt-4o", "prompt": "Hi", "max_tokens": 3}
    missing = httpx.post(web.url + "/v1/completions", json=body, headers=headers, timeout=60)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_the_chat_socket_answers_with_the_picked_model_or_says_it_is_not_served(
    web: LiveServer,
) -> None:
    with web.chat_socket("apiuser", PASSWORD) as sock:
        frame = {"type": "send", "conversation_id": None, "text": "Hi", "model": TINY,
                 "settings": {"max_tokens": 4, "temperature": 0}}  # fmt: skip
        sock.send(json.dumps(frame))
        frames = []
        while not frames or frames[-1]["type"] not in ("done", "error"):
            frames.append(json.loads(sock.recv(timeout=60)))
        assert frames[-1]["type"] == "done" and frames[-1]["message"]["model"] == TINY, frames
        sock.send(json.dumps({**frame, "model": "gpt-4o"}))
        error = json.loads(sock.recv(timeout=60))
        assert error["type"] == "error" and error["code"] == "model_not_found"
