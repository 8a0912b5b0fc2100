"""The chat's `done` figures count the prompt tokens reused from both KV tiers: a turn whose
prefix came back from the Redis tier (after an engine restart) says so, instead of
reporting 0 cached tokens. Real engine on the tiny model, real Redis (db 4)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from channels.db import database_sync_to_async

from chatapp.chat.generation import message_figures
from chatapp.chat.models import Message
from chatapp.openai_api.views import usage
from inference.client import set_engine_client
from inference.engine import Delta, RequestFigures
from tests.engines import make_engine_client
from tests.sockets import open_socket

REDIS_URL = "redis://127.0.0.1:6379/4"


def test_stats_count_both_tiers_and_name_the_redis_part() -> None:
    m = RequestFigures(arrival_time=1.0, prompt_tokens=1850, cached_tokens=512)
    m.cached_tokens_redis = 1248
    figures = message_figures(m)
    assert (figures["cached_tokens"], figures["cached_tokens_redis"]) == (1760, 1248)
    memory_only = message_figures(RequestFigures(arrival_time=1.0, cached_tokens=32))
    assert (memory_only["cached_tokens"], memory_only["cached_tokens_redis"]) == (32, 0)


def test_the_api_usage_counts_both_tiers_as_the_chat_does() -> None:
    m = RequestFigures(arrival_time=1.0, prompt_tokens=1850, cached_tokens=512, output_tokens=3)
    m.cached_tokens_redis = 1248
    last = Delta("r", finished=True, finish_reason="stop", figures=m)
    assert usage(last, None, [1, 2, 3])["prompt_tokens_details"]["cached_tokens"] == 1760
    assert message_figures(m)["cached_tokens"] == 1760


@pytest.fixture
def tier_namespace() -> Iterator[str]:
    store = redis.Redis.from_url(REDIS_URL)
    try:
        store.ping()
    except redis.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    ns = f"test-kvtier-{uuid.uuid4().hex[:10]}"
    yield ns
    keys = list(store.scan_iter(f"{ns}:*", count=1000))
    if keys:
        store.delete(*keys)


@pytest.mark.django_db(transaction=True)
async def test_a_turn_restored_from_redis_shows_its_cached_tokens(
    make_user: Any, tiny_model_dir: Path, tier_namespace: str
) -> None:
    def engine() -> Any:
        return make_engine_client(
            tiny_model_dir, kv_tier_url=REDIS_URL, kv_tier_namespace=tier_namespace
        )

    set_engine_client(engine())
    try:
        user = await database_sync_to_async(make_user)("tiers")
        sock, connected, _ = await open_socket(user)
        assert connected
        try:
            greedy = {"max_tokens": 24, "temperature": 0}
            text = "Tell me about the history of the printing press in some detail, please."
            await sock.send({"type": "send", "conversation_id": None, "text": text,
                             "settings": greedy})  # fmt: skip
            first = await sock.recv_until("done")
            conv_id = first[0]["conversation"]["id"]
            # A restart: the new engine's memory is empty, the first turn's KV is in Redis
            # (the old engine flushes its write-backs as it shuts down).
            set_engine_client(engine())
            await sock.send({"type": "send", "conversation_id": conv_id, "text": "And then?"})
            done = (await sock.recv_until("done"))[-1]
        finally:
            await sock.close()
    finally:
        set_engine_client(None)
    figures = done["figures"]
    assert done["status"] == "complete"
    assert figures["cached_tokens_redis"] >= 16, figures
    # Nothing was in memory: every reused token came from Redis, and both figures say so.
    assert figures["cached_tokens"] == figures["cached_tokens_redis"]
    assert figures["cached_tokens"] < figures["prompt_tokens"]
    reply = await Message.objects.aget(pk=done["message_id"])
    assert reply.figures["cached_tokens_redis"] == figures["cached_tokens_redis"]
