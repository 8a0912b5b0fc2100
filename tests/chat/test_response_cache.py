"""The response cache (inference/response_cache.py, docs/response-cache.md): a deterministic
request answered before is replayed from Redis without the engine; everything else goes
to the engine as if the cache were not there.

Against the real Redis (db 4, a namespace of its own per test, emptied afterwards) and the
real engine on the tiny model.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from channels.db import database_sync_to_async

from chatapp.chat.models import Message
from chatapp.observability.models import RequestRecord
from inference import metrics, response_cache
from inference.backends.embedded import EmbeddedClient
from inference.client import Prompt, prefix_cache_salt
from inference.engine import Delta, SamplingParams
from inference.response_cache import CachedReply, ResponseCache
from tests.sockets import ChatSocket

REDIS_URL = "redis://127.0.0.1:6379/4"
PROMPT = [1, 504, 3458, 282, 260, 1345, 30, 2]  # any ids within the tiny model's vocabulary


def redis_answers() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


needs_redis = pytest.mark.skipif(not redis_answers(), reason="no Redis at 127.0.0.1:6379")


@pytest.fixture
def cache(tiny_engine: EmbeddedClient) -> Iterator[ResponseCache]:
    """A response cache in a namespace of its own, installed on the tiny engine's client."""
    rc = ResponseCache(REDIS_URL, ttl_s=60, namespace=f"test-respcache-{uuid.uuid4().hex[:12]}")
    tiny_engine.fingerprint()  # hashed once, up front (a server does it in the background)
    tiny_engine.response_cache = rc
    try:
        yield rc
    finally:
        tiny_engine.response_cache = None
        rc.flush()
        rc.clear()
        rc.close()


async def run(
    client: EmbeddedClient,
    sampling: SamplingParams,
    ids: list[int] = PROMPT,
    cache_salt: str | None = None,
) -> dict:
    """One request through EmbeddedClient.stream: its deltas, and whether the engine ran it."""
    before = client.stats()["total_requests"]
    stream = client.stream(Prompt(token_ids=list(ids)), sampling, cache_salt=cache_salt)
    deltas: list[Delta] = [d async for d in stream]
    if client.response_cache is not None:
        await asyncio.to_thread(client.response_cache.flush)
    last = deltas[-1]
    return {
        "deltas": deltas,
        "text": "".join(d.text for d in deltas),
        "ids": [t for d in deltas for t in d.token_ids],
        "last": last,
        "engine_ran": client.stats()["total_requests"] - before,
        "replayed": bool(getattr(stream, "replayed", False)),
    }


def greedy(**kw: Any) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 12, "temperature": 0.0, "ignore_eos": True, **kw})


# --- the cache through EmbeddedClient.stream --------------------------------------------------


@needs_redis
async def test_a_greedy_request_answered_before_is_replayed_without_the_engine(
    tiny_engine: EmbeddedClient, cache: ResponseCache
) -> None:
    first = await run(tiny_engine, greedy())
    second = await run(tiny_engine, greedy())

    assert first["engine_ran"] == 1 and not first["replayed"]
    assert second["engine_ran"] == 0 and second["replayed"]
    assert second["text"] == first["text"] and second["ids"] == first["ids"]
    assert len(second["ids"]) == 12
    # Replayed as a stream, delta by delta as the engine sent them.
    assert [d.token_ids for d in second["deltas"]] == [d.token_ids for d in first["deltas"]]
    m = second["last"].figures
    assert second["last"].finished and second["last"].finish_reason == "length"
    assert m.replayed and not first["last"].figures.replayed
    assert m.prompt_tokens == len(PROMPT) and m.output_tokens == 12 and len(m.token_times) == 12
    assert m.ttft is not None and m.ttft < first["last"].figures.ttft
    assert cache.counts["hits"] == 1 and cache.counts["stores"] == 1


@needs_redis
async def test_a_stored_reply_is_replayed_to_its_owner_only(
    tiny_engine: EmbeddedClient, cache: ResponseCache
) -> None:
    alice, bob = prefix_cache_salt(1), prefix_cache_salt(2)
    first = await run(tiny_engine, greedy(), cache_salt=alice)
    # A replay answers in milliseconds: bob must not learn that alice sent this prompt.
    theirs = await run(tiny_engine, greedy(), cache_salt=bob)
    assert theirs["engine_ran"] == 1 and not theirs["replayed"]
    unscoped = await run(tiny_engine, greedy())
    assert unscoped["engine_ran"] == 1 and not unscoped["replayed"]
    mine = await run(tiny_engine, greedy(), cache_salt=alice)
    assert mine["engine_ran"] == 0 and mine["replayed"] and mine["ids"] == first["ids"]


@needs_redis
async def test_a_seeded_sampled_request_is_replayed(
    tiny_engine: EmbeddedClient, cache: ResponseCache
) -> None:
    seeded = greedy(temperature=1.0, top_p=0.9, seed=1234)
    first = await run(tiny_engine, seeded)
    second = await run(tiny_engine, seeded)
    assert (first["engine_ran"], second["engine_ran"]) == (1, 0)
    assert second["replayed"] and second["ids"] == first["ids"]
    # Another seed is another request.
    other = await run(tiny_engine, greedy(temperature=1.0, top_p=0.9, seed=1235))
    assert other["engine_ran"] == 1 and not other["replayed"]


@needs_redis
async def test_a_sampled_request_without_a_seed_is_never_cached(
    tiny_engine: EmbeddedClient, cache: ResponseCache
) -> None:
    sampled = greedy(temperature=0.8)
    runs = [await run(tiny_engine, sampled) for _ in range(2)]
    assert [r["engine_ran"] for r in runs] == [1, 1]
    assert not any(r["replayed"] for r in runs)
    assert cache.counts["lookups"] == 0 and cache.counts["stores"] == 0
    assert list(cache.redis.scan_iter(match=f"{cache.namespace}:*")) == []


@needs_redis
async def test_another_prompt_or_other_settings_is_a_miss(
    tiny_engine: EmbeddedClient, cache: ResponseCache
) -> None:
    await run(tiny_engine, greedy())
    for sampling, ids in (
        (greedy(), [*PROMPT, 11]),  # one more prompt token
        (greedy(max_tokens=11), PROMPT),
        (greedy(repetition_penalty=1.2), PROMPT),
        (greedy(stop_token_ids=[7]), PROMPT),
        (greedy(seed=5), PROMPT),
    ):
        r = await run(tiny_engine, sampling, ids)
        assert r["engine_ran"] == 1 and not r["replayed"], sampling
    assert (await run(tiny_engine, greedy()))["replayed"]


@needs_redis
async def test_another_model_fingerprint_is_a_miss(
    tiny_engine: EmbeddedClient, cache: ResponseCache
) -> None:
    await run(tiny_engine, greedy())
    real = tiny_engine.fingerprint()
    tiny_engine._fingerprint = "another-model"
    try:
        assert (await run(tiny_engine, greedy()))["engine_ran"] == 1
    finally:
        tiny_engine._fingerprint = real
    assert cache.key(real, PROMPT, greedy()) != cache.key("another-model", PROMPT, greedy())


@needs_redis
async def test_requests_go_to_the_engine_while_the_model_is_being_fingerprinted(
    tiny_engine: EmbeddedClient, cache: ResponseCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tiny_engine.fingerprint()
    hashed = threading.Event()

    def slow_hash() -> None:  # stands in for the second it takes to hash real weights
        hashed.wait(10)
        tiny_engine._fingerprint = real
        tiny_engine._fingerprinting = False

    monkeypatch.setattr(tiny_engine, "_fingerprint", None)
    monkeypatch.setattr(tiny_engine, "_compute_fingerprint", slow_hash)
    during = [await run(tiny_engine, greedy()) for _ in range(2)]
    assert [r["engine_ran"] for r in during] == [1, 1] and cache.counts["stores"] == 0
    hashed.set()
    for _ in range(100):
        if tiny_engine._fingerprint is not None:
            break
        await asyncio.sleep(0.01)
    after = [await run(tiny_engine, greedy()) for _ in range(2)]
    assert [r["replayed"] for r in after] == [False, True]


@needs_redis
async def test_an_entry_expires_with_its_ttl(tiny_engine: EmbeddedClient) -> None:
    short = ResponseCache(REDIS_URL, ttl_s=0.3, namespace=f"test-respcache-{uuid.uuid4().hex}")
    tiny_engine.fingerprint()
    tiny_engine.response_cache = short
    try:
        await run(tiny_engine, greedy())
        assert (await run(tiny_engine, greedy()))["replayed"]
        await asyncio.sleep(0.5)
        again = await run(tiny_engine, greedy())
        assert again["engine_ran"] == 1 and not again["replayed"]
    finally:
        tiny_engine.response_cache = None
        short.flush()
        short.clear()
        short.close()


@needs_redis
async def test_a_reply_cut_short_is_not_stored(
    tiny_engine: EmbeddedClient, cache: ResponseCache
) -> None:
    stream = tiny_engine.stream(Prompt(token_ids=PROMPT), greedy(max_tokens=200))
    async for _ in stream:
        break  # the reader went away: the engine aborts, nothing is kept
    await stream.aclose()
    await asyncio.to_thread(cache.flush)
    assert cache.counts["stores"] == 0
    assert (await run(tiny_engine, greedy(max_tokens=200)))["engine_ran"] == 1


@needs_redis
async def test_an_unreadable_entry_is_a_miss_and_is_deleted(
    tiny_engine: EmbeddedClient, cache: ResponseCache
) -> None:
    key = cache.key(tiny_engine.fingerprint(), PROMPT, greedy())
    cache.redis.set(key, b'{"v": 1, "pieces": [["a", "not ids"]], "finish_reason": "stop"}')
    r = await run(tiny_engine, greedy())
    assert r["engine_ran"] == 1 and not r["replayed"]
    # Replaced by the engine's real reply, which replays from now on.
    assert CachedReply.loads(cache.redis.get(key)).pieces[0][1] == r["deltas"][0].token_ids
    assert (await run(tiny_engine, greedy()))["replayed"]


async def test_when_redis_does_not_answer_requests_are_served_normally(
    tiny_engine: EmbeddedClient, caplog: pytest.LogCaptureFixture
) -> None:
    down = ResponseCache("redis://127.0.0.1:1/4", ttl_s=60, timeout_s=0.2)
    tiny_engine.response_cache = down
    try:
        runs = [await run(tiny_engine, greedy()) for _ in range(3)]
    finally:
        tiny_engine.response_cache = None
        down.close()
    assert [r["engine_ran"] for r in runs] == [1, 1, 1]
    assert len({tuple(r["ids"]) for r in runs}) == 1 and len(runs[0]["ids"]) == 12
    warnings = [r for r in caplog.records if "not answering" in r.getMessage()]
    assert len(warnings) == 1  # said once, then the cache steps aside for a while
    assert not down.available()


def test_the_response_cache_is_off_by_default_and_follows_the_settings(settings: Any) -> None:
    assert settings.RESPONSE_CACHE_ENABLED is False
    assert response_cache.from_settings() is None
    settings.RESPONSE_CACHE_ENABLED = True
    settings.RESPONSE_CACHE_TTL_S = 12.5
    rc = response_cache.from_settings()
    assert rc is not None and rc.url == settings.RESPONSE_CACHE_URL and rc.ttl_ms == 12500
    assert response_cache.from_settings() is rc


async def test_with_the_cache_off_a_repeated_greedy_request_runs_again(
    tiny_engine: EmbeddedClient,
) -> None:
    assert tiny_engine.response_cache is None and response_cache.from_settings() is None
    runs = [await run(tiny_engine, greedy()) for _ in range(2)]
    assert [r["engine_ran"] for r in runs] == [1, 1]
    assert not any(r["replayed"] for r in runs)


# --- the chat socket, the API, the figures ----------------------------------------------------


async def chat(sock: ChatSocket, settings: dict[str, Any]) -> dict:
    await sock.send(
        {
            "type": "send",
            "conversation_id": None,
            "text": "Capital of France?",
            "settings": settings,
        }
    )
    frames = await sock.recv_until("done")
    return frames[-1]


@needs_redis
@pytest.mark.django_db(transaction=True)
async def test_a_repeated_greedy_conversation_is_replayed_and_marked_in_the_chat(
    alice_socket: ChatSocket, tiny_engine: EmbeddedClient, cache: ResponseCache
) -> None:
    greedy_chat = {"max_tokens": 10, "temperature": 0}
    first = await chat(alice_socket, greedy_chat)
    before = tiny_engine.stats()["total_requests"]
    second = await chat(alice_socket, greedy_chat)

    assert tiny_engine.stats()["total_requests"] == before
    assert "replayed" not in first["figures"]
    assert second["figures"]["replayed"] is True
    assert second["message"]["figures"]["replayed"] is True
    assert second["message"]["text"] == first["message"]["text"]
    saved = await database_sync_to_async(Message.objects.get)(pk=second["message_id"])
    assert saved.figures["replayed"] is True
    assert (
        saved.token_ids
        == (await database_sync_to_async(Message.objects.get)(pk=first["message_id"])).token_ids
    )
    # The figures are stored just after the done frame goes out.
    for _ in range(50):
        replays = await database_sync_to_async(
            lambda: list(RequestRecord.objects.filter(replayed=True).values_list("ttft", flat=True))
        )()
        if replays:
            break
        await asyncio.sleep(0.05)
    assert len(replays) == 1 and replays[0] is not None

    # The chat's default sampling is random: never replayed.
    sampled = await chat(alice_socket, {"max_tokens": 10, "temperature": 0.7})
    assert "replayed" not in sampled["figures"]


def metric_value(name: str, model: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, {"model_name": model}) or 0.0


@needs_redis
@pytest.mark.django_db(transaction=True)
async def test_the_api_replays_a_greedy_request_and_says_so_in_a_header(
    make_user: Any, tiny_engine: EmbeddedClient, cache: ResponseCache
) -> None:
    from chatapp.asgi import application
    from chatapp.openai_api.keys import create_key

    user = await database_sync_to_async(make_user)("apiuser")
    _, raw = await database_sync_to_async(create_key)(user, "test")
    model = tiny_engine.model_name
    hits = metric_value("chatapp:response_cache_hits_total", model)
    lookups = metric_value("chatapp:response_cache_lookups_total", model)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1",
        headers={"Authorization": f"Bearer {raw}"},
    ) as http:

        async def post(**extra: Any) -> httpx.Response:
            r = await http.post("/v1/chat/completions", json={**body, **extra})
            await asyncio.to_thread(cache.flush)
            assert r.status_code == 200, r.text
            return r

        first = await post()
        second = await post()
        streamed = await post(stream=True)
        sampled = await post(temperature=0.9)

    assert "x-response-cache" not in first.headers
    assert second.headers["x-response-cache"] == "hit"
    assert second.json()["choices"][0] == first.json()["choices"][0]
    for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert second.json()["usage"][field] == first.json()["usage"][field]
    assert streamed.headers["x-response-cache"] == "hit"
    chunks = [
        json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")
    ]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == first.json()["choices"][0]["message"]["content"]
    assert "x-response-cache" not in sampled.headers
    assert metric_value("chatapp:response_cache_hits_total", model) - hits == 2
    assert metric_value("chatapp:response_cache_lookups_total", model) - lookups == 3
    assert metrics.REGISTRY.get_sample_value(
        "chatapp:response_cache_ttft_seconds_count", {"model_name": model}
    )


def test_a_stored_reply_round_trips_and_junk_is_refused() -> None:
    reply = CachedReply([("Hel", [1, 2]), ("lo", [3])], "stop", {"ttft": 0.1})
    back = CachedReply.loads(reply.dumps())
    assert back == reply and back.output_tokens == 3
    for junk in (b"", b"[]", b"{}", b'{"v": 1, "pieces": [], "finish_reason": "stop"}',
                 b'{"v": 1, "pieces": [["a", [1]]], "finish_reason": "abort"}',
                 b'{"v": 99, "pieces": [["a", [1]]], "finish_reason": "stop"}'):  # fmt: skip
        assert CachedReply.loads(junk) is None, junk


@pytest.mark.django_db
def test_the_dashboard_summary_counts_replays_and_their_ttft() -> None:
    from django.utils import timezone

    from chatapp.observability import dashboard

    now = timezone.now()
    for ttft, replayed in ((0.002, True), (0.004, True), (0.300, False)):
        RequestRecord.objects.create(
            finished_at=now, source="api", ttft=ttft, finish_reason="stop", replayed=replayed
        )
    summary = dashboard.data("5m", now=now + timezone.timedelta(seconds=1))["summary"]
    assert summary["requests"] == 3
    assert summary["replays"] == 2
    assert summary["replay_ttft_p50"] == pytest.approx(0.003)
