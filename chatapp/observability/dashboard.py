"""The latency dashboard's series, read from stored rows.

The last 5 minutes come from the raw per-request records and engine samples, in 10 s
buckets; longer windows from the per-minute rollups, merged into coarser buckets by
adding their histograms (never by averaging percentiles).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from chatapp.jobs.models import Job
from chatapp.jobs.queue import UNFINISHED
from chatapp.observability import benchmark, percentiles
from chatapp.observability.models import EngineSample, MinuteRollup, RequestRecord
from chatapp.observability.rollups import (
    LATENCIES,
    PERCENTILES,
    TOKEN_SUMS,
    request_aggregates,
    sample_aggregates,
)

# window -> (length, bucket)
WINDOWS = {
    "5m": (timedelta(minutes=5), timedelta(seconds=10)),
    "1h": (timedelta(hours=1), timedelta(minutes=1)),
    "24h": (timedelta(hours=24), timedelta(minutes=10)),
    "7d": (timedelta(days=7), timedelta(hours=1)),
}
SUMS = (
    "requests",
    *TOKEN_SUMS,
    "prefix_queries",
    "prefix_hits",
    "refused",
    "samples",
)
AVERAGES = ("running_avg", "waiting_avg", "batch_size_avg", "kv_usage_avg")


def bucket_start(t: datetime, bucket: timedelta) -> datetime:
    step = int(bucket.total_seconds())
    return datetime.fromtimestamp(int(t.timestamp()) // step * step, t.tzinfo)


def raw_buckets(start: datetime, end: datetime, bucket: timedelta) -> dict[datetime, dict]:
    rows: dict[datetime, list] = {}
    for r in RequestRecord.objects.filter(finished_at__gte=start, finished_at__lt=end):
        rows.setdefault(bucket_start(r.finished_at, bucket), []).append(r)
    samples: dict[datetime, list] = {}
    for s in EngineSample.objects.filter(at__gte=start - bucket, at__lt=end).order_by("at", "id"):
        samples.setdefault(bucket_start(s.at, bucket), []).append(s)
    out = {}
    last_of: dict[str, EngineSample] = {}
    for t in sorted(set(rows) | set(samples)):
        here = samples.get(t, [])
        if t >= start:
            out[t] = {**request_aggregates(rows.get(t, [])), **sample_aggregates(here, last_of)}
        for s in here:
            last_of[s.worker] = s
    return out


def merge_rollups(group: list[MinuteRollup]) -> dict:
    if len(group) == 1:
        r = group[0]
        return {**{k: getattr(r, k) for k in (*SUMS, *AVERAGES)}, **_common(r)}
    merged: dict[str, Any] = {k: sum(getattr(r, k) for r in group) for k in SUMS}
    n = merged["samples"]
    for k in AVERAGES:
        vals = [(getattr(r, k), r.samples) for r in group if getattr(r, k) is not None]
        merged[k] = sum(v * w for v, w in vals) / n if n else None
    hists = {
        name: percentiles.merge(r.hists.get(name, {}) for r in group)
        for name in (*LATENCIES, "itl")
    }
    merged["percentiles"] = {
        f"{name}_p{q}": percentiles.hist_percentile(h, q)
        for name, h in hists.items()
        for q in PERCENTILES
    }
    errors: dict[str, int] = {}
    for r in group:
        for code, c in r.errors.items():
            errors[code] = errors.get(code, 0) + c
    merged["errors"] = errors
    merged["hists"] = hists
    return merged


def _common(r: MinuteRollup) -> dict:
    return {"percentiles": r.percentiles, "errors": r.errors, "hists": r.hists}


def rollup_buckets(start: datetime, end: datetime, bucket: timedelta) -> dict[datetime, dict]:
    groups: dict[datetime, list[MinuteRollup]] = {}
    for r in MinuteRollup.objects.filter(minute__gte=start, minute__lt=end).order_by("minute"):
        groups.setdefault(bucket_start(r.minute, bucket), []).append(r)
    return {t: merge_rollups(g) for t, g in groups.items()}


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def series(buckets: dict[datetime, dict], start: datetime, end: datetime, bucket: timedelta):
    step = bucket.total_seconds()
    ts = []
    t = bucket_start(start, bucket)
    while t < end:
        ts.append(t)
        t += bucket
    out: dict[str, list] = {"t": [int(t.timestamp()) for t in ts]}

    def add(name: str, fn: Callable[..., Any]) -> None:
        out[name] = [fn(buckets[t]) if t in buckets else None for t in ts]

    for name, key in (("ttft", "ttft"), ("itl", "itl"), ("tpot", "tpot"), ("e2e", "e2e")):
        for q in PERCENTILES:
            add(f"{name}_p{q}", lambda b, k=f"{key}_p{q}": b["percentiles"].get(k))
    for q in PERCENTILES:
        add(f"queue_p{q}", lambda b, k=f"queue_time_p{q}": b["percentiles"].get(k))
    add("requests", lambda b: b["requests"])
    add("out_tok_s", lambda b: b["output_tokens"] / step)
    add("running", lambda b: b["running_avg"])
    add("waiting", lambda b: b["waiting_avg"])
    add("batch_size", lambda b: b["batch_size_avg"])
    add("kv_usage", lambda b: b["kv_usage_avg"])
    add("prefix_hit_rate", lambda b: ratio(b["prefix_hits"], b["prefix_queries"]))
    add("redis_hit_rate", lambda b: ratio(b["cached_tokens_redis"], b["prompt_tokens"]))
    add("spec_accept", lambda b: ratio(b["accepted_tokens"], b["drafted_tokens"]))
    add("errors", lambda b: sum(b["errors"].values()))
    add("refused", lambda b: b["refused"])
    return out


def generated_tok_s(
    buckets: dict[datetime, dict], start: datetime, end: datetime, bucket: timedelta
) -> list[float | None]:
    """Output tokens per second in each bucket, each reply's tokens spread evenly over the
    time it generated them (first token to engine finish) rather than booked at its end: a
    43 s reply of 1,200 tokens shows ~28 tok/s in each bucket it spans, not 0 then 120."""
    step = bucket.total_seconds()
    tokens: dict[datetime, float] = {}
    t = bucket_start(start, bucket)
    while t < end:
        tokens[t] = 0.0
        t += bucket
    rows = RequestRecord.objects.filter(finished_at__gte=start, output_tokens__gt=0)
    for finished_at, network, decode, n in rows.values_list(
        "finished_at", "network_time", "decode_time", "output_tokens"
    ):
        done = finished_at.timestamp() - (network or 0.0)
        first = done - (decode or 0.0)
        for t in tokens:
            lo, hi = t.timestamp(), t.timestamp() + step
            if done <= first:
                tokens[t] += n if lo <= done < hi else 0
            else:
                tokens[t] += n * max(0.0, min(hi, done) - max(lo, first)) / (done - first)
    return [k / step if k or t in buckets else None for t, k in tokens.items()]


def summary(buckets: dict[datetime, dict]) -> dict[str, Any]:
    hists = {
        name: percentiles.merge(b["hists"].get(name, {}) for b in buckets.values())
        for name in ("ttft", "itl", "tpot", "e2e", "queue_time")
    }
    total = {k: sum(b.get(k) or 0 for b in buckets.values()) for k in SUMS}
    errors: dict[str, int] = {}
    for b in buckets.values():
        for code, c in b["errors"].items():
            errors[code] = errors.get(code, 0) + c
    return {
        **{
            f"{n}_p{q}": percentiles.hist_percentile(h, q)
            for n, h in hists.items()
            for q in (50, 99)
        },
        **total,
        "errors": errors,
        "error_count": sum(errors.values()),
        "prefix_hit_rate": ratio(total["prefix_hits"], total["prefix_queries"]),
        "spec_accept": ratio(total["accepted_tokens"], total["drafted_tokens"]),
    }


def replays(start: datetime, end: datetime) -> dict[str, Any]:
    """Replies the response cache replayed, and the TTFT they gave (from the raw records,
    kept OBS_RAW_RETENTION_HOURS: a longer window counts only that far back)."""
    ttfts = list(
        RequestRecord.objects.filter(
            finished_at__gte=start, finished_at__lt=end, replayed=True
        ).values_list("ttft", flat=True)
    )
    measured = [t for t in ttfts if t is not None]
    return {
        "replays": len(ttfts),
        "replay_ttft_p50": percentiles.percentile(measured, 50),
        "replay_ttft_p99": percentiles.percentile(measured, 99),
    }


def slowest(start: datetime, limit: int = 15) -> list[dict[str, Any]]:
    rows = (
        RequestRecord.objects.filter(finished_at__gte=start, e2e__isnull=False)
        .select_related("user")
        .order_by("-e2e")[:limit]
    )
    return [
        {
            "id": r.pk,
            "finished_at": r.finished_at.isoformat(),
            "source": r.source,
            "user": r.user.get_username() if r.user else "",
            "conversation_id": r.conversation_id,
            "request_id": r.request_id,
            "worker": r.worker,
            "e2e": r.e2e,
            "queue": r.queue_time,
            "prefill": r.prefill_time,
            "decode": r.decode_time,
            "network": r.network_time,
            "ttft": r.ttft,
            "itl_p99": r.itl_p99,
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "output_tokens": r.output_tokens,
            "preemptions": r.preemptions,
            "finish_reason": r.finish_reason,
            "error_code": r.error_code,
        }
        for r in rows
    ]


def recent_jobs(kind: str, limit: int) -> list[Job]:
    return list(Job.objects.filter(kind=kind).order_by("-created_at", "-id")[:limit])


def job_fields(j: Job) -> dict[str, Any]:
    """What every job row shows: which, in what state, how far it got, the log's end if
    it failed, and where to cancel it while it is unfinished."""
    ended = j.status in (Job.Status.FAILED, Job.Status.CANCELLED)
    return {
        "id": j.pk,
        "status": j.status,
        "created_at": j.created_at.isoformat(),
        "progress": (j.result or {}).get("progress") if j.status == Job.Status.RUNNING else None,
        "log_tail": j.log[-2000:] if ended else "",
        "cancel_url": f"/admin/latency/jobs/{j.pk}/cancel" if j.status in UNFINISHED else None,
    }


def benchmark_runs(limit: int = 10) -> list[dict[str, Any]]:
    return [
        {
            **job_fields(j),
            "finished_at": j.finished_at.isoformat() if j.finished_at else None,
            "summary": benchmark.summary(j.result) if j.result else {},
            "targets": j.result.get("targets", []) if j.result else [],
            "machine": j.result.get("machine", "") if j.result else "",
            "plot_url": f"/admin/latency/jobs/{j.pk}/file" if j.file else None,
        }
        for j in recent_jobs(Job.Kind.BENCHMARK, limit)
    ]


def kv_tier_status() -> dict[str, Any] | None:
    """The latest finished Redis KV tier upkeep pass (its size and what it warmed)."""
    job = (
        Job.objects.filter(kind=Job.Kind.KV_TIER, finished_at__isnull=False)
        .order_by("-finished_at", "-id")
        .first()
    )
    if job is None:
        return None
    return {**job_fields(job), "finished_at": job.finished_at.isoformat(), **job.result}


def tuning_runs(limit: int = 5) -> list[dict[str, Any]]:
    return [{**job_fields(j), "report": j.result} for j in recent_jobs(Job.Kind.TUNING, limit)]


def data(window: str, now: datetime | None = None) -> dict[str, Any]:
    length, bucket = WINDOWS[window]
    end = now or timezone.now()
    start = end - length
    if window == "5m":
        buckets = raw_buckets(start, end, bucket)
    else:
        buckets = rollup_buckets(start, end, bucket)
    lines = series(buckets, start, end, bucket)
    if window == "5m":
        # A reply can span several 10 s buckets; longer buckets come from rollups by minute.
        lines["out_tok_s"] = generated_tok_s(buckets, start, end, bucket)
    return {
        "window": window,
        "bucket_s": int(bucket.total_seconds()),
        "now": int(end.timestamp()),
        "series": lines,
        "summary": {**summary(buckets), **replays(start, end)},
        "slowest": slowest(start),
        "benchmarks": benchmark_runs(),
        "tuning": tuning_runs(),
        "kv_tier": kv_tier_status(),
    }
