"""Queueing offline work: to the broker, or to this process (docs/jobs.md).

With a broker (docker compose) a Celery worker runs each task, on the queue its route
names; with none (the embedded default) `submit` runs it in a background thread of this
process. Jobs that generate text (settings.GENERATION_TASKS: titles, KV tier warming) run
against the engine that serves users, never a second copy (docs/titles.md, "Where
generation jobs run"): in embedded mode that engine is the web process's, so they always
run in its background thread, broker or not, and a Celery worker refuses to build an
engine; in distributed mode they go to the engine workers from wherever they run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery import Task
from celery.signals import worker_init
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from chatapp.celery import app
from chatapp.jobs.models import Job
from inference.client import refuse_embedded_engine

log = logging.getLogger(__name__)

# With no broker, the same split as the Celery queues: long jobs (settings.LONG_TASKS:
# tuning, benchmarks, exports) get a thread of their own, so a title never waits behind them.
_in_process = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offline-job")
_in_process_long = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offline-long-job")

WORKER_REFUSAL = (
    "a Celery worker builds no engine in ENGINE_MODE=embedded: the engine that serves users "
    "is the web process's, and jobs that generate text (titles, KV tier warming) run in "
    "that process's background thread (docs/titles.md)"
)

# The Celery task that runs each kind of Job somebody starts (the apps' tasks.py define
# them; the KV tier upkeep task makes its own Job row on each pass).
TASK_OF_KIND = {
    Job.Kind.BENCHMARK: "inference.run_benchmark",
    Job.Kind.EXPORT: "inference.export_conversations",
    Job.Kind.TUNING: "inference.tune",
}


@worker_init.connect
def _no_engine_in_a_worker(**_: Any) -> None:
    refuse_embedded_engine(WORKER_REFUSAL)


def task_named(name: str) -> Task:
    """The registered Celery task of that name (autodiscovery imports every app's tasks.py
    first, so a caller needs to import none of them)."""
    app.loader.import_default_modules()
    return app.tasks[name]


def runs_in_process(task: Task | str) -> bool:
    """Whether `submit` runs `task` in this process rather than sending it to the broker:
    with no broker, every task; always those that read this process's engine
    (settings.SERVING_PROCESS_TASKS); in embedded mode, also every job that generates text,
    as the engine serving users is this process's."""
    name = task if isinstance(task, str) else task.name
    if settings.CELERY_TASK_ALWAYS_EAGER or name in settings.SERVING_PROCESS_TASKS:
        return True
    return settings.ENGINE["MODE"] == "embedded" and name in settings.GENERATION_TASKS


def submit(task: Task, *args: Any) -> None:
    """Queue a task: to the broker, or to this process's background thread."""
    if not runs_in_process(task):
        task.delay(*args)
    elif not settings.OBS_BACKGROUND:
        task.apply(args)
    else:

        def run() -> None:
            # Nobody waits on this thread's future: a failure not logged here is lost.
            try:
                result = task.apply(args)
                if result.failed():
                    log.error("in-process task %s%r failed: %r", task.name, args, result.result)
            except Exception:
                log.exception("in-process task %s%r failed", task.name, args)
            finally:
                close_old_connections()

        (_in_process_long if task.name in settings.LONG_TASKS else _in_process).submit(run)


def create(kind: str, user: Any = None, params: dict[str, Any] | None = None) -> Job:
    """The queued Job row, checked: the work itself starts with `start` or `run_job`."""
    if kind not in TASK_OF_KIND:
        raise ValueError(f"no job of kind {kind!r} can be started; one of {sorted(TASK_OF_KIND)}")
    if kind == Job.Kind.EXPORT:
        if user is None:
            raise ValueError("an export is of one user's conversations: name the user")
        if (params or {}).get("format", "md") not in ("md", "json"):
            raise ValueError("the export format must be 'md' or 'json'")
    return Job.objects.create(kind=kind, user=user, params=params or {})


def task_for(kind: str) -> Task:
    return task_named(TASK_OF_KIND[Job.Kind(kind)])


def start(kind: str, user: Any = None, params: dict[str, Any] | None = None) -> Job:
    """Create a job and queue it the way every offline task is (`submit`): to the broker,
    whose routes put tuning, benchmark and exports on the long queue, or to this process's
    background thread."""
    job = create(kind, user, params)
    submit(task_for(kind), job.pk)
    return job


def run(job_id: int, work: Callable[[Job], dict[str, Any] | None]) -> dict[str, Any]:
    """Run a Job's work, keeping its status, times and (on failure) the error in its row."""
    job = Job.objects.get(pk=job_id)
    try:
        # Inside the try: a job whose start cannot be written ends failed, never queued forever.
        Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=timezone.now())
        result = work(job)
    except Exception as exc:
        log.exception("%s job %s failed", job.kind, job.pk)
        Job.objects.filter(pk=job.pk).update(
            status=Job.Status.FAILED,
            finished_at=timezone.now(),
            log=(job.log + f"\n{type(exc).__name__}: {exc}").strip()[-20000:],
        )
        return {"status": "failed", "error": str(exc)}
    Job.objects.filter(pk=job.pk).update(status=Job.Status.DONE, finished_at=timezone.now())
    return {"status": "done", **(result or {})}
