"""The record of an offline job somebody started (or a periodic pass worth showing), and
what it produced."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Job(models.Model):
    """An offline job started from the dashboard or the API, and what it produced."""

    class Kind(models.TextChoices):
        BENCHMARK = "benchmark"
        EXPORT = "export"
        TUNING = "tuning"
        KV_TIER = "kv_tier"  # Redis KV tier upkeep (chatapp.chat.kv_warmup)

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    params = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True)
    log = models.TextField(blank=True, default="")
    # A produced file (benchmark plot, export archive) under VAR_DIR/jobs/.
    file = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "inference_job"  # the app was `inference` before the split
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} ({self.status})"
