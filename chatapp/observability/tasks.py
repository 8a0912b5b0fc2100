"""Observability's offline tasks: the engine sample, the per-minute rollup, pruning, and
the benchmark and tuning jobs. Queued through chatapp.jobs.queue; their names are the ones
queued tasks and beat schedules carry since before the apps were split."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from chatapp.jobs import queue
from chatapp.jobs.models import Job
from chatapp.observability import benchmark, engine_samples, rollups, tuning


@shared_task(name="inference.sample_engine")
def sample_engine() -> int | None:
    """Store a snapshot of this process's engine (settings.SERVING_PROCESS_TASKS: it always
    runs where the engine client is)."""
    sample = engine_samples.take_sample()
    return None if sample is None else int(sample.pk)


@shared_task(name="inference.rollup")
def rollup() -> int:
    return rollups.rollup_since()


@shared_task(name="inference.prune")
def prune() -> dict[str, int]:
    return rollups.prune(settings.OBS_RAW_RETENTION_HOURS, settings.OBS_ROLLUP_RETENTION_DAYS)


@shared_task(name="inference.run_benchmark")
def run_benchmark(job_id: int) -> dict[str, Any]:
    return queue.run(job_id, benchmark.run)


def _tune(job: Job) -> dict[str, Any]:
    def progress(figures: dict[str, Any]) -> None:
        # Shown on the dashboard while it runs; a cancel takes effect between trials.
        Job.objects.filter(pk=job.pk).update(result={"progress": figures})
        queue.check_cancelled(job.pk)

    report = tuning.run(job.params, progress)
    Job.objects.filter(pk=job.pk).update(result=report)
    return {"best": report["best"]}


@shared_task(name="inference.tune")
def tune(job_id: int) -> dict[str, Any]:
    return queue.run(job_id, _tune)
