"""Each offline job, run by a real Celery worker process through the real Redis.
(The jobs that generate text, titles and the KV tier upkeep, run against the serving
engine: test_generation_jobs.py.)

The worker and this test share a SQLite file; the test seeds it and reads the results
through `manage.py shell` (the same settings as the worker) and plain sqlite3.
"""

from __future__ import annotations

import json
import os
import sqlite3
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from tools.live_server import DjangoProcess

ROOT = Path(__file__).resolve().parents[2]
BROKER = os.environ.get("OBS_TEST_BROKER", "redis://127.0.0.1:6379/5")
KV_TIER = "redis://127.0.0.1:6379/4"
KV_NAMESPACE = f"obs-test-kvtier-{os.getpid()}"


class Worker(DjangoProcess):
    def __init__(self, workdir: Path, model_dir: Path) -> None:
        super().__init__(
            workdir,
            model_dir,
            CELERY_BROKER_URL=BROKER,
            CELERY_RESULT_BACKEND=BROKER,
            CELERY_TASK_ALWAYS_EAGER="false",
            ENGINE_PRELOAD="false",
            ENGINE_KV_CACHE_MEMORY_MB="64",
            ENGINE_NUM_THREADS="1",
            OBS_BACKGROUND="false",
            ENGINE_KV_TIER_URL=KV_TIER,
            ENGINE_KV_TIER_NAMESPACE=KV_NAMESPACE,
            BENCH_COMMAND="{python} -m inference.bench --quick --skip-hf --threads 1",
        )
        self.log = workdir / "worker.log"
        self.client = Celery("obs-test-client", broker=BROKER, backend=BROKER)

    def start(self) -> Worker:
        self.migrate()
        self.proc = self.celery_worker(self.log, f"obs-test-{os.getpid()}", timeout=90)
        return self

    def run(self, task: str, *args: object, timeout: float = 120) -> object:
        return self.client.send_task(task, args=list(args)).get(timeout=timeout)

    def query(self, sql: str, *params: object) -> list[tuple]:
        with sqlite3.connect(self.db) as conn:
            return conn.execute(sql, params).fetchall()


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Worker]:
    r = redis.Redis.from_url(BROKER)
    try:
        r.ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {BROKER}")
    r.flushdb()
    w = Worker(tmp_path_factory.mktemp("celery-worker"), tiny_model_dir)
    try:
        yield w.start()
    finally:
        w.stop()
        r.flushdb()


def test_rollup_task_aggregates_the_stored_figures(worker: Worker) -> None:
    worker.python(
        "from django.utils import timezone; from tests.records import seed; "
        "seed(timezone.now(), minutes=2)"
    )
    assert worker.run("inference.rollup") >= 2
    (requests,) = worker.query("select sum(requests) from inference_minuterollup")[0]
    (raw,) = worker.query("select count(*) from inference_requestrecord")[0]
    assert requests == raw == 80


def test_prune_task_drops_old_raw_rows(worker: Worker) -> None:
    worker.python(
        "from datetime import timedelta; from django.utils import timezone; "
        "from chatapp.observability import rollups; from tests.records import seed; "
        "now = timezone.now(); seed(now - timedelta(days=3), minutes=1, seed=3); "
        "rollups.rollup_since(since=now - timedelta(days=4))"
    )
    before = worker.query("select count(*) from inference_requestrecord")[0][0]
    removed = worker.run("inference.prune")
    assert removed["records"] == 40
    assert worker.query("select count(*) from inference_requestrecord")[0][0] == before - 40


def test_conversation_export_is_produced_in_the_background(worker: Worker) -> None:
    ids = json.loads(
        worker.python(
            "import json; from django.contrib.auth import get_user_model as g; "
            "from chatapp.chat.models import Conversation, Message; "
            "from chatapp.jobs.models import Job; "
            "u = g().objects.create_user('exporter'); "
            "cs = [Conversation.objects.create(owner=u, title=f'Chat {i}') for i in range(3)]; "
            "ms = [Message.objects.create(conversation=c, role='user', text=f'question {i}') "
            "for i, c in enumerate(cs)]; "
            "[Conversation.objects.filter(pk=m.conversation_id).update(active_leaf=m) "
            "for m in ms]; "
            "md = Job.objects.create(kind='export', user=u, params={'format': 'md'}); "
            "js = Job.objects.create(kind='export', user=u, params={'format': 'json'}); "
            "print(json.dumps([md.pk, js.pk]))"
        )
    )
    for job_id in ids:
        assert worker.run("inference.export_conversations", job_id)["status"] == "done"
    (status, file), (status2, file2) = (
        worker.query("select status, file from inference_job where id = ?", i)[0] for i in ids
    )
    assert status == status2 == "done"
    with zipfile.ZipFile(worker.workdir / file) as zf:
        names = sorted(zf.namelist())
        assert len(names) == 3 and names[0].endswith("chat-0.md")
        assert "question 0" in zf.read(names[0]).decode()
    with zipfile.ZipFile(worker.workdir / file2) as zf:
        data = json.loads(zf.read("conversations.json"))
        assert [c["conversation"]["title"] for c in data] == ["Chat 0", "Chat 1", "Chat 2"]


def test_tuning_job_reports_goodput_per_setting(worker: Worker) -> None:
    job_id = int(
        worker.python(
            "from chatapp.jobs.models import Job; print(Job.objects.create(kind='tuning', params={"
            "'requests': 6, 'rate': 30, 'synthetic': True, 'repeats': 3, "
            "'axes': {'MAX_NUM_BATCHED_TOKENS': [64]}}).pk)"
        )
    )
    assert worker.run("inference.tune", job_id, timeout=300)["status"] == "done"
    (result,) = worker.query("select result from inference_job where id = ?", job_id)[0]
    report = json.loads(result)
    assert [row["label"] for row in report["rows"]] == ["current", "MAX_NUM_BATCHED_TOKENS=64"]
    assert report["best"] is None or report["best"] == report["rows"][1]["settings"]
    runs = [run for row in report["rows"] for run in row["runs"]]
    assert len(runs) == 6 and all(r["requests"] == 6 and r["wall_s"] > 0 for r in runs)


@pytest.mark.slow
def test_benchmark_run_is_stored_beside_earlier_runs(worker: Worker) -> None:
    job_id = int(
        worker.python(
            "from chatapp.jobs.models import Job; "
            "Job.objects.create(kind='benchmark', status='done', "
            "result={'single_ours': {'decode_tok_s': 1.0}, 'targets': []}); "
            "print(Job.objects.create(kind='benchmark').pk)"
        )
    )
    assert worker.run("inference.run_benchmark", job_id, timeout=400)["status"] == "done"
    status, file, result = worker.query(
        "select status, file, result from inference_job where id = ?", job_id
    )[0]
    assert status == "done", worker.query("select log from inference_job where id = ?", job_id)
    assert (worker.workdir / file).stat().st_size > 1000  # the PNG plot
    results = json.loads(result)
    assert results["single_ours"]["decode_tok_s"] > 0 and results["targets"]
    runs = json.loads(
        worker.python(
            "import json; from chatapp.observability.dashboard import benchmark_runs; "
            "print(json.dumps(benchmark_runs()))"
        )
    )
    assert [r["id"] for r in runs][:2] == [job_id, job_id - 1]
    assert runs[0]["summary"]["single_decode_tok_s"] > 0 and runs[0]["plot_url"]
    assert runs[1]["summary"]["single_decode_tok_s"] == 1.0
