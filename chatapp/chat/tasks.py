"""The chat's offline tasks: a conversation's title, the export of a user's conversations,
and the KV tier upkeep that keeps the most-used system prompts warm. Queued through
chatapp.jobs.queue; their names are the ones queued tasks and beat schedules carry
since before the apps were split."""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import Task, shared_task

from chatapp.chat import export, kv_warmup, titles
from chatapp.jobs import queue
from chatapp.jobs.models import Job
from inference.client import embedded_engine_refused, serving_engine_busy

log = logging.getLogger(__name__)

TITLE_WAIT_S = 2.0


@shared_task(name="inference.generate_title", bind=True, max_retries=30)
def generate_title(self: Task, conversation_id: int) -> str | None:
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


@shared_task(name="inference.export_conversations")
def export_conversations(job_id: int) -> dict[str, Any]:
    return queue.run(job_id, export.export_all)


@shared_task(name="inference.kv_tier_upkeep")
def kv_tier_upkeep() -> dict[str, Any]:
    """Periodic: the Redis KV tier's size, its books kept straight, the most-used system
    prompts warmed (kv_warmup.py). Each pass is a Job row the dashboard shows.

    In embedded mode the serving process runs it (its scheduler, chatapp/jobs/scheduler.py):
    the warming needs the serving engine. A copy reaching a Celery worker then does nothing
    and says so."""
    if embedded_engine_refused():
        log.info("KV tier upkeep skipped here: the serving process runs it in embedded mode")
        return {"status": "skipped", "reason": "embedded mode: the serving process runs it"}
    job = Job.objects.create(kind=Job.Kind.KV_TIER)
    return queue.run(job.pk, kv_warmup.upkeep_job)
