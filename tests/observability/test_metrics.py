"""/metrics: vLLM's names, fed by real requests, readable by staff or a bearer token."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.test import Client

from chatapp.observability import engine_samples, recording
from chatapp.observability.models import RequestRecord
from chatapp.openai_api import streams
from inference import metrics
from inference.catalog import model_name
from inference.engine import RequestFigures, SamplingParams
from tests.engines import make_engine_client

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
VLLM_NAMES = (
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_bucket",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:iteration_tokens_total_bucket",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "chatapp:engine_step_tokens",
)


def sample_value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        named = line.startswith(name + "{") or line.startswith(name + " ")
        if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def fake_figures(ttft: float = 0.25, tokens: int = 5) -> RequestFigures:
    t0 = time.time() - 2
    m = RequestFigures(arrival_time=t0, scheduled_time=t0 + 0.05)
    m.first_token_time = t0 + ttft
    m.token_times = [m.first_token_time + 0.02 * i for i in range(tokens)]
    m.finish_time = m.token_times[-1]
    m.prompt_tokens, m.cached_tokens, m.output_tokens = 40, 16, tokens
    return m


def test_anonymous_gets_401_and_plain_user_403(plain_user, settings) -> None:
    settings.METRICS_BEARER_TOKEN = "s3cret-token"
    assert Client().get("/metrics").status_code == 401
    c = Client()
    c.force_login(plain_user)
    assert c.get("/metrics").status_code == 403
    wrong = Client(headers={"Authorization": "Bearer nope"})
    assert wrong.get("/metrics").status_code == 401


def test_staff_and_bearer_token_can_read(staff_user, settings) -> None:
    settings.METRICS_BEARER_TOKEN = "s3cret-token"
    c = Client()
    c.force_login(staff_user)
    r = c.get("/metrics")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/plain")
    r = Client(headers={"Authorization": "Bearer s3cret-token"}).get("/metrics")
    assert r.status_code == 200


def test_no_token_configured_means_no_bearer_access(settings) -> None:
    settings.METRICS_BEARER_TOKEN = ""
    assert Client(headers={"Authorization": "Bearer "}).get("/metrics").status_code == 401


@pytest.mark.django_db(transaction=True)
async def test_a_recorded_request_shows_in_the_histograms_and_is_stored(settings) -> None:
    settings.METRICS_BEARER_TOKEN = "t"
    before = metrics.exposition()[0].decode()
    model = model_name(settings.ENGINE["MODEL"])
    ttft_count = "vllm:time_to_first_token_seconds_count"
    await recording.record_request("chat", "req-1", fake_figures(0.25, 5), "stop")
    after = metrics.exposition()[0].decode()
    assert sample_value(after, ttft_count, model_name=model) == (
        sample_value(before, ttft_count, model_name=model) + 1
    )
    itl = "vllm:inter_token_latency_seconds_count"
    assert sample_value(after, itl, model_name=model) == sample_value(before, itl) + 4
    rec = await RequestRecord.objects.aget(request_id="req-1")
    assert rec.ttft == pytest.approx(0.25)
    assert rec.queue_time == pytest.approx(0.05)
    assert rec.prefill_time == pytest.approx(0.20)
    assert rec.itl_p50 == pytest.approx(0.02)
    assert rec.tpot == pytest.approx(0.02)
    assert (rec.prompt_tokens, rec.cached_tokens, rec.output_tokens) == (40, 16, 5)


@pytest.mark.django_db(transaction=True)
async def test_a_real_engine_request_fills_every_vllm_metric(tiny_model_dir, settings) -> None:
    settings.METRICS_BEARER_TOKEN = "t"
    client = make_engine_client(tiny_model_dir)
    try:
        ids = list(range(100, 140))
        stream = streams.recorded_stream(
            client.generate(
                ids,
                SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
                request_id="api-real",
            ),
            source="api",
        )
        out = [d async for d in stream]
        assert out[-1].finished
        rec = await RequestRecord.objects.aget(request_id="api-real")
        assert rec.output_tokens == 6 and rec.prompt_tokens == 40
        assert rec.ttft is not None and rec.ttft > 0 and rec.itl_p99 is not None
        assert rec.finish_reason == "length"
        engine_stats = client.stats()
        engine_samples.update_prometheus(engine_stats)
        text = metrics.exposition()[0].decode()
        for name in VLLM_NAMES:
            assert name in text, name
        # The engine counts queries in whole KV blocks.
        queried = sample_value(text, "vllm:prefix_cache_queries_total")
        assert queried >= engine_stats["prefix_cache_queries"] > 0
        # Tokens per step: one 40-token prefill step, then 1-token decode steps.
        steps = engine_stats["total_steps"]
        assert sample_value(text, "vllm:iteration_tokens_total_count") >= steps > 0
        assert sample_value(text, "vllm:iteration_tokens_total_bucket", le="1.0") >= steps - 1
        assert sample_value(text, "vllm:iteration_tokens_total_sum") >= 40 + steps - 1
    finally:
        client.shutdown()


def test_metrics_merge_across_processes(tmp_path) -> None:
    """With PROMETHEUS_MULTIPROC_DIR set, what each server process records is summed."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    observe = (
        "from inference import metrics; "
        "metrics.time_to_first_token.labels('m').observe(0.1); "
        "metrics.num_requests_running.labels('m', 'embedded').set(3)"
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", observe], cwd=ROOT, env=env, check=True)
    expose = "from inference import metrics; print(metrics.exposition()[0].decode())"
    out = subprocess.run(
        [sys.executable, "-c", expose],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert sample_value(out, "vllm:time_to_first_token_seconds_count", model_name="m") == 2.0
