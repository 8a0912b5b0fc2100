"""/metrics has one series per engine: the engine figures carry a `worker` label, each
engine worker's id in distributed mode and `embedded` for the one in-process engine."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from redis import Redis
from redis import asyncio as aioredis

from chatapp.observability import engine_samples
from inference import metrics
from inference.catalog import model_name
from inference.engine import SamplingParams
from inference.workers.registry import Registry, WorkerInfo
from tests.engine_workers import REDIS_URL, cleanup, distributed_client
from tests.engines import make_engine_client
from tests.observability.test_metrics import sample_value


def worker_stats(running: int, hits: int, steps: int) -> dict[str, int]:
    return {"running": running, "waiting": 1, "kv_blocks_used": running, "kv_blocks_total": 10,
            "prefix_cache_queries": 2 * hits, "prefix_cache_hits": hits, "total_steps": steps,
            "step_tokens_le_1": steps, "step_tokens_sum": steps}  # fmt: skip


def beat(namespace: str, *infos: WorkerInfo, remove: str = "") -> None:
    async def go() -> None:
        redis = aioredis.Redis.from_url(REDIS_URL)
        registry = Registry(redis, namespace, dead_after_s=60)
        for info in infos:
            await registry.beat(info)
        if remove:
            await registry.remove(remove)
        await redis.aclose()

    asyncio.run(go())


def test_each_worker_gets_its_own_series_and_a_gone_one_s_queue_drops(
    tiny_model_dir: Path,
) -> None:
    namespace = f"test-{uuid.uuid4().hex[:10]}"
    a, b = f"wa-{uuid.uuid4().hex[:6]}", f"wb-{uuid.uuid4().hex[:6]}"

    def info(wid: str, **stats: int) -> WorkerInfo:
        return WorkerInfo(id=wid, channel=f"engine.worker.{wid}", incarnation="1",
                          stats=worker_stats(**stats))  # fmt: skip

    try:
        beat(namespace, info(a, running=2, hits=30, steps=7), info(b, running=5, hits=4, steps=3))
        with distributed_client(tiny_model_dir, namespace) as client:
            model = model_name(settings.ENGINE["MODEL"])
            stats = client.stats()
            assert stats["running"] == 7  # the summed figure is still what stats() says
            engine_samples.update_prometheus(stats)
            text = metrics.exposition()[0].decode()
            running = "vllm:num_requests_running"
            assert sample_value(text, running, model_name=model, worker=a) == 2
            assert sample_value(text, running, model_name=model, worker=b) == 5
            hits = "vllm:prefix_cache_hits_total"
            assert sample_value(text, hits, model_name=model, worker=a) == 30
            assert sample_value(text, hits, model_name=model, worker=b) == 4
            usage = "vllm:kv_cache_usage_perc"
            assert sample_value(text, usage, model_name=model, worker=b) == pytest.approx(0.5)
            steps = "vllm:iteration_tokens_total_count"
            assert sample_value(text, steps, model_name=model, worker=a) == 7

            # b goes away; a works on: its counters grow by what it did since.
            beat(namespace, info(a, running=1, hits=50, steps=9), remove=b)
            engine_samples.update_prometheus(client.stats())
            text = metrics.exposition()[0].decode()
            assert sample_value(text, running, model_name=model, worker=a) == 1
            assert f'worker="{b}"' not in "\n".join(
                line for line in text.splitlines() if line.startswith(running)
            )
            assert sample_value(text, hits, model_name=model, worker=a) == 50
            assert sample_value(text, hits, model_name=model, worker=b) == 4  # counters stay
            # Redis away: nothing is known, so no series moves (none becomes `embedded`).
            away = {"running": 0, "waiting": 0, "workers": [], "mode": "distributed",
                    "error": "cannot reach the engine workers"}  # fmt: skip
            assert engine_samples.engines_of(away) is None
            engine_samples.update_prometheus(away)
            after = metrics.exposition()[0].decode()
            assert sample_value(after, running, model_name=model, worker=a) == 1
    finally:
        cleanup(Redis.from_url(REDIS_URL), namespace)


@pytest.mark.django_db(transaction=True)
async def test_the_embedded_engine_has_one_stable_worker_label(tiny_model_dir: Path) -> None:
    client = make_engine_client(tiny_model_dir)
    try:
        sampling = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        async for _ in client.generate(list(range(100, 140)), sampling):
            pass
        stats = client.stats()
        engine_samples.update_prometheus(stats)
        text = metrics.exposition()[0].decode()
        model = model_name(settings.ENGINE["MODEL"])
        queries = "vllm:prefix_cache_queries_total"
        assert stats["prefix_cache_queries"] > 0
        queried = sample_value(text, queries, model_name=model, worker="embedded")
        assert queried >= stats["prefix_cache_queries"]
        assert sample_value(text, "vllm:num_requests_running", worker="embedded") == 0
        assert 'vllm:num_requests_running{model_name="' + model + '",worker="embedded"}' in text
        upstream = {"upstream": "http://127.0.0.1:9/v1", "running": 1, "waiting": 0}
        assert list(engine_samples.engines_of(upstream) or {}) == ["upstream"]
    finally:
        client.shutdown()
