"""Long jobs on their own queue: two real Celery workers through the real Redis, as
docker-compose.yml runs them (celery-worker on the default queue, celery-worker-long on
CELERY_LONG_QUEUE), and jobs started with `manage.py run_job` as an operator would.

A benchmark whose bench command holds until the test opens a gate file keeps the long
worker busy for as long as the test wants; meanwhile a rollup and a KV tier upkeep pass
must finish on the default worker, and an export must wait its turn behind the benchmark.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tools.live_server import ROOT, DjangoProcess

# A Redis database of its own and queue names of their own: never another test's queue.
BROKER = os.environ.get("OBS_QUEUE_TEST_BROKER", "redis://127.0.0.1:6379/6")
DEFAULT_QUEUE = f"obs-test-default-{os.getpid()}"
LONG_QUEUE = f"obs-test-long-{os.getpid()}"
KV_TIER = "redis://127.0.0.1:6379/4"
KV_NAMESPACE = f"obs-test-queues-{os.getpid()}"
FAKE_BENCH = Path(__file__).with_name("fake_bench.py")


class Site(DjangoProcess):
    """Settings, SQLite file and `manage.py` of the deployment; the workers run beside."""

    def __init__(self, workdir: Path, model_dir: Path) -> None:
        self.gate = workdir / "gate"
        super().__init__(
            workdir,
            model_dir,
            CELERY_BROKER_URL=BROKER,
            CELERY_RESULT_BACKEND=BROKER,
            CELERY_TASK_ALWAYS_EAGER="false",
            CELERY_DEFAULT_QUEUE=DEFAULT_QUEUE,
            CELERY_LONG_QUEUE=LONG_QUEUE,
            ENGINE_PRELOAD="false",
            ENGINE_KV_CACHE_MEMORY_MB="32",
            ENGINE_NUM_THREADS="1",
            OBS_BACKGROUND="false",
            ENGINE_KV_TIER_URL=KV_TIER,
            ENGINE_KV_TIER_NAMESPACE=KV_NAMESPACE,
            BENCH_COMMAND=f"{{python}} {FAKE_BENCH} --gate {self.gate}",
        )
        self.workers: list[subprocess.Popen[bytes]] = []

    def start_worker(self, queue: str) -> None:
        self.workers.append(self.celery_worker(self.workdir / f"{queue}.log", queue, queue=queue))

    def stop(self) -> None:
        for proc in self.workers:
            proc.terminate()
        for proc in self.workers:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def run_job(self, *args: str) -> tuple[str, dict | None]:
        """`manage.py run_job ...`: its output, and the JSON result it ends with if any."""
        text = self.manage("run_job", *args)
        last = text.strip().splitlines()[-1]
        return text, json.loads(last) if last.startswith("{") else None

    def job(self, pk: int) -> tuple[str, str]:
        with sqlite3.connect(self.db, timeout=10) as conn:
            return conn.execute(
                "select status, file from inference_job where id = ?", (pk,)
            ).fetchone()

    def wait_status(self, pk: int, status: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.job(pk)[0] != status:
            if time.monotonic() > deadline:
                raise AssertionError(f"job {pk} is {self.job(pk)[0]}, not {status}")
            time.sleep(0.2)


def queued_job_id(text: str, queue: str) -> int:
    # "job 3 (benchmark) queued on 'obs-test-long-...' as task <uuid>"
    words = text.split()
    assert f"'{queue}'" in words, text
    return int(words[words.index("job") + 1])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Site]:
    broker = redis.Redis.from_url(BROKER)
    try:
        broker.ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {BROKER}")
    s = Site(tmp_path_factory.mktemp("job-queues"), tiny_model_dir)
    s.migrate()
    try:
        s.start_worker(DEFAULT_QUEUE)
        s.start_worker(LONG_QUEUE)
        yield s
    finally:
        s.gate.touch()  # a held benchmark lets its worker go
        s.stop()
        for queue in (DEFAULT_QUEUE, LONG_QUEUE):
            broker.delete(queue, f"_kombu.binding.{queue}")
        tier = redis.Redis.from_url(KV_TIER)
        for key in tier.scan_iter(match=f"{KV_NAMESPACE}:*", count=500):
            tier.delete(key)


def test_short_jobs_finish_while_a_long_job_holds_the_long_queue(site: Site) -> None:
    site.python(
        "from django.utils import timezone; from django.contrib.auth import get_user_model; "
        "from chatapp.chat.models import Conversation; "
        "from tests.records import seed; "
        "seed(timezone.now(), minutes=2); u = get_user_model().objects.create_user('exporter'); "
        "Conversation.objects.create(owner=u, title='Kept')"
    )
    text, _ = site.run_job("benchmark")
    bench = queued_job_id(text, LONG_QUEUE)
    site.wait_status(bench, "running")  # the long worker holds it until the gate opens
    text, _ = site.run_job("export", "--user", "exporter")
    export = queued_job_id(text, LONG_QUEUE)

    started = time.monotonic()
    text, rolled = site.run_job("rollup", "--wait", "--timeout", "60")
    assert f"queued on '{DEFAULT_QUEUE}'" in text
    assert rolled is not None and rolled["result"] >= 2
    _, pruned = site.run_job("prune", "--wait", "--timeout", "60")
    assert pruned is not None and pruned["result"]["jobs"] == 0
    short_s = time.monotonic() - started
    # Done behind nothing: the benchmark still runs, the export still waits for it.
    assert site.job(bench)[0] == "running" and site.job(export)[0] == "queued", short_s
    with sqlite3.connect(site.db) as conn:
        (requests,) = conn.execute("select sum(requests) from inference_minuterollup").fetchone()
    assert requests == 80

    site.gate.touch()
    site.wait_status(bench, "done")
    site.wait_status(export, "done")  # then the long queue moves on
    assert (site.workdir / site.job(export)[1]).is_file()
    assert (site.workdir / site.job(bench)[1]).stat().st_size > 2000


def test_run_job_wait_follows_a_queued_job_to_its_result(site: Site) -> None:
    params = {"requests": 4, "rate": 30, "synthetic": True, "repeats": 3,
              "axes": {"MAX_NUM_BATCHED_TOKENS": [64, 512]}}  # fmt: skip
    text, out = site.run_job("tune", "--params", json.dumps(params), "--wait", "--timeout", "300")
    job = queued_job_id(text, LONG_QUEUE)
    assert out is not None and out["id"] == job and out["status"] == "done"
    assert out["result"]["verdict"]
    # Prune runs on the default queue; the job just finished is within its retention.
    _, out = site.run_job("prune", "--wait", "--timeout", "60")
    assert out is not None and out["result"]["jobs"] == 0
    assert site.job(job)[0] == "done"


def test_compose_runs_one_worker_per_queue_and_the_routes_match() -> None:
    import yaml
    from django.conf import settings

    from chatapp.celery import app

    app.loader.import_default_modules()  # autodiscovery: every app's tasks.py

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    consumes = {
        name: arg.split("=", 1)[1]
        for name, svc in services.items()
        for arg in svc.get("command") or []
        if str(arg).startswith("--queues=")
    }
    assert consumes == {"celery-worker": "celery", "celery-worker-long": "long"}
    assert (settings.CELERY_TASK_DEFAULT_QUEUE, settings.CELERY_LONG_QUEUE) == ("celery", "long")
    route = {name: app.amqp.router.route({}, name)["queue"].name for name in app.tasks}
    long = {name for name, queue in route.items() if queue == "long"}
    assert long == {"inference.tune", "inference.run_benchmark", "inference.export_conversations"}
    for name in ("inference.rollup", "inference.prune", "inference.generate_title",
                 "inference.kv_tier_upkeep"):  # fmt: skip
        assert route[name] == "celery"
