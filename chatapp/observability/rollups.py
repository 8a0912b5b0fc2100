"""Per-minute aggregates of the raw figures, and the pruning of old raw rows."""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chatapp.jobs.models import Job
from chatapp.observability import percentiles
from chatapp.observability.models import EngineSample, MinuteRollup, RequestRecord

# Token counts summed per minute (and again over a dashboard window).
TOKEN_SUMS = (
    "output_tokens",
    "prompt_tokens",
    "cached_tokens",
    "cached_tokens_redis",
    "drafted_tokens",
    "accepted_tokens",
)

LATENCIES = ("ttft", "tpot", "e2e", "queue_time", "prefill_time", "decode_time", "network_time")
PERCENTILES = (50, 90, 99)
MINUTE = timedelta(minutes=1)


def floor_minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def request_aggregates(rows: list[RequestRecord]) -> dict:
    out: dict = {"percentiles": {}, "hists": {}}
    for name in LATENCIES:
        values = [getattr(r, name) for r in rows if getattr(r, name) is not None]
        out["hists"][name] = percentiles.histogram(values)
        for q in PERCENTILES:
            out["percentiles"][f"{name}_p{q}"] = percentiles.percentile(values, q)
    # ITL over every gap of the minute's requests, merged from their histograms.
    itl = percentiles.merge(r.itl_hist for r in rows)
    out["hists"]["itl"] = itl
    for q in PERCENTILES:
        out["percentiles"][f"itl_p{q}"] = percentiles.hist_percentile(itl, q)
    out["requests"] = len(rows)
    out["errors"] = dict(Counter(r.error_code for r in rows if r.error_code))
    out["finish_reasons"] = dict(Counter(r.finish_reason for r in rows))
    for name in TOKEN_SUMS:
        out[name] = sum(getattr(r, name) for r in rows)
    return out


def increase(samples: list[EngineSample], field: str, before: dict[str, EngineSample]) -> int:
    """How much an engine running total grew over these samples (per worker; a total
    that went down means the engine restarted and counts from 0 again)."""
    total = 0
    prev = {w: getattr(s, field) for w, s in before.items()}
    for s in samples:
        now = getattr(s, field)
        if s.worker in prev:
            total += now - prev[s.worker] if now >= prev[s.worker] else now
        prev[s.worker] = now
    return total


def sample_aggregates(samples: list[EngineSample], before: dict[str, EngineSample]) -> dict:
    n = len(samples)

    def avg(field: str) -> float | None:
        return sum(getattr(s, field) for s in samples) / n if n else None

    return {
        "samples": n,
        "running_avg": avg("running"),
        "waiting_avg": avg("waiting"),
        "batch_size_avg": avg("batch_size"),
        "kv_usage_avg": avg("kv_usage"),
        "prefix_queries": increase(samples, "prefix_queries", before),
        "prefix_hits": increase(samples, "prefix_hits", before),
        "refused": increase(samples, "refused", before),
    }


def rollup_minute(minute: datetime) -> MinuteRollup | None:
    start, end = minute, minute + MINUTE
    rows = list(RequestRecord.objects.filter(finished_at__gte=start, finished_at__lt=end))
    samples = list(EngineSample.objects.filter(at__gte=start, at__lt=end).order_by("at", "id"))
    if not rows and not samples:
        MinuteRollup.objects.filter(minute=minute).delete()
        return None
    before = {}
    for worker in {s.worker for s in samples}:
        prev = EngineSample.objects.filter(at__lt=start, at__gte=start - 10 * MINUTE, worker=worker)
        if (p := prev.order_by("-at").first()) is not None:
            before[worker] = p
    values = {**request_aggregates(rows), **sample_aggregates(samples, before)}
    obj, _ = MinuteRollup.objects.update_or_create(minute=minute, defaults=values)
    return obj


def rollup_since(since: datetime | None = None, now: datetime | None = None) -> int:
    """Roll up every complete minute from `since` (default: the last rollup minus a few
    minutes, for late rows) to the minute before now. Idempotent."""
    now = now or timezone.now()
    last = floor_minute(now)
    if since is None:
        latest = MinuteRollup.objects.order_by("-minute").first()
        if latest is not None:
            since = latest.minute - 3 * MINUTE
        else:
            first = RequestRecord.objects.order_by("finished_at").first()
            first_s = EngineSample.objects.order_by("at").first()
            times = [x for x in (first and first.finished_at, first_s and first_s.at) if x]
            since = min(times) if times else last
    start = floor_minute(max(since, last - timedelta(days=8)))
    # Only minutes that have figures (or a stale rollup to replace) need work.
    minutes = {
        floor_minute(t)
        for qs, field in (
            (
                RequestRecord.objects.filter(finished_at__gte=start, finished_at__lt=last),
                "finished_at",
            ),
            (EngineSample.objects.filter(at__gte=start, at__lt=last), "at"),
            (MinuteRollup.objects.filter(minute__gte=start, minute__lt=last), "minute"),
        )
        for t in qs.values_list(field, flat=True)
    }
    for m in sorted(minutes):
        with transaction.atomic():
            rollup_minute(m)
    return len(minutes)


def prune(
    raw_hours: float,
    rollup_days: float,
    now: datetime | None = None,
    job_days: float | None = None,
) -> dict[str, int]:
    """Drop raw figures older than `raw_hours` (once rolled up), rollups older than
    `rollup_days`, and finished jobs (prune_jobs)."""
    now = now or timezone.now()
    raw_cut = now - timedelta(hours=raw_hours)
    # Never drop raw rows that have not been rolled up yet.
    latest = MinuteRollup.objects.order_by("-minute").first()
    if latest is None:
        raw_cut = min(raw_cut, now - timedelta(days=36500))
    else:
        raw_cut = min(raw_cut, latest.minute)
    records, _ = RequestRecord.objects.filter(finished_at__lt=raw_cut).delete()
    samples, _ = EngineSample.objects.filter(at__lt=raw_cut).delete()
    rollups, _ = MinuteRollup.objects.filter(minute__lt=now - timedelta(days=rollup_days)).delete()
    jobs = prune_jobs(
        raw_hours, settings.OBS_JOB_RETENTION_DAYS if job_days is None else job_days, now
    )
    return {"records": records, "samples": samples, "rollups": rollups, "jobs": jobs}


def prune_jobs(raw_hours: float, job_days: float, now: datetime | None = None) -> int:
    """Delete finished Job rows and their files: the periodic KV tier upkeep passes (one
    every KV_TIER_UPKEEP_S) with the raw figures after `raw_hours`, the jobs somebody
    started (benchmark runs compared run against run, tuning reports, exports) after
    `job_days`. Queued and running jobs stay, however old."""
    now = now or timezone.now()
    finished = Job.objects.filter(
        status__in=(Job.Status.DONE, Job.Status.FAILED, Job.Status.CANCELLED)
    )
    old = finished.filter(
        kind=Job.Kind.KV_TIER, finished_at__lt=now - timedelta(hours=raw_hours)
    ) | finished.exclude(kind=Job.Kind.KV_TIER).filter(
        finished_at__lt=now - timedelta(days=job_days)
    )
    doomed = list(old.values_list("pk", "kind"))
    jobs_root = Path(settings.VAR_DIR) / "jobs"
    for pk, kind in doomed:
        # The folder chatapp.jobs.files.job_dir made for it: plots, archives, results.
        shutil.rmtree(jobs_root / f"{kind}-{pk}", ignore_errors=True)
    deleted, _ = Job.objects.filter(pk__in=[pk for pk, _ in doomed]).delete()
    return deleted
