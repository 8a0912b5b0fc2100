"""The jobs' own upkeep: the reaper of jobs a crash orphaned (docs/jobs.md, "Time limits")."""

from __future__ import annotations

from celery import shared_task

from chatapp.jobs import queue


@shared_task(name="inference.reap_jobs")
def reap_jobs() -> list[int]:
    return queue.reap()
