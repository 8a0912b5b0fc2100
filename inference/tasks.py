"""Celery tasks: the offline work, never done inside a request.

With a broker (docker compose) a Celery worker runs them and beat schedules the
periodic ones (CELERY_BEAT_SCHEDULE); with none (the embedded default) `submit` runs
them in a background thread of this process, and the engine sampler runs the periodic
ones.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from inference import jobs, rollups, titles
from inference.models import Job

log = logging.getLogger(__name__)

_in_process = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offline-job")


def submit(task: Any, *args: Any) -> None:
    """Queue a task: to the broker, or to this process's background thread."""
    if not settings.CELERY_TASK_ALWAYS_EAGER:
        task.delay(*args)
    elif not settings.OBS_BACKGROUND:
        task.apply(args)
    else:

        def run() -> None:
            try:
                task.apply(args)
            finally:
                close_old_connections()

        _in_process.submit(run)


@shared_task(name="inference.rollup")
def rollup() -> int:
    return rollups.rollup_since()


@shared_task(name="inference.prune")
def prune() -> dict[str, int]:
    return rollups.prune(settings.OBS_RAW_RETENTION_HOURS, settings.OBS_ROLLUP_RETENTION_DAYS)


@shared_task(name="inference.generate_title", bind=True, max_retries=30)
def generate_title(self: Any, conversation_id: int) -> str | None:
    # Low priority: while the engine in this process has requests waiting, wait too.
    from inference.sampler import live_stats

    stats = live_stats()
    if stats and int(stats.get("waiting") or 0) > 0:
        if settings.CELERY_TASK_ALWAYS_EAGER:
            time.sleep(2)
            return generate_title.apply((conversation_id,)).get()
        raise self.retry(countdown=2)
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
    prompts warmed (inference/kv_upkeep.py). Each pass is a Job row the dashboard shows."""
    job = Job.objects.create(kind=Job.Kind.KV_TIER)
    return _run_job(job.pk, jobs.kv_tier)
