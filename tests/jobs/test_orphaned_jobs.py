"""Jobs never stay "running" or "queued" forever (docs/jobs.md, "Time limits, cancel,
the reaper"): a job whose Celery worker died is reaped past its kind's time limit, a
cancelled running job stops its work at once, and one cancelled while queued never runs.
A real Celery worker on the long queue through the real Redis; the benchmark job runs
tests/jobs/fake_bench.py, held open by a gate file the test controls."""

from __future__ import annotations

import signal
import sqlite3
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.live_server import ROOT, DjangoProcess

BROKER = "redis://127.0.0.1:6379/5"


class LongWorker(DjangoProcess):
    def __init__(self, workdir: Path, model_dir: Path) -> None:
        self.gate = workdir / "gate"
        self.queue = f"long-{uuid.uuid4().hex[:8]}"  # shares db 5 with other tests
        super().__init__(
            workdir,
            model_dir,
            CELERY_BROKER_URL=BROKER,
            CELERY_RESULT_BACKEND=BROKER,
            CELERY_TASK_ALWAYS_EAGER="false",
            CELERY_LONG_QUEUE=self.queue,
            ENGINE_PRELOAD="false",
            OBS_BACKGROUND="false",
            BENCH_COMMAND=f"{sys.executable} {ROOT / 'tests/jobs/fake_bench.py'} --gate {self.gate}",  # noqa: E501
        )
        self.migrate()

    def start(self) -> LongWorker:
        self.proc = self.celery_worker(self.workdir / "worker.log", self.queue, self.queue)
        return self

    def job(self, pk: int) -> dict[str, str]:
        """The job's row, read from the worker's SQLite file (as tests/jobs/test_job_queues.py
        does): a `manage.py shell` a look costs seconds, and wait_status looks often."""
        with sqlite3.connect(self.db, timeout=10) as conn:
            status, log, started = conn.execute(
                "select status, log, started_at from inference_job where id = ?", (pk,)
            ).fetchone()
        return {"status": status, "log": log, "started": str(started)}

    def start_benchmark(self) -> int:
        return int(
            self.python("from chatapp.jobs import queue; print(queue.start('benchmark').pk)")
        )

    def bench_running(self) -> bool:
        """Whether this worker's fake benchmark command (held by the gate) is running."""
        gate = str(self.gate).encode()
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if gate in cmdline.read_bytes().split(b"\0"):
                    return True
            except OSError:  # the process ended meanwhile
                pass
        return False

    def wait_bench(self, running: bool, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while self.bench_running() != running:
            assert time.monotonic() < deadline, (
                f"the fake benchmark never {'started' if running else 'ended'}"
            )
            time.sleep(0.05)

    def wait_status(self, pk: int, status: str, timeout: float = 60) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while (job := self.job(pk))["status"] != status:
            assert time.monotonic() < deadline, job
            time.sleep(0.1)  # a look is a read of the SQLite file: cheap
        return job


@pytest.fixture
def long_worker(tmp_path: Path, tiny_model_dir: Path) -> Iterator[LongWorker]:
    w = LongWorker(tmp_path, tiny_model_dir)
    try:
        yield w
    finally:
        w.gate.touch()  # lets an orphaned fake bench exit
        w.stop()


def test_a_job_whose_worker_died_is_reaped_past_its_time_limit(long_worker: LongWorker) -> None:
    long_worker.start()
    pk = long_worker.start_benchmark()
    long_worker.wait_status(pk, "running")
    assert long_worker.proc is not None
    long_worker.proc.send_signal(signal.SIGKILL)
    long_worker.proc.wait()
    time.sleep(1)
    assert long_worker.job(pk)["status"] == "running"  # nobody left to end it

    reap = (
        "from datetime import timedelta; from django.utils import timezone; "
        "from chatapp.jobs import queue; from chatapp.jobs.models import Job; "
        "limit = queue.TIME_LIMIT_S[Job.Kind.BENCHMARK]; "
        "print(queue.reap(), queue.reap(timezone.now() + timedelta(seconds=limit + 1)))"
    )
    assert long_worker.python(reap) == f"[] [{pk}]"
    job = long_worker.job(pk)
    assert job["status"] == "failed" and "reaped: running past its" in job["log"]


def test_cancelling_a_running_job_stops_its_work_and_frees_the_worker(
    long_worker: LongWorker,
) -> None:
    long_worker.start()
    first = long_worker.start_benchmark()
    long_worker.wait_status(first, "running")
    long_worker.wait_bench(running=True)
    cancelled = long_worker.python(
        "from chatapp.jobs import queue; from chatapp.jobs.models import Job; "
        f"print(queue.cancel(Job.objects.get(pk={first}), 'staff'))"
    )
    assert cancelled == "True"
    # The job checks its row every second and kills its command: gone before the gate opens.
    long_worker.wait_bench(running=False)
    long_worker.gate.touch()
    second = long_worker.start_benchmark()
    long_worker.wait_status(second, "done", timeout=30)
    job = long_worker.job(first)
    assert job["status"] == "cancelled" and "cancelled by staff" in job["log"]
    # Killed before the gate opened: the command never wrote its results.
    assert not list((long_worker.workdir / "jobs").glob(f"*-{first}/results.json"))


def test_a_job_cancelled_while_queued_never_runs(long_worker: LongWorker) -> None:
    pk = long_worker.start_benchmark()  # queued: no worker yet
    long_worker.python(
        "from chatapp.jobs import queue; from chatapp.jobs.models import Job; "
        f"queue.cancel(Job.objects.get(pk={pk}), 'staff')"
    )
    long_worker.gate.touch()
    long_worker.start()
    later = long_worker.start_benchmark()
    long_worker.wait_status(later, "done", timeout=30)  # the worker took both messages
    job = long_worker.job(pk)
    assert job["status"] == "cancelled" and job["started"] == "None"
