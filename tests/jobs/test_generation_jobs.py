"""Jobs that generate text (titles, KV tier warming) run against the serving engine, never
a second copy (docs/titles.md, "Where generation jobs run"), with real Celery workers,
a real Redis broker and the real engine on the tiny model:

- embedded mode with a broker (as docker compose can run it): the web server writes the
  title in its own background queue and sends the `title` frame; the Celery worker never
  gets the job and builds no engine, and refuses one when handed a job anyway;
- distributed mode: the Celery worker runs the jobs through the `run_engine` workers.

Each worker listens on a queue of this test run's own, so a worker of another test run
sharing the Redis database cannot take these jobs.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.engine_workers import REDIS_URL as WORKERS_REDIS
from tests.engine_workers import Worker as EngineWorker
from tests.engine_workers import cleanup, worker_env
from tests.jobs.test_celery_worker import BROKER, KV_TIER, Worker
from tests.servers import started, users_code
from tools.live_server import LiveServer

QUESTION = "How do I bake a simple loaf of bread at home without a machine?"
# The tiny random-weight model answers with blanks: the title is the question's first words.
FALLBACK = "Bake a simple loaf of bread"
PASSWORD = "a-long-test-password-1"
# What the engine logs when it is built (inference/engine/model_runner.py), in Django's
# log format (servers, engine workers) and in Celery's (its workers).
ENGINE_BUILT = re.compile(r"engine config: model=")
ERROR = re.compile(r"\bERROR\b")


class QueueWorker(Worker):
    """A Celery worker on a queue of its own."""

    def __init__(self, workdir: Path, model_dir: Path, **env: str) -> None:
        super().__init__(workdir, model_dir)
        self.env.update(env)
        self.queue = f"gen-jobs-{uuid.uuid4().hex[:8]}"

    def start(self) -> QueueWorker:
        self.migrate()
        self.proc = self.celery_worker(self.log, self.queue, queue=self.queue)
        return self

    def run(self, task: str, *args: object, timeout: float = 120) -> object:
        sent = self.client.send_task(task, args=list(args), queue=self.queue)
        return sent.get(timeout=timeout)


def require_redis() -> None:
    try:
        redis.Redis.from_url(BROKER).ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {BROKER}")


def first_exchange(process: Worker | LiveServer, username: str) -> int:
    return int(
        process.python(
            "from django.contrib.auth import get_user_model as g; "
            "from chatapp.chat.models import Conversation, Message; "
            "from chatapp.chat.conversations import default_title; "
            f"u, _ = g().objects.get_or_create(username={username!r}); "
            f"q = {QUESTION!r}; "
            "c = Conversation.objects.create(owner=u, title=default_title(q)); "
            "m = Message.objects.create(conversation=c, role='user', text=q); "
            "Message.objects.create(conversation=c, parent=m, role='assistant', "
            "text='Mix flour, water, salt and yeast, knead, let it rise, then bake.'); "
            "print(c.pk)"
        ).splitlines()[-1]
    )


def stored_title(process: Worker, conversation_id: int) -> str:
    return process.query("select title from chatapp_conversation where id = ?", conversation_id)[0][
        0
    ]


# --- embedded mode, a broker configured ----------------------------------------------


@pytest.fixture(scope="module")
def embedded(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[tuple[LiveServer, QueueWorker]]:
    """A web server (embedded engine, broker set) and a Celery worker on one database."""
    require_redis()
    workdir = tmp_path_factory.mktemp("embedded-jobs")
    worker = QueueWorker(workdir, tiny_model_dir)
    server = LiveServer(
        workdir,
        tiny_model_dir,
        CELERY_BROKER_URL=BROKER,
        CELERY_RESULT_BACKEND=BROKER,
        CELERY_TASK_ALWAYS_EAGER="false",
        CHAT_AUTO_TITLES="true",
        ENGINE_KV_CACHE_MEMORY_MB="64",
        ENGINE_NUM_THREADS="1",
    )
    try:
        worker.start()
        server.migrated = True  # the worker's start migrated their one database
        started(server, users_code("titler", password=PASSWORD))
        yield server, worker
    finally:
        server.stop()
        worker.stop()


def test_in_embedded_mode_the_serving_process_writes_the_title_and_sends_the_frame(
    embedded: tuple[LiveServer, QueueWorker],
) -> None:
    server, worker = embedded
    with server.chat_socket("titler", PASSWORD) as ws:
        ws.send(json.dumps({"type": "send", "conversation_id": None, "text": QUESTION}))
        frames: list[dict] = []
        deadline = time.monotonic() + 90
        while not any(f["type"] == "title" for f in frames):
            assert time.monotonic() < deadline, frames[-3:]
            frames.append(json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic()))))
    kinds = [f["type"] for f in frames]
    assert kinds.index("done") < kinds.index("title")
    conv_id = frames[0]["conversation"]["id"]
    assert frames[-1] == {"type": "title", "conversation_id": conv_id, "title": FALLBACK}
    assert stored_title(worker, conv_id) == FALLBACK
    # The job never went to the broker: the worker never saw it and built no engine.
    log = worker.log.read_text()
    assert "inference.generate_title" not in log.split("ready.", 1)[1]
    assert not ENGINE_BUILT.search(log)
    assert ENGINE_BUILT.search(server.log.read_text())  # the one engine: the server's


def test_a_celery_worker_in_embedded_mode_refuses_to_build_an_engine(
    embedded: tuple[LiveServer, QueueWorker],
) -> None:
    _server, worker = embedded
    conv_id = first_exchange(worker, "handed-over")
    assert worker.run("inference.generate_title", conv_id) is None
    skipped = worker.run("inference.kv_tier_upkeep")
    assert skipped["status"] == "skipped", skipped
    log = worker.log.read_text()
    refusals = [line for line in log.splitlines() if ERROR.search(line)]
    assert len(refusals) == 1, refusals
    assert "builds no engine in ENGINE_MODE=embedded" in refusals[0]
    assert not ENGINE_BUILT.search(log) and "Traceback" not in log
    assert stored_title(worker, conv_id).startswith("How do I bake a simple loaf")
    assert worker.query("select count(*) from inference_job where kind = 'kv_tier'")[0][0] == 0


# --- distributed mode --------------------------------------------------------------------


@pytest.fixture(scope="module")
def distributed(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[dict]:
    """An engine worker (`run_engine`) and a Celery worker in distributed mode."""
    require_redis()
    namespace = f"gen-jobs-{uuid.uuid4().hex[:8]}"
    env = worker_env(namespace)
    env["ENGINE_KV_TIER_URL"] = KV_TIER
    tmp = tmp_path_factory.mktemp("distributed-jobs")
    workers = redis.Redis.from_url(WORKERS_REDIS)
    engine = EngineWorker(tmp / "engine", tiny_model_dir, namespace, "w1", **env)
    celery = QueueWorker(tmp / "celery", tiny_model_dir, ENGINE_MODE="distributed", **env)
    (tmp / "celery").mkdir(exist_ok=True)
    try:
        engine.start()
        celery.start()
        engine.wait_registered(workers)
        yield {"celery": celery, "engine": engine, "namespace": namespace, "env": env}
    finally:
        celery.stop()
        engine.stop()
        cleanup(workers, namespace)
        tier = redis.Redis.from_url(KV_TIER)
        for key in tier.scan_iter(match=f"{env['ENGINE_KV_TIER_NAMESPACE']}:*", count=500):
            tier.delete(key)


def test_in_distributed_mode_the_title_job_runs_through_the_engine_workers(
    distributed: dict,
) -> None:
    celery: QueueWorker = distributed["celery"]
    conv_id = first_exchange(celery, "distributed-titler")
    assert celery.run("inference.generate_title", conv_id, timeout=180) == FALLBACK
    assert stored_title(celery, conv_id) == FALLBACK
    log = celery.log.read_text()
    assert not ENGINE_BUILT.search(log) and not ERROR.search(log)
    assert ENGINE_BUILT.search(distributed["engine"].log.read_text())
    assert celery.run("inference.generate_title", conv_id) is None  # titled already


def test_in_distributed_mode_kv_tier_upkeep_warms_through_the_engine_workers(
    distributed: dict,
) -> None:
    celery: QueueWorker = distributed["celery"]
    namespace = distributed["env"]["ENGINE_KV_TIER_NAMESPACE"]
    tier = redis.Redis.from_url(KV_TIER)
    lru, sizes, total = (f"{namespace}:{k}" for k in ("lru", "sizes", "bytes"))
    # Books of an entry whose TTL already ran out: upkeep must drop them.
    gone = f"{namespace}:expired:00"
    tier.zadd(lru, {gone: 1.0})
    tier.hset(sizes, gone, 1000)
    tier.incrby(total, 1000)
    prompt = "You are a patient tutor. " * 12  # several full KV blocks
    celery.python(
        "from django.contrib.auth import get_user_model as g; "
        "from chatapp.chat.models import Conversation; "
        "u, _ = g().objects.get_or_create(username='tutored'); "
        f"[Conversation.objects.create(owner=u, system_prompt={prompt!r}) for _ in range(2)]; "
        "Conversation.objects.create(owner=u, system_prompt='rarely used')"
    )
    result = celery.run("inference.kv_tier_upkeep", timeout=180)
    assert result["status"] == "done", result
    assert result["enabled"] and result["expired_dropped"] >= 1
    warmed = result["warmed"]
    assert [w["conversations"] for w in warmed] == [2, 1]
    assert warmed[0]["prompt_tokens"] > 32
    # The engine worker writes the warmed blocks back in the background.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and tier.zcard(lru) < 2:
        time.sleep(0.2)
    assert tier.zcard(lru) >= 2 and tier.zscore(lru, gone) is None
    # A second pass finds the blocks stored: the prompt is restored, not recomputed.
    again = celery.run("inference.kv_tier_upkeep", timeout=180)
    first = again["warmed"][0]
    assert again["entries"] >= 2 and first["cached_memory"] + first["cached_redis"] >= 32
    assert not ENGINE_BUILT.search(celery.log.read_text())
