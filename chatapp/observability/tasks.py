"""Celery tasks: the offline work, never done inside a request.

With a broker (docker compose) a Celery worker runs them and beat schedules the
periodic ones (CELERY_BEAT_SCHEDULE); with none (the embedded default) `submit` runs
them in a background thread of this process, and the engine sampler runs the periodic
ones.

Jobs that generate text (GENERATION_TASKS: titles, KV tier warming) run against the
engine that serves users, never a second copy (docs/titles.md, "Where generation jobs
run"): in embedded mode that engine is the web process's, so they always run in its
background thread, broker or not, and a Celery worker refuses to build an engine; in
distributed mode they go to the engine workers from wherever they run.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery import shared_task
from celery.signals import worker_init
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from inference import jobs, rollups, titles
from inference.client import embedded_engine_refused, get_engine_client, refuse_embedded_engine
from inference.models import Job

log = logging.getLogger(__name__)

# With no broker, the same split as the Celery queues: long jobs (settings.LONG_TASKS:
# tuning, benchmarks, exports) get a thread of their own, so a title never waits behind them.
_in_process = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offline-job")
_in_process_long = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offline-long-job")


# Jobs whose work is generation on the serving engine.
GENERATION_TASKS = frozenset({"inference.generate_title", "inference.kv_tier_upkeep"})
WORKER_REFUSAL = (
    "a Celery worker builds no engine in ENGINE_MODE=embedded: the engine that serves users "
    "is the web process's, and jobs that generate text (titles, KV tier warming) run in "
    "that process's background thread (docs/titles.md)"
)


@worker_init.connect
def _no_engine_in_a_worker(**_: Any) -> None:
    refuse_embedded_engine(WORKER_REFUSAL)


def runs_in_process(task: Any) -> bool:
    """Whether `submit` runs `task` in this process rather than sending it to the broker:
    with no broker, every task; in embedded mode, also every job that generates text, as
    the engine serving users is this process's."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return True
    return settings.ENGINE["MODE"] == "embedded" and task.name in GENERATION_TASKS


def submit(task: Any, *args: Any) -> None:
    """Queue a task: to the broker, or to this process's background thread."""
    if not runs_in_process(task):
        task.delay(*args)
    elif not settings.OBS_BACKGROUND:
        task.apply(args)
    else:

        def run() -> None:
            try:
                task.apply(args)
            finally:
                close_old_connections()

        (_in_process_long if task.name in settings.LONG_TASKS else _in_process).submit(run)


def serving_engine_busy() -> bool:
    """Whether the engine that serves users has requests waiting: in embedded mode this
    process's (generation jobs run in the serving process), in distributed mode the
    workers' summed queue. An upstream server's queue cannot be seen: never busy."""
    mode = settings.ENGINE["MODE"]
    if mode == "embedded":
        from inference.sampler import live_stats

        stats = live_stats()
    elif mode == "distributed":
        try:
            stats = get_engine_client().stats()
        except Exception as exc:  # the job itself will say what is wrong
            log.warning("could not read the engine workers' load: %s", exc)
            return False
    else:
        return False
    return bool(stats and int(stats.get("waiting") or 0) > 0)


@shared_task(name="inference.rollup")
def rollup() -> int:
    return rollups.rollup_since()


@shared_task(name="inference.prune")
def prune() -> dict[str, int]:
    return rollups.prune(settings.OBS_RAW_RETENTION_HOURS, settings.OBS_ROLLUP_RETENTION_DAYS)


TITLE_WAIT_S = 2.0


@shared_task(name="inference.generate_title", bind=True, max_retries=30)
def generate_title(self: Any, conversation_id: int) -> str | None:
    refused = embedded_engine_refused()
    if refused:
        log.error("title for conversation %s not written: %s", conversation_id, refused)
        return None
    # Low priority: while the serving engine has requests waiting, wait (at most
    # max_retries times), so a title never delays a person's reply.
    for _ in range(self.max_retries):
        if not serving_engine_busy():
            break
        if not self.request.is_eager:
            if self.request.retries < self.max_retries:
                raise self.retry(countdown=TITLE_WAIT_S)
            break
        time.sleep(TITLE_WAIT_S)
    return titles.generate(conversation_id)


def _run_job(job_id: int, work: Any) -> dict[str, Any]:
    job = Job.objects.get(pk=job_id)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=timezone.now())
    try:
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


@shared_task(name="inference.run_benchmark")
def run_benchmark(job_id: int) -> dict[str, Any]:
    return _run_job(job_id, jobs.benchmark)


@shared_task(name="inference.export_conversations")
def export_conversations(job_id: int) -> dict[str, Any]:
    return _run_job(job_id, jobs.export)


@shared_task(name="inference.tune")
def tune(job_id: int) -> dict[str, Any]:
    return _run_job(job_id, jobs.tune)


@shared_task(name="inference.kv_tier_upkeep")
def kv_tier_upkeep() -> dict[str, Any]:
    """Periodic: the Redis KV tier's size, its books kept straight, the most-used system
    prompts warmed (inference/kv_upkeep.py). Each pass is a Job row the dashboard shows.

    In embedded mode the serving process runs it (its sampler thread, on the same
    schedule): the warming needs the serving engine. Beat's copy reaching a Celery worker
    then does nothing and says so."""
    if embedded_engine_refused():
        log.info("KV tier upkeep skipped here: the serving process runs it in embedded mode")
        return {"status": "skipped", "reason": "embedded mode: the serving process runs it"}
    job = Job.objects.create(kind=Job.Kind.KV_TIER)
    return _run_job(job.pk, jobs.kv_tier)
