"""Seeded observability figures: request records and engine samples for the last few
minutes, as the dashboard, the rollups and the offline jobs read them. A plain helper, for
tests in any folder and for the server processes they start (`from tests.records import
seed`)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from chatapp.observability import percentiles
from chatapp.observability.models import EngineSample, RequestRecord


def seed(now: datetime, minutes: int = 3, per_minute: int = 40, seed: int = 7) -> list:
    """Request records and engine samples for `minutes` whole minutes before `now`,
    with spread-out latencies, a few errors, and growing prefix-cache totals."""
    rng = random.Random(seed)
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes)
    rows = []
    for m in range(minutes):
        for i in range(per_minute):
            at = start + timedelta(minutes=m, seconds=rng.uniform(0, 59.9))
            gaps = [rng.lognormvariate(-3.5, 0.5) for _ in range(rng.randint(2, 40))]
            queue = rng.uniform(0.0, 0.2) * (m + 1)
            prefill = rng.uniform(0.02, 0.3)
            error = "busy" if i % 13 == 0 else ""
            rows.append(
                RequestRecord(
                    finished_at=at,
                    source="chat" if i % 2 else "api",
                    request_id=f"r{m}-{i}",
                    ttft=queue + prefill,
                    tpot=sum(gaps) / len(gaps),
                    itl_p50=percentiles.percentile(gaps, 50),
                    itl_p99=percentiles.percentile(gaps, 99),
                    itl_hist=percentiles.histogram(gaps),
                    queue_time=queue,
                    prefill_time=prefill,
                    decode_time=sum(gaps),
                    network_time=rng.uniform(0, 0.01),
                    e2e=queue + prefill + sum(gaps),
                    prompt_tokens=100,
                    cached_tokens=rng.randint(0, 100),
                    output_tokens=len(gaps) + 1,
                    finish_reason="error" if error else "stop",
                    error_code=error,
                )
            )
    RequestRecord.objects.bulk_create(rows)
    samples = []
    queries = hits = 0
    for k in range(minutes * 12):
        queries += 500
        hits += 200 + k
        samples.append(
            EngineSample(
                at=start + timedelta(seconds=5 * k + 1),
                worker="w1",
                running=k % 8,
                waiting=k % 3,
                batch_size=k % 8,
                step_tokens=64,
                kv_usage=(k % 10) / 10,
                prefix_queries=queries,
                prefix_hits=hits,
                refused=k // 10,
            )
        )
    EngineSample.objects.bulk_create(samples)
    return rows
