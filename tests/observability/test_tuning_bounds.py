"""The default tuning run finishes (issue 47, point 7): recorded arrival gaps are
compressed, each trial is cut at its time limit (what it cut misses the targets), and the
run tells its progress as it goes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from chatapp.observability import tuning
from inference.client import engine_config_from_settings

pytestmark = pytest.mark.django_db

SMALL = {
    "requests": 6,
    "synthetic": True,
    "repeats": 3,
    "axes": {"MAX_NUM_SEQS": [4]},
}


@pytest.fixture
def tiny(settings: Any, tiny_model_dir: Path) -> Any:
    settings.ENGINE = {**settings.ENGINE, "MODEL": str(tiny_model_dir), "DTYPE": "float32",
                       "KV_CACHE_MEMORY_MB": 32, "MAX_NUM_SEQS": 64, "KV_TIER_URL": ""}  # fmt: skip
    return settings


def test_ten_minutes_of_recorded_arrivals_are_squeezed_into_the_span_keeping_their_order() -> None:
    # The case: 24 requests over 599 s, each trial replaying them in real time.
    load = [tuning.Request(at=i * 599 / 23, prompt_len=10, output_len=5) for i in range(24)]
    squeezed, factor = tuning.compress(load, 30.0)
    assert squeezed[-1].at == pytest.approx(30.0) and factor == pytest.approx(30 / 599)
    assert [q.at for q in squeezed] == sorted(q.at for q in squeezed)
    assert squeezed[12].at == pytest.approx(load[12].at * factor)
    short = [tuning.Request(at=float(i), prompt_len=10, output_len=5) for i in range(3)]
    assert tuning.compress(short, 30.0) == (short, 1.0)  # never stretched


def test_a_trial_is_cut_at_its_limit_and_what_it_cut_misses_the_targets(tiny: Any) -> None:
    from inference.engine.engine import LLMEngine

    engine = LLMEngine(engine_config_from_settings())
    longest = engine.max_model_len // 2
    load = [tuning.Request(at=0.2 * i, prompt_len=20, output_len=longest) for i in range(4)]
    load.append(tuning.Request(at=60.0, prompt_len=20, output_len=8))  # never sent
    try:
        started = time.monotonic()
        seen = tuning.replay(engine, load, engine.runner.model.vocab_size, limit_s=0.5)
        took = time.monotonic() - started
    finally:
        engine.close()
    assert took < 10
    scored = tuning.score(seen, took, ttft_target=10.0, tpot_target=10.0)
    assert scored["requests"] == 5 and scored["refused"] == 0
    assert scored["cut"] >= 1 and scored["met_targets"] == 5 - scored["cut"]


def test_the_run_reports_progress_before_each_trial_and_its_bounds(tiny: Any) -> None:
    seen: list[dict[str, Any]] = []
    # Six requests at 0.2/s span about half a minute; squeezed into one second.
    report = tuning.run({**SMALL, "rate": 0.2, "max_span_s": 1.0}, seen.append)
    assert [p["trials_done"] for p in seen] == list(range(7))
    assert all(p["trials"] == 6 for p in seen)
    assert report["arrivals_compressed_by"] < 0.2
    assert report["trial_limit_s"] == tuning.DEFAULT_TRIAL_LIMIT_S
    assert all(run["wall_s"] < 10 for row in report["rows"] for run in row["runs"])


def test_the_dashboard_cancels_an_unfinished_run_once_and_shows_its_progress(
    staff_user: Any,
) -> None:
    from django.test import Client

    from chatapp.jobs.models import Job

    job = Job.objects.create(kind=Job.Kind.TUNING, status=Job.Status.RUNNING,
                             result={"progress": {"trials_done": 4, "trials": 27}})  # fmt: skip
    c = Client()
    c.force_login(staff_user)
    shown = c.get("/admin/latency/data?window=5m").json()["tuning"][0]
    assert shown["progress"] == {"trials_done": 4, "trials": 27}
    assert shown["cancel_url"] == f"/admin/latency/jobs/{job.pk}/cancel"
    assert c.post(shown["cancel_url"]).status_code == 200
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED and job.finished_at is not None
    assert c.post(shown["cancel_url"]).status_code == 409
    assert c.get("/admin/latency/data?window=5m").json()["tuning"][0]["cancel_url"] is None
