"""Affinity without a `user`: an API client that resends a growing history (and never
names a session) stays on the worker that holds its KV, found by digests of its prompt's
first blocks. Two real `manage.py run_engine` workers on the tiny model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from inference.backends.remote import (
    PREFIX_AFFINITY_SLACK,
    PREFIX_BLOCK_TOKENS,
    PREFIX_BLOCKS,
    choose_worker,
    prefix_keys,
)
from inference.engine import SamplingParams
from inference.workers.registry import Keys, WorkerInfo
from tests.engine_workers import Worker, cleanup, workers_running


def test_prefix_keys_are_a_chain_over_the_first_blocks_salted_by_the_owner() -> None:
    history = list(range(1000, 1000 + 5 * PREFIX_BLOCK_TOKENS + 7))
    keys = prefix_keys(history)
    assert len(keys) == 5  # full blocks only: the 7 tokens after them are not keyed
    grown = prefix_keys(history + list(range(40, 40 + 3 * PREFIX_BLOCK_TOKENS)))
    assert grown[:5] == keys and len(set(grown)) == len(grown) == 8
    assert len(prefix_keys(list(range(100_000)))) == PREFIX_BLOCKS  # the first 256 tokens
    assert prefix_keys(history[: PREFIX_BLOCK_TOKENS - 1]) == []  # shorter: route by load
    assert prefix_keys(history, "alice-salt") != keys
    assert prefix_keys(history, "alice-salt") != prefix_keys(history, "bob-salt")
    other = history.copy()
    other[3] += 1
    assert not set(prefix_keys(other)) & set(keys)


def _worker(wid: str, running: int) -> WorkerInfo:
    return WorkerInfo(id=wid, channel=f"ch-{wid}", incarnation="1", running=running)


def test_a_prefix_s_worker_is_kept_unless_much_busier_and_a_session_s_always() -> None:
    home, idle = _worker("home", PREFIX_AFFINITY_SLACK), _worker("idle", 0)
    assert choose_worker([idle, home], "home", True, {}).id == "home"
    busier = _worker("home", PREFIX_AFFINITY_SLACK + 1)
    assert choose_worker([idle, busier], "home", True, {}).id == "idle"
    # This process's own requests on a worker count even before its heartbeat shows them.
    assert choose_worker([idle, home], "home", True, {"home": 9}).id == "idle"
    assert choose_worker([idle, busier], "home", False, {}).id == "home"  # `user` affinity
    assert choose_worker([idle, busier], "gone", True, {}).id == "idle"
    assert choose_worker([idle, busier], None, False, {}).id == "idle"


@pytest.fixture(scope="module")
def workers(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, namespace: str, redis: Redis
) -> Iterator[list[Worker]]:
    with workers_running(
        tmp_path_factory.mktemp("workers"), tiny_model_dir, namespace, redis, "pa", "pb"
    ) as running:
        yield running
    cleanup(redis, namespace)


async def run(client: Any, ids: list[int], **kw: Any) -> tuple[list[int], Any]:
    out, last = [], None
    sampling = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    async for delta in client.generate(ids, sampling, **kw):
        out.extend(delta.token_ids)
        last = delta
    assert last is not None and last.finished
    return out, last.figures


def encode(client: Any, text: str) -> list[int]:
    return list(client.tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.slow
async def test_a_growing_history_without_a_user_stays_on_one_worker(
    client: Any, workers: list[Worker], namespace: str, redis: Redis
) -> None:
    salt = "api-owner-salt"  # what the API passes for its caller: the digests are salted too
    history = encode(client, "You are a terse assistant. The user asks about rivers. " * 3)
    reply, first = await run(client, history, cache_salt=salt)
    home = first.worker
    assert home in {w.id for w in workers}
    # The home worker gets busier than the other (a long reply of another conversation,
    # pinned there by its session): load alone would now send every turn elsewhere.
    redis.set(Keys(namespace).affinity("hog", client.model_name), home)
    hog = client.generate(
        encode(client, "Something else entirely"),
        SamplingParams(max_tokens=1500, temperature=0, ignore_eos=True),
        session_id="hog",
    )
    assert (await hog.__anext__()).token_ids
    try:
        await asyncio.sleep(0.3)  # the home worker's heartbeat now shows the load
        for turn in range(2, 7):
            history += reply + encode(client, f" Question {turn}: and the next river?")
            reply, m = await run(client, history, cache_salt=salt)
            assert m.worker == home, f"turn {turn} moved to {m.worker}"
            # Its prefix was in the worker's memory: nothing restored from Redis.
            assert m.cached_tokens >= len(history) // 2 and m.cached_tokens_redis == 0, m
    finally:
        await hog.aclose()
    # A prompt shorter than one block has no prefix digest: it routes by load alone.
    _, short = await run(client, encode(client, "Hi")[: PREFIX_BLOCK_TOKENS - 1])
    assert short.worker in {w.id for w in workers}
    # The startup line (issue 16): each worker logged its resolved configuration once.
    for w in workers:
        assert w.log.read_text().count("engine config:") == 1, w.log.read_text()[-2000:]
