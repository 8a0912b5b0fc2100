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
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from celery import Task
from celery.signals import worker_init
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone
from redis import Redis

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


# How long a job of each kind may run (a tuning run's trials are bounded to fit:
# chatapp/observability/tuning.py). Past it the reaper marks it failed, and a Celery worker
# with a forking pool stops it (its time limit is sent with the task).
TIME_LIMIT_S = {
    Job.Kind.BENCHMARK: settings.BENCH_TIMEOUT_S + 300,
    Job.Kind.EXPORT: 1800.0,
    Job.Kind.TUNING: 2 * 3600.0,
    Job.Kind.KV_TIER: 1800.0,
}
# A queued job not started within this long never will be (its message was lost with a
# worker that crashed holding it): the long queue runs its jobs one at a time, so a few
# long jobs may wait in front of it.
QUEUED_LIMIT_S = 6 * 3600.0
# A job of a kind started with `run` alone (no limit above) is given this long.
DEFAULT_TIME_LIMIT_S = 3600.0
UNFINISHED = (Job.Status.QUEUED, Job.Status.RUNNING)


class JobNotQueued(Exception):
    """The broker did not take the job: its row is failed, saying so."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"{job.kind} job {job.pk} could not be queued")
        self.job = job


class JobCancelled(Exception):
    """Raised by a job's work when `check_cancelled` finds its row cancelled."""


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


def submit(task: Task, *args: Any, time_limit_s: float | None = None) -> None:
    """Queue a task: to the broker (with its time limit, if given), or to this process's
    background thread. Raises when the broker does not take it."""
    if not runs_in_process(task):
        limits = {}
        if time_limit_s:
            limits = {"soft_time_limit": time_limit_s, "time_limit": time_limit_s + 60}
        task.apply_async(args, **limits)
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
        if (params or {}).get("format", "md") not in ("md", "json", "txt"):
            raise ValueError("the export format must be 'md', 'json' or 'txt'")
    return Job.objects.create(kind=kind, user=user, params=params or {})


def task_for(kind: str) -> Task:
    return task_named(TASK_OF_KIND[Job.Kind(kind)])


def start(kind: str, user: Any = None, params: dict[str, Any] | None = None) -> Job:
    """Create a job and queue it the way every offline task is (`submit`): to the broker,
    whose routes put tuning, benchmark and exports on the long queue, or to this process's
    background thread. JobNotQueued (the row failed) when the broker does not take it."""
    job = create(kind, user, params)
    try:
        submit(task_for(kind), job.pk, time_limit_s=TIME_LIMIT_S.get(Job.Kind(kind)))
    except Exception as exc:
        # Left queued, it would wait forever for a message that never went out.
        log.error("%s job %s could not be queued: %r", kind, job.pk, exc)
        fail(job, "not queued: the broker did not answer; start it again later")
        job.refresh_from_db()
        raise JobNotQueued(job) from exc
    return job


def fail(job: Job, why: str, status: str = Job.Status.FAILED) -> bool:
    """End an unfinished job with `why` in its log; False if it had ended already."""
    line = f"{why} ({timezone.now():%Y-%m-%d %H:%M:%S} UTC)"
    return bool(
        Job.objects.filter(pk=job.pk, status__in=UNFINISHED).update(
            status=status,
            finished_at=timezone.now(),
            log=(job.log + "\n" + line).strip()[-20000:],
        )
    )


def cancel(job: Job, by: str) -> bool:
    """Cancel a queued or running job: a queued one never starts; a running one stops at
    its next check (`check_cancelled`) and keeps what it wrote so far. False if the job
    had ended already."""
    return fail(job, f"cancelled by {by}", Job.Status.CANCELLED)


def check_cancelled(job_id: int) -> None:
    """Raise JobCancelled when the job's row says it is over (cancelled, or reaped): long
    jobs call it between steps."""
    if Job.objects.filter(pk=job_id).exclude(status=Job.Status.RUNNING).exists():
        raise JobCancelled(f"job {job_id} was stopped")


def reap(now: Any = None) -> list[int]:
    """Fail the jobs a crash orphaned: running past their kind's time limit, or queued
    past QUEUED_LIMIT_S. Their worker (or in-process thread) is gone or hung; a job that
    does end after all cannot overwrite the verdict (`run` updates running rows only)."""
    now = now or timezone.now()
    reaped = []
    for job in Job.objects.filter(status__in=UNFINISHED):
        if job.status == Job.Status.RUNNING:
            limit = TIME_LIMIT_S.get(Job.Kind(job.kind), DEFAULT_TIME_LIMIT_S)
            since, what = job.started_at or job.created_at, f"running past its {limit:.0f} s"
        else:
            limit, since = QUEUED_LIMIT_S, job.created_at
            what = f"queued past {QUEUED_LIMIT_S:.0f} s"
        if now - since > timedelta(seconds=limit) and fail(
            job, f"reaped: {what} time limit (its worker died, hung or lost it)"
        ):
            log.warning("reaped %s job %s: %s", job.kind, job.pk, what)
            reaped.append(job.pk)
    return reaped


def broker_health() -> tuple[str, str]:
    """The broker's state for the readiness probe: "off" when jobs run in this process."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return "off", "no broker: jobs run in this process"
    url = settings.CELERY_BROKER_URL
    if urlsplit(url).scheme in ("redis", "rediss"):
        client = Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        try:
            client.ping()
        finally:
            client.close()
    else:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=1)
    return "ok", urlsplit(url).scheme


def run(job_id: int, work: Callable[[Job], dict[str, Any] | None]) -> dict[str, Any]:
    """Run a Job's work, keeping its status, times and (on failure) the error in its row."""
    job = Job.objects.get(pk=job_id)
    try:
        # Inside the try: a job whose start cannot be written ends failed, never queued
        # forever. A job cancelled (or reaped) while queued does not start.
        started = Job.objects.filter(pk=job.pk, status=Job.Status.QUEUED).update(
            status=Job.Status.RUNNING, started_at=timezone.now()
        )
        if not started:
            job.refresh_from_db()
            return {"status": job.status, "error": "not started: the job had ended"}
        result = work(job)
    except JobCancelled:
        job.refresh_from_db()
        return {"status": job.status}
    except Exception as exc:
        log.exception("%s job %s failed", job.kind, job.pk)
        # The in-memory row: its log is what the work wrote (a command's output).
        fail(job, f"{type(exc).__name__}: {exc}")
        return {"status": "failed", "error": str(exc)}
    # Only a running row: a job cancelled or reaped meanwhile keeps that verdict.
    Job.objects.filter(pk=job.pk, status=Job.Status.RUNNING).update(
        status=Job.Status.DONE, finished_at=timezone.now()
    )
    return {"status": "done", **(result or {})}
