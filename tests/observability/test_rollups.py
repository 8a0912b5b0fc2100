"""Per-minute rollups agree with the raw rows they summarise."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from chatapp.observability import dashboard, percentiles, rollups
from chatapp.observability.models import EngineSample, MinuteRollup, RequestRecord
from tests.records import seed

pytestmark = pytest.mark.django_db


def test_rollup_percentiles_and_sums_match_the_raw_rows() -> None:
    now = timezone.now()
    rows = seed(now, minutes=3)
    assert rollups.rollup_since(now=now) == 3
    assert MinuteRollup.objects.count() == 3
    for r in MinuteRollup.objects.all():
        raw = [x for x in rows if rollups.floor_minute(x.finished_at) == r.minute]
        assert r.requests == len(raw)
        assert r.output_tokens == sum(x.output_tokens for x in raw)
        assert r.cached_tokens == sum(x.cached_tokens for x in raw)
        assert r.errors == {"busy": sum(1 for x in raw if x.error_code == "busy")}
        for name in ("ttft", "e2e", "queue_time", "tpot"):
            values = [getattr(x, name) for x in raw]
            for q in (50, 90, 99):
                assert r.percentiles[f"{name}_p{q}"] == pytest.approx(np.percentile(values, q))
        # ITL over all the minute's gaps: from merged histograms, within a bucket's width.
        gaps_hist = percentiles.merge(x.itl_hist for x in raw)
        assert sum(gaps_hist.values()) == sum(x.output_tokens - 1 for x in raw)
        assert r.percentiles["itl_p50"] == pytest.approx(percentiles.hist_percentile(gaps_hist, 50))


def test_itl_from_histograms_is_within_a_bucket_of_the_exact_percentile() -> None:
    rng = np.random.default_rng(1)
    gaps = list(rng.lognormal(-3.5, 0.6, 5000))
    hist = percentiles.histogram(gaps)
    for q in (50, 90, 99):
        assert percentiles.hist_percentile(hist, q) == pytest.approx(
            np.percentile(gaps, q), rel=0.15
        )


def test_engine_samples_roll_up_to_averages_and_counter_increases() -> None:
    now = timezone.now()
    seed(now, minutes=2)
    rollups.rollup_since(now=now)
    first, second = MinuteRollup.objects.order_by("minute")
    samples = list(EngineSample.objects.order_by("at"))
    in_second = [s for s in samples if rollups.floor_minute(s.at) == second.minute]
    assert second.samples == len(in_second) == 12
    assert second.running_avg == pytest.approx(np.mean([s.running for s in in_second]))
    assert second.kv_usage_avg == pytest.approx(np.mean([s.kv_usage for s in in_second]))
    # The running totals grew by (last of this minute) - (last of the minute before).
    before = [s for s in samples if s.at < second.minute][-1]
    assert second.prefix_hits == in_second[-1].prefix_hits - before.prefix_hits
    assert second.prefix_queries == 12 * 500
    assert first.prefix_queries == 11 * 500  # the first sample has nothing before it


def test_rollup_is_idempotent_and_picks_up_late_rows() -> None:
    now = timezone.now()
    seed(now, minutes=2)
    rollups.rollup_since(now=now)
    before = {r.minute: r.requests for r in MinuteRollup.objects.all()}
    rollups.rollup_since(now=now)
    assert {r.minute: r.requests for r in MinuteRollup.objects.all()} == before
    late = RequestRecord.objects.order_by("finished_at").last()
    late.pk = None
    late.save()
    rollups.rollup_since(now=now)
    minute = rollups.floor_minute(late.finished_at)
    assert MinuteRollup.objects.get(minute=minute).requests == before[minute] + 1


def test_prune_drops_old_raw_rows_but_keeps_rollups() -> None:
    now = timezone.now()
    seed(now - timedelta(days=3), minutes=2)
    seed(now, minutes=1, seed=8)
    rollups.rollup_since(since=now - timedelta(days=4), now=now)
    assert MinuteRollup.objects.count() == 3
    removed = rollups.prune(raw_hours=48, rollup_days=90, now=now)
    assert removed["records"] == 80
    assert RequestRecord.objects.filter(finished_at__lt=now - timedelta(hours=48)).count() == 0
    assert RequestRecord.objects.count() == 40
    assert MinuteRollup.objects.count() == 3
    rollups.prune(raw_hours=48, rollup_days=1, now=now)
    assert MinuteRollup.objects.count() == 1


def test_prune_keeps_raw_rows_that_are_not_rolled_up_yet() -> None:
    now = timezone.now()
    seed(now - timedelta(days=3), minutes=1)
    rollups.prune(raw_hours=48, rollup_days=90, now=now)
    assert RequestRecord.objects.count() == 40


def test_dashboard_hour_window_shows_the_rollups_and_coarse_windows_merge_them() -> None:
    now = timezone.now()
    rows = seed(now, minutes=3)
    rollups.rollup_since(now=now)
    hour = dashboard.data("1h", now=now)
    by_t = dict(zip(hour["series"]["t"], hour["series"]["ttft_p99"], strict=True))
    for r in MinuteRollup.objects.all():
        assert by_t[int(r.minute.timestamp())] == pytest.approx(r.percentiles["ttft_p99"])
    assert hour["summary"]["requests"] == len(rows)
    day = dashboard.data("24h", now=now)
    assert sum(v or 0 for v in day["series"]["requests"]) == len(rows)
    exact = np.percentile([x.ttft for x in rows], 50)
    assert day["summary"]["ttft_p50"] == pytest.approx(exact, rel=0.1)
    # Raw rows for the live window: 10-second buckets straight from the records.
    live = dashboard.data("5m", now=now)
    assert live["bucket_s"] == 10
    assert sum(v or 0 for v in live["series"]["requests"]) == sum(
        1 for x in rows if x.finished_at >= now - timedelta(minutes=5)
    )
    slowest = live["slowest"]
    assert slowest[0]["e2e"] == max(x.e2e for x in rows)
    assert {"queue", "prefill", "decode", "network"} <= set(slowest[0])
