"""An engine worker's drain on SIGTERM (a rolling restart, a scale down), against real
worker processes: it takes no new request from then on (the routing skips it), finishes
the replies it has within ENGINE_WORKER_DRAIN_S, deregisters and exits 0; a reply still
running at the deadline ends with the clear "worker was stopped" error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis import asyncio as aioredis

from inference.backends.embedded import WorkerModels
from inference.engine import SamplingParams
from inference.workers.registry import Registry, WorkerInfo
from tests.engine_workers import (
    REDIS_URL,
    distributed_client,
    fresh_namespace,
    workers_running,
)

pytestmark = pytest.mark.slow

# Long enough to be running when the SIGTERM comes, short enough to end within the drain.
SHORT = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
LONG = SamplingParams(max_tokens=1500, temperature=0, ignore_eos=True)
# A reply that outlasts a 1 s drain: sampled with a seed, so speculation never guesses it
# (the tiny model's greedy reply repeats a token, and with every guess kept LONG can end
# inside the drain), as long as the tiny model's context allows.
LONGEST = SamplingParams(max_tokens=2040, temperature=1.0, seed=1, ignore_eos=True)


@pytest.fixture
def namespace(redis: Redis) -> Iterator[str]:
    """One per test (conftest's is the module's): a stopped worker's keys go with it."""
    with fresh_namespace(redis) as ns:
        yield ns


async def last_delta(stream: Any) -> Any:
    deltas = [delta async for delta in stream]
    return deltas[-1]


async def test_a_rolling_restart_under_load_loses_no_accepted_request(
    tmp_path: Path, tiny_model_dir: Path, namespace: str, redis: Redis
) -> None:
    """Replies spread over two workers; one is stopped while they stream. Every reply,
    on it included, completes; requests sent during its drain go to the other one."""
    with (
        workers_running(
            tmp_path, tiny_model_dir, namespace, redis, "old", "new", ENGINE_WORKER_DRAIN_S="60"
        ) as (old, new),
        distributed_client(tiny_model_dir, namespace) as client,
    ):
        streams = [client.generate([40 + i, 41, 42], SHORT, session_id=f"s{i}") for i in range(6)]
        firsts = [await s.__anext__() for s in streams]
        assert all(not d.finished for d in firsts)
        running = {k.decode() for k in redis.keys(f"{namespace}:worker:*")}
        assert len(running) == 2
        on_old = WorkerInfo.from_json(redis.get(old.key) or b"{}").requests
        assert on_old, "the load was spread over both workers"

        old.kill(15)  # SIGTERM
        deadline = time.monotonic() + 10
        # Draining, or already drained and gone (its short replies can all end between two
        # looks; a gone worker's key reads as nothing).
        while (info := redis.get(old.key)) is not None and not WorkerInfo.from_json(info).draining:
            assert time.monotonic() < deadline, "the worker never said it is draining"
            await asyncio.sleep(0.05)
        late = [client.generate([60 + i, 61], SHORT, session_id=f"late{i}") for i in range(3)]
        ends = await asyncio.gather(*(last_delta(s) for s in [*streams, *late]))
        assert [d.finish_reason for d in ends] == ["length"] * len(ends), [d.error for d in ends]
        workers = [getattr(d.figures, "worker", None) for d in ends]
        assert old.id in workers[:6], "the stopped worker finished its own replies"
        assert set(workers[6:]) == {new.id}, "nothing new went to the draining worker"
        assert old.proc is not None and old.proc.wait(timeout=60) == 0
        assert not redis.exists(old.key), "deregistered"


async def test_replies_past_the_drain_deadline_end_with_a_clear_error(
    tmp_path: Path, tiny_model_dir: Path, namespace: str, redis: Redis
) -> None:
    with (
        workers_running(
            tmp_path, tiny_model_dir, namespace, redis, "solo", ENGINE_WORKER_DRAIN_S="1"
        ) as (solo,),
        distributed_client(tiny_model_dir, namespace) as client,
    ):
        stream = client.generate([42, 43, 44], LONGEST)
        await stream.__anext__()
        solo.kill(15)
        stopped = time.monotonic()
        last = await last_delta(stream)
        assert 0.9 < time.monotonic() - stopped < 5
        assert last.finished and last.finish_reason == "error", last
        assert "worker was stopped" in last.error
        assert solo.proc is not None and solo.proc.wait(timeout=30) == 0
        assert not redis.exists(solo.key)


async def test_a_draining_worker_does_not_count_as_serving_for_readiness(
    namespace: str, redis: Redis
) -> None:
    """/healthz's engine check (WorkerModels.health): a model whose only worker drains has
    no worker for new chats, so the deployment is not ready until another one serves it."""
    client = aioredis.Redis.from_url(REDIS_URL)
    registry = Registry(client, namespace, dead_after_s=30)
    models = WorkerModels(REDIS_URL, namespace, dead_after_s=30)
    try:
        info = WorkerInfo(id="w1", channel="c1", incarnation="i1", model="tiny")
        await registry.beat(info)
        assert models.health("tiny") == (True, "1 live engine worker(s) serve tiny")
        info.draining = True
        await registry.beat(info)
        ok, why = models.health("tiny")
        assert not ok and "1 draining" in why, why
        await registry.beat(WorkerInfo(id="w2", channel="c2", incarnation="i2", model="tiny"))
        assert models.health("tiny")[0]
    finally:
        models.close()
        await client.aclose()
