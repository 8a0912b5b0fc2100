"""The tuning job: replays one workload under the current settings and their neighbours,
interleaved and repeated, on an engine that shares nothing between trials, and names a
winner only when it beats the current settings beyond the spread of the runs."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import Client

from chatapp.jobs.models import Job
from chatapp.observability import tuning
from inference.client import engine_config_from_settings, get_engine_client, set_engine_client
from inference.engine import RequestFigures

pytestmark = pytest.mark.django_db

TIER_URL = "redis://127.0.0.1:6379/4"  # the KV tier's database in the test settings
CURRENT = {
    "MAX_NUM_BATCHED_TOKENS": 512,
    "MAX_NUM_SEQS": 64,
    "SPECULATIVE_MODE": "",
    "CHAT_FLUSH_INTERVAL_MS": 30,
}
# Small enough for the tiny model to run twice in well under a minute: 4 settings x 3 runs.
SMALL = {
    "requests": 6,
    "rate": 30,
    "synthetic": True,
    "repeats": 3,
    "axes": {"MAX_NUM_SEQS": [4], "SPECULATIVE_MODE": ["ngram"], "CHAT_FLUSH_INTERVAL_MS": [0]},
}


def finished(ttft: float, tpot: float, tokens: int = 11) -> RequestFigures:
    t0 = time.time()
    m = RequestFigures(arrival_time=t0, scheduled_time=t0)
    m.first_token_time = t0 + ttft
    m.finish_time = m.first_token_time + tpot * (tokens - 1)
    m.output_tokens = tokens
    return m


@pytest.fixture
def tiny_settings(settings: Any, tiny_model_dir: Path) -> Any:
    settings.ENGINE = {
        **settings.ENGINE,
        **{k: v for k, v in CURRENT.items() if k != "CHAT_FLUSH_INTERVAL_MS"},
        "MODEL": str(tiny_model_dir),
        "DTYPE": "float32",
        "KV_CACHE_MEMORY_MB": 32,
        "KV_TIER_URL": TIER_URL,
    }
    settings.CHAT_FLUSH_INTERVAL_MS = 30
    return settings


def run_job(params: dict[str, Any]) -> dict[str, Any]:
    from chatapp.observability import tasks

    job = Job.objects.create(kind=Job.Kind.TUNING, params=params)
    outcome = tasks.tune.apply((job.pk,)).get()
    job.refresh_from_db()
    assert outcome["status"] == "done", job.log
    return job.result


# --- pure parts ----------------------------------------------------------------------------


def test_goodput_counts_only_requests_that_meet_both_targets() -> None:
    done = [finished(0.2, 0.05), finished(2.0, 0.05), finished(0.2, 0.5), None]
    s = tuning.score(done, wall=2.0, ttft_target=1.0, tpot_target=0.1)
    assert s["met_targets"] == 1 and s["refused"] == 1 and s["requests"] == 4
    assert s["goodput_rps"] == pytest.approx(0.5)


def test_trials_interleave_the_settings() -> None:
    order = tuning.trial_order(3, 3)
    assert "".join("ABC"[s] for s, _ in order) == "ABCABCABC"
    assert [r for _, r in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_the_sweep_varies_one_setting_at_a_time_around_the_current_ones() -> None:
    sweep = tuning.sweep_settings(CURRENT, tuning.DEFAULT_AXES)
    assert sweep[0] == CURRENT and len(sweep) == 9
    assert all(sum(s[k] != CURRENT[k] for k in CURRENT) == 1 for s in sweep[1:])
    assert {s["SPECULATIVE_MODE"] for s in sweep} == {"", "ngram", "auto"}
    assert {s["CHAT_FLUSH_INTERVAL_MS"] for s in sweep} == {15, 30, 60}
    # "off" is the empty mode; a value equal to the current one is not run twice.
    assert tuning.sweep_settings(CURRENT, {"SPECULATIVE_MODE": ["off", "ngram"]}) == [
        CURRENT,
        {**CURRENT, "SPECULATIVE_MODE": "ngram"},
    ]
    for bad in (
        {"MAX_NUM_SEQ": [8]},
        {"MAX_NUM_SEQS": []},
        {"MAX_NUM_SEQS": [0]},
        {"MAX_NUM_SEQS": ["8"]},
        {"SPECULATIVE_MODE": ["fast"]},
        {"CHAT_FLUSH_INTERVAL_MS": [-1]},
    ):
        with pytest.raises(ValueError):
            tuning.sweep_settings(CURRENT, bad)


def test_a_clear_winner_is_named() -> None:
    current = [1.00, 1.10, 1.05]
    better = [1.50, 1.60, 1.40]
    best = [1.70, 1.80, 1.75]
    assert tuning.decide([current, better]) == 1
    # Several beat the current settings: the highest median wins.
    assert tuning.decide([current, better, best]) == 2
    # The current settings need not come first.
    assert tuning.decide([better, current], current=1) == 0


def test_settings_that_beat_the_current_ones_but_not_each_other_tie() -> None:
    # As a CI run saw it: ngram and a flush interval of 0 both beat the current settings,
    # inside each other's range, and the higher median changed from one run to the next.
    current = [1.00, 1.10, 1.05]
    ngram = [1.40, 1.62, 1.50]
    flush0 = [1.45, 1.55, 1.60]
    assert tuning.contenders([current, ngram, flush0]) == [1, 2]
    assert tuning.decide([current, ngram, flush0]) is None
    assert tuning.decide([current, flush0, ngram]) is None
    # Apart from each other too: the one ahead wins, whatever the order.
    far = [1.80, 1.85, 1.90]
    assert tuning.decide([current, ngram, far]) == 2
    assert tuning.decide([current, far, ngram]) == 1
    # One that does not beat the current settings cannot spoil a winner.
    assert tuning.decide([current, [1.0, 1.7, 1.2], far]) == 2


def test_differences_inside_the_noise_keep_the_current_settings() -> None:
    # The three runs: the "best" changed each time, all within each other's range.
    current = [2.10, 2.40, 2.25]
    overlapping = [2.30, 2.60, 2.35]
    worse = [1.2, 1.3, 1.1]
    assert tuning.decide([current, overlapping, worse]) is None
    # Ranges apart, but by less than the margin: still noise for this rule.
    assert tuning.decide([[1.0, 1.0, 1.0], [1.03, 1.04, 1.03]]) is None
    assert tuning.decide([[1.0, 1.0, 1.0], [1.03, 1.04, 1.03]], margin=0.0) == 1
    # Nothing met the targets under the current settings: any real goodput beats it.
    assert tuning.decide([[0.0, 0.0, 0.0], [0.5, 0.4, 0.6]]) == 1
    assert tuning.decide([[0.0, 0.0, 0.0], [0.0, 0.4, 0.6]]) is None
    with pytest.raises(ValueError):
        tuning.decide([current, []])
    with pytest.raises(ValueError):
        tuning.decide([current], current=1)


def scored(goodput: float) -> dict[str, Any]:
    return {"requests": 6, "refused": 0, "met_targets": 6, "goodput_rps": goodput,
            "throughput_tok_s": 90.0, "ttft_p50": 0.02, "ttft_p99": 0.05, "tpot_p50": 0.004,
            "tpot_p99": 0.01, "cached_tokens": 0, "wall_s": 0.6}  # fmt: skip


def test_the_report_names_the_winner_or_keeps_the_current_settings() -> None:
    seqs8 = {**CURRENT, "MAX_NUM_SEQS": 8}
    ngram = {**CURRENT, "SPECULATIVE_MODE": "ngram"}
    runs = [[scored(g) for g in gs] for gs in ([2.0, 2.2, 2.1], [3.0, 2.9, 3.1], [2.1, 2.3, 2.2])]
    report = tuning.verdict_of(CURRENT, [CURRENT, seqs8, ngram], runs)
    assert report["winner"] == report["best"] == seqs8
    assert report["verdict"] == (
        "MAX_NUM_SEQS=8 beats the current settings: goodput 2.90-3.10 req/s against 2.00-2.20"
    )
    assert report["env"] == (
        "ENGINE_MAX_NUM_BATCHED_TOKENS=512 ENGINE_MAX_NUM_SEQS=8 ENGINE_SPECULATIVE_MODE= "
        "CHAT_FLUSH_INTERVAL_MS=30"
    )
    row = report["rows"][1]
    assert row["label"] == "MAX_NUM_SEQS=8" and not row["current"]
    assert row["goodput_rps"] == {"median": 3.0, "min": 2.9, "max": 3.1}
    assert [r["label"] for r in report["rows"]] == [
        "current",
        "MAX_NUM_SEQS=8",
        "SPECULATIVE_MODE=ngram",
    ]

    report = tuning.verdict_of(CURRENT, [CURRENT, seqs8, ngram], [runs[0], runs[2], runs[2]])
    assert report["winner"] is report["best"] is None
    assert report["verdict"] == tuning.KEEP_CURRENT and report["env"] == ""
    with pytest.raises(ValueError):
        tuning.verdict_of(CURRENT, [seqs8, CURRENT], runs[:2])


@pytest.mark.parametrize(
    "params",
    [
        {"repeats": 2},
        {"grid": {"MAX_NUM_SEQS": [8]}},
        {"axes": ["MAX_NUM_SEQS"]},
        {"axes": {"MAX_NUM_BATCHED_TOKENS": list(range(1, 40))}},  # too many trials
    ],
)
def test_bad_parameters_are_refused_before_any_engine_loads(params: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        tuning.run(params)


# --- on the tiny model --------------------------------------------------------------------


def tier_keys(r: redis.Redis, namespace: str) -> int:
    return sum(1 for _ in r.scan_iter(match=f"{namespace}:*", count=1000))


def test_trials_leave_the_real_kv_tier_alone_and_start_cold(tiny_settings: Any) -> None:
    namespace = f"test-tuning-{os.getpid()}"
    tiny_settings.ENGINE = {**tiny_settings.ENGINE, "KV_TIER_NAMESPACE": namespace}
    r = redis.Redis.from_url(TIER_URL)
    try:
        assert tier_keys(r, namespace) == 0
        report = run_job({**SMALL, "axes": {"MAX_NUM_SEQS": [4]}})
        assert tier_keys(r, namespace) == 0
        assert report["method"]["kv_tier"] == "off"
        runs = [run for row in report["rows"] for run in row["runs"]]
        assert len(runs) == 6 and all(run["requests"] == 6 for run in runs)
        # Every trial sends the same prompts: a prefix cache kept from an earlier trial
        # would show here.
        assert all(run["cached_tokens"] == 0 for run in runs)

        # The same replay on an engine built from these settings (tier on, memory kept)
        # does both: the checks above can see it.
        from inference.engine.engine import LLMEngine

        engine = LLMEngine(engine_config_from_settings())
        load = tuning.synthetic_workload(6, 30)
        vocab = engine.runner.model.vocab_size
        try:
            tuning.replay(engine, load, vocab)
            again = tuning.replay(engine, load, vocab)
        finally:
            engine.close()
        assert sum(s.cached_tokens for s in again if s is not None) > 0
        assert tier_keys(r, namespace) > 0
    finally:
        keys = list(r.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            r.delete(*keys)


def test_tuning_twice_on_the_same_load_agrees(tiny_settings: Any) -> None:
    """The issue's acceptance test: the same winner both times, or no clear winner.

    Five runs a setting: on the tiny model two settings beat the current ones by about
    the same (no flush delay, ngram), and with three runs each the full suite's noise
    twice let each be named over the other."""
    repeats = 5
    reports = [run_job({**SMALL, "repeats": repeats}), run_job({**SMALL, "repeats": repeats})]
    for report in reports:
        assert report["current"] == CURRENT
        assert [row["label"] for row in report["rows"]] == [
            "current",
            "MAX_NUM_SEQS=4",
            "SPECULATIVE_MODE=ngram",
            "CHAT_FLUSH_INTERVAL_MS=0",
        ]
        assert [t["setting"] for t in report["trials"]] == [0, 1, 2, 3] * repeats
        for row in report["rows"]:
            assert len(row["runs"]) == repeats
            assert all(run["requests"] == 6 for run in row["runs"])
            g = row["goodput_rps"]
            assert g["min"] <= g["median"] <= g["max"]
        if report["winner"] is None:
            assert report["verdict"] == tuning.KEEP_CURRENT and report["env"] == ""
        else:
            assert report["winner"] in [row["settings"] for row in report["rows"][1:]]
            assert report["env"] == tuning.env_lines(report["winner"])
    first, second = (r["winner"] for r in reports)
    assert first == second or None in (first, second), (first, second)


def test_apply_restarts_the_engine_with_the_winner(tiny_settings: Any, staff_user: Any) -> None:
    winner = {**CURRENT, "MAX_NUM_BATCHED_TOKENS": 256, "CHAT_FLUSH_INTERVAL_MS": 15}
    won = Job.objects.create(
        kind=Job.Kind.TUNING,
        status=Job.Status.DONE,
        result={"best": winner, "winner": winner, "env": tuning.env_lines(winner)},
    )
    kept = Job.objects.create(
        kind=Job.Kind.TUNING,
        status=Job.Status.DONE,
        result={"best": None, "winner": None, "verdict": tuning.KEEP_CURRENT, "env": ""},
    )
    c = Client()
    c.force_login(staff_user)
    try:
        r = c.post(f"/admin/latency/tuning/{kept.pk}/apply")
        assert r.status_code == 409 and "no winner" in r.json()["error"]["message"]
        r = c.post(f"/admin/latency/tuning/{won.pk}/apply")
        assert r.status_code == 200 and r.json()["env"].startswith("ENGINE_MAX_NUM_BATCHED")
        engine = get_engine_client().engine
        assert engine.config.max_num_batched_tokens == 256
        assert engine.config.max_num_seqs == 64
        assert tiny_settings.CHAT_FLUSH_INTERVAL_MS == 15
        # The next run compares against what now runs.
        assert tuning.current_settings() == winner
    finally:
        set_engine_client(None)
    data = c.get("/admin/latency/data?window=5m").json()
    assert data["tuning"][0]["id"] == kept.pk
