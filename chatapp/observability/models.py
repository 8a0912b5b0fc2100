"""What the observability side stores: every request's figures, periodic engine
snapshots and per-minute rollups of both. The tables keep the names they had in the app
`inference`, before the split."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class RequestRecord(models.Model):
    """One finished request (chat reply or API call). Times in seconds."""

    finished_at = models.DateTimeField(db_index=True)
    source = models.CharField(max_length=16)  # "chat" or "api"
    request_id = models.CharField(max_length=80, blank=True, default="")
    worker = models.CharField(max_length=120, blank=True, default="")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    conversation = models.ForeignKey(
        "chat.Conversation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    ttft = models.FloatField(null=True)
    tpot = models.FloatField(null=True)
    itl_p50 = models.FloatField(null=True)
    itl_p90 = models.FloatField(null=True)
    itl_p99 = models.FloatField(null=True)
    # Inter-token gaps as a sparse histogram {bucket index: count} (percentiles.py), so that
    # per-minute ITL percentiles can be merged over all gaps, not over medians.
    itl_hist = models.JSONField(default=dict, blank=True)
    queue_time = models.FloatField(null=True)
    prefill_time = models.FloatField(null=True)  # scheduled -> first token
    decode_time = models.FloatField(null=True)  # first token -> engine finish
    # Engine finish -> the web app done with the request (sending, saving): the part of
    # the delay spent outside the engine.
    network_time = models.FloatField(null=True)
    e2e = models.FloatField(null=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)  # memory (GPU/CPU) tier
    cached_tokens_redis = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    drafted_tokens = models.PositiveIntegerField(default=0)
    accepted_tokens = models.PositiveIntegerField(default=0)
    preemptions = models.PositiveIntegerField(default=0)
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    error_code = models.CharField(max_length=64, blank=True, default="")
    # Answered by the response cache (inference/response_cache.py), not the engine.
    replayed = models.BooleanField(default=False)

    class Meta:
        db_table = "inference_requestrecord"
        ordering = ["-finished_at"]

    def __str__(self) -> str:
        return f"{self.source} {self.request_id} ({self.finish_reason})"


class EngineSample(models.Model):
    """A snapshot of the engine's live stats, taken every OBS_SAMPLE_INTERVAL_S.
    The prefix-cache and refusal counts are the engine's running totals."""

    at = models.DateTimeField(db_index=True)
    worker = models.CharField(max_length=120, blank=True, default="")
    running = models.PositiveIntegerField(default=0)
    waiting = models.PositiveIntegerField(default=0)
    batch_size = models.PositiveIntegerField(default=0)  # of the last step
    step_tokens = models.PositiveIntegerField(default=0)
    step_seconds = models.FloatField(default=0.0)
    kv_usage = models.FloatField(default=0.0)  # used blocks / all blocks
    prefix_queries = models.BigIntegerField(default=0)
    prefix_hits = models.BigIntegerField(default=0)
    refused = models.BigIntegerField(default=0)
    steps = models.BigIntegerField(default=0)

    class Meta:
        db_table = "inference_enginesample"
        ordering = ["-at"]


class MinuteRollup(models.Model):
    """Aggregates of one minute of RequestRecords and EngineSamples.

    Percentiles are exact over the minute's rows; `hists` holds each latency as a
    histogram too, so that longer windows merge minutes without averaging percentiles.
    """

    minute = models.DateTimeField(unique=True)
    requests = models.PositiveIntegerField(default=0)
    errors = models.JSONField(default=dict, blank=True)  # error code -> count
    finish_reasons = models.JSONField(default=dict, blank=True)
    percentiles = models.JSONField(default=dict, blank=True)  # e.g. "ttft_p99": 0.41
    hists = models.JSONField(default=dict, blank=True)  # e.g. "ttft": {"12": 3}
    output_tokens = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    cached_tokens_redis = models.PositiveIntegerField(default=0)
    drafted_tokens = models.PositiveIntegerField(default=0)
    accepted_tokens = models.PositiveIntegerField(default=0)
    # From the engine samples of the minute.
    samples = models.PositiveIntegerField(default=0)
    running_avg = models.FloatField(null=True)
    waiting_avg = models.FloatField(null=True)
    batch_size_avg = models.FloatField(null=True)
    kv_usage_avg = models.FloatField(null=True)
    prefix_queries = models.BigIntegerField(default=0)  # increase during the minute
    prefix_hits = models.BigIntegerField(default=0)
    refused = models.BigIntegerField(default=0)

    class Meta:
        db_table = "inference_minuterollup"
        ordering = ["-minute"]
