"""The tuning job: replays a workload under each batching setting, reports goodput
under the latency targets, and applies the best setting on request."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from inference import tuning
from inference.client import get_engine_client, set_engine_client
from inference.engine import RequestMetrics
from inference.models import Job

pytestmark = pytest.mark.django_db


def finished(ttft: float, tpot: float, tokens: int = 11) -> RequestMetrics:
    t0 = time.time()
    m = RequestMetrics(arrival_time=t0, scheduled_time=t0)
    m.first_token_time = t0 + ttft
    m.finish_time = m.first_token_time + tpot * (tokens - 1)
    m.output_tokens = tokens
    return m


def test_goodput_counts_only_requests_that_meet_both_targets() -> None:
    done = [finished(0.2, 0.05), finished(2.0, 0.05), finished(0.2, 0.5), None]
    s = tuning.score(done, wall=2.0, ttft_target=1.0, tpot_target=0.1)
    assert s["met_targets"] == 1 and s["refused"] == 1 and s["requests"] == 4
    assert s["goodput_rps"] == pytest.approx(0.5)


def test_tuning_sweeps_the_grid_and_applies_the_best(staff_user, settings, tiny_model_dir) -> None:
    settings.ENGINE = {
        **settings.ENGINE,
        "MODEL": str(tiny_model_dir),
        "DTYPE": "float32",
        "KV_CACHE_MEMORY_MB": 32,
    }
    job = Job.objects.create(
        kind=Job.Kind.TUNING,
        params={
            "requests": 6,
            "rate": 30,
            "synthetic": True,
            "grid": {"MAX_NUM_BATCHED_TOKENS": [64, 512], "MAX_NUM_SEQS": [4]},
        },
    )
    from inference import tasks

    assert tasks.tune.apply((job.pk,)).get()["status"] == "done"
    job.refresh_from_db()
    report = job.result
    assert [r["settings"]["MAX_NUM_BATCHED_TOKENS"] for r in report["rows"]] == [64, 512]
    assert all(r["requests"] == 6 for r in report["rows"])
    assert report["best"] in [r["settings"] for r in report["rows"]]
    assert report["env"].startswith("ENGINE_MAX_NUM_BATCHED_TOKENS=")

    c = Client()
    c.force_login(staff_user)
    try:
        r = c.post(f"/admin/latency/tuning/{job.pk}/apply")
        assert r.status_code == 200
        engine = get_engine_client().engine
        assert engine.config.max_num_batched_tokens == report["best"]["MAX_NUM_BATCHED_TOKENS"]
        assert engine.config.max_num_seqs == 4
    finally:
        set_engine_client(None)
    data = c.get("/admin/latency/data?window=5m").json()
    assert data["tuning"][0]["id"] == job.pk
