"""The Redis tier of the KV cache, against the real Redis at 127.0.0.1:6379 (db 4).

A conversation's KV survives an engine restart; a corrupted, foreign or stale entry is
never used (the output is exactly a cold start's); entries expire and the tier keeps under
its cap; Redis going away or coming back never breaks serving.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import torch

from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.kv_tier.upkeep import upkeep
from tests.reliability.test_faults import redis_server
from tests.tiny_model import build_tiny_llama
from tools.live_server import free_port

from .conftest import greedy, run_to_completion, token_ids_of

REDIS_URL = "redis://127.0.0.1:6379/4"


@pytest.fixture(scope="module")
def store() -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    return client


@pytest.fixture
def namespace(store: redis.Redis) -> Iterator[str]:
    ns = f"test-kvtier-{uuid.uuid4().hex[:10]}"
    yield ns
    keys = list(store.scan_iter(f"{ns}:*", count=1000))
    if keys:
        store.delete(*keys)


@pytest.fixture
def tier_engine(tiny_model_path: Path, namespace: str) -> Iterator[Callable[..., LLMEngine]]:
    """Engines on the tiny model with the tier on (closed, queues flushed, at the end)."""
    made: list[LLMEngine] = []

    def make(**overrides: object) -> LLMEngine:
        settings: dict[str, object] = {
            "model": str(tiny_model_path),
            "dtype": "float32",
            "quantization": "none",
            "kv_cache_memory_mb": 8,
            "block_size": 8,
            "kv_tier_url": REDIS_URL,
            "kv_tier_namespace": namespace,
        }
        settings.update(overrides)
        engine = LLMEngine(EngineConfig(**settings))  # type: ignore[arg-type]
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close(flush_timeout=5)


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


def _generate(engine: LLMEngine, prompt: list[int], max_tokens: int = 12, **kw):  # type: ignore[no-untyped-def]
    rid = uuid.uuid4().hex
    engine.add_request(prompt, greedy(max_tokens, ignore_eos=True), request_id=rid, **kw)
    deltas = run_to_completion(engine)[rid]
    return token_ids_of(deltas), deltas[-1].figures


def _first_turn(engine: LLMEngine) -> list[int]:
    """Turn 1 of a chat, finished (and so written back); returns turn 2's prompt."""
    turn1 = _prompt(70, seed=1)
    reply, _ = _generate(engine, turn1, 20)
    assert engine.kv_tier is not None and engine.kv_tier.flush(10)
    return turn1 + reply + _prompt(15, seed=2)


def _cold(make_engine: Callable[..., LLMEngine], prompt: list[int], **kw: object) -> list[int]:
    return _generate(make_engine(enable_prefix_caching=False, block_size=8, **kw), prompt)[0]


def _entries(store: redis.Redis, namespace: str) -> list[bytes]:
    return [k for k in store.scan_iter(f"{namespace}:*", count=1000) if k.count(b":") == 2]


@pytest.mark.parametrize("kv_dtype", ["float32", "float16", "int8"])
def test_next_turn_after_a_restart_is_restored_from_redis_and_equals_a_cold_start(
    tier_engine, make_engine, kv_dtype
):
    first = tier_engine(kv_dtype=kv_dtype)
    turn2 = _first_turn(first)
    first.close()
    restarted = tier_engine(kv_dtype=kv_dtype)
    tokens, figures = _generate(restarted, turn2)
    # Every full block of turn 1 (prompt and reply but its last token) came from Redis.
    assert figures.cached_tokens == 0
    assert figures.cached_tokens_redis == (70 + 20 - 1) // 8 * 8
    assert tokens == _cold(make_engine, turn2, kv_dtype=kv_dtype)
    stats = restarted.stats()
    assert stats["kv_tier_hits"] == 1
    assert stats["kv_tier_hit_tokens"] == figures.cached_tokens_redis
    assert stats["kv_tier_bytes_read"] > 0 and stats["kv_tier_restore_seconds_total"] > 0
    # A third turn finds everything in memory, restored blocks included.
    _, m3 = _generate(restarted, turn2 + tokens + _prompt(9, seed=3))
    assert m3.cached_tokens >= len(turn2) // 8 * 8 and m3.cached_tokens_redis == 0


def test_a_turn_served_by_both_tiers_counts_each_tier_s_tokens(tier_engine, make_engine):
    """Memory holds the first blocks, Redis the rest: the figures say which came from where
    (the chat's figures and the API's usage add them up)."""
    first = tier_engine()
    turn2 = _first_turn(first)
    first.close()
    restarted = tier_engine()
    # Another request that opens like turn 1 leaves its first 3 blocks in memory.
    _generate(restarted, turn2[:24] + _prompt(5, seed=7), 2)
    tokens, figures = _generate(restarted, turn2)
    assert figures.cached_tokens == 24
    assert figures.cached_tokens_redis == (70 + 20 - 1) // 8 * 8 - 24
    assert tokens == _cold(make_engine, turn2)


def test_corrupted_entries_are_ignored_deleted_and_output_equals_a_cold_start(
    tier_engine, make_engine, store, namespace
):
    turn2 = _first_turn(tier_engine())
    keys = sorted(_entries(store, namespace))
    assert len(keys) >= 8
    corrupted = {}
    for key in keys:  # one flipped byte in every stored block
        value = bytearray(store.get(key))
        value[len(value) // 2] ^= 0xFF
        corrupted[key] = bytes(value)
        store.set(key, corrupted[key])
    restarted = tier_engine()
    tokens, figures = _generate(restarted, turn2)
    assert figures.cached_tokens_redis == 0
    assert tokens == _cold(make_engine, turn2)
    stats = restarted.stats()
    assert stats["kv_tier_rejected"] >= 1 and stats["kv_tier_hits"] == 0
    # The corrupt entries were deleted or overwritten by the recomputed blocks' write-back,
    # and the next restart restores from them.
    assert restarted.kv_tier is not None and restarted.kv_tier.flush(5)
    assert all(store.get(k) != v for k, v in corrupted.items())
    _, again = _generate(tier_engine(), turn2)
    assert again.cached_tokens_redis > 0


def test_a_different_model_finds_nothing(
    tier_engine, make_engine, tmp_path: Path, real_model_path: Path
):
    turn2 = _first_turn(tier_engine())
    other = build_tiny_llama(
        tmp_path / "other", real_model_path, seed=1, max_position_embeddings=1024,
        initializer_range=0.2,
    )  # fmt: skip
    engine = tier_engine(model=str(other))
    tokens, figures = _generate(engine, turn2)
    assert figures.cached_tokens_redis == 0 and engine.stats()["kv_tier_hits"] == 0
    assert tokens == _cold(make_engine, turn2, model=str(other))


def test_a_different_dtype_finds_nothing(tier_engine, make_engine):
    turn2 = _first_turn(tier_engine())
    engine = tier_engine(dtype="bfloat16")
    tokens, figures = _generate(engine, turn2)
    assert figures.cached_tokens_redis == 0 and engine.stats()["kv_tier_hits"] == 0
    assert tokens == _cold(make_engine, turn2, dtype="bfloat16")


def test_a_different_kv_pool_dtype_finds_nothing(tier_engine, make_engine):
    """The same weights and compute dtype over a float16 pool: the blocks' bytes are
    another layout, so the float32 pool's entries are not read into it."""
    turn2 = _first_turn(tier_engine())
    engine = tier_engine(kv_dtype="float16")
    tokens, figures = _generate(engine, turn2)
    assert figures.cached_tokens_redis == 0 and engine.stats()["kv_tier_hits"] == 0
    assert tokens == _cold(make_engine, turn2, kv_dtype="float16")


def test_entries_expire_after_their_ttl(tier_engine, store, namespace):
    engine = tier_engine(kv_tier_ttl_s=1)
    turn2 = _first_turn(engine)
    assert _entries(store, namespace)
    time.sleep(2.1)
    assert _entries(store, namespace) == []
    report = upkeep(store, namespace, 2**30)
    assert report["entries"] == 0 and report["bytes"] == 0 and report["expired_dropped"] > 0
    _, figures = _generate(tier_engine(), turn2)
    assert figures.cached_tokens_redis == 0


def test_the_tier_stays_under_its_size_cap_oldest_out_first(tier_engine, store, namespace):
    engine = tier_engine(kv_tier_max_mb=1)
    for seed in range(6):  # 6 conversations of 60 blocks, ~4.2 KB each here: ~1.5 MB
        _generate(engine, _prompt(481, seed=100 + seed), 4)
        assert engine.kv_tier is not None and engine.kv_tier.flush(10)
    report = upkeep(store, namespace, 2**20)
    assert 2**19 < report["bytes"] <= 2**20
    assert report["bytes"] == sum(store.strlen(k) for k in _entries(store, namespace))
    # The newest conversation is all there, the oldest is gone.
    restarted = tier_engine(kv_tier_max_mb=1)
    _, newest = _generate(restarted, [*_prompt(481, seed=105), 5, 6, 7])
    assert newest.cached_tokens_redis == 480
    _, oldest = _generate(restarted, [*_prompt(481, seed=100), 5, 6, 7])
    assert oldest.cached_tokens_redis == 0


def test_an_unreachable_redis_means_memory_only_with_a_warning(
    make_engine, caplog: pytest.LogCaptureFixture
):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    with caplog.at_level(logging.WARNING, logger="inference.engine.kv_tier.tier"):
        engine = make_engine(kv_tier_url=url, block_size=8)
    try:
        prompt = _prompt(40, seed=5)
        _generate(engine, prompt)
        _, again = _generate(engine, prompt)
        assert again.cached_tokens == 32  # the memory tier still works
        stats = engine.stats()
        assert stats["kv_tier_enabled"] and stats["kv_tier_degraded"]
        assert "unreachable" in caplog.text
    finally:
        engine.close(flush_timeout=1)


def test_redis_stopping_and_coming_back_mid_run_keeps_serving_and_the_tier_recovers(
    make_engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    port = free_port()
    server = redis_server(port, tmp_path)
    engine = make_engine(kv_tier_url=f"redis://127.0.0.1:{port}/0", block_size=8)
    try:
        _generate(engine, _prompt(40, seed=10))
        assert engine.kv_tier is not None and engine.kv_tier.flush(5)
        assert engine.stats()["kv_tier_blocks_written"] > 0
        server.terminate()
        server.wait(timeout=10)
        with caplog.at_level(logging.INFO, logger="inference.engine.kv_tier.tier"):
            for seed in (11, 12):  # lookups and writes fail; requests complete anyway
                tokens, _ = _generate(engine, _prompt(40, seed=seed))
                assert len(tokens) == 12
            engine.kv_tier.flush(5)
            assert engine.stats()["kv_tier_degraded"]
            server = redis_server(port, tmp_path)
            deadline = time.monotonic() + 15
            while engine.stats()["kv_tier_degraded"] and time.monotonic() < deadline:
                time.sleep(0.2)
        assert not engine.stats()["kv_tier_degraded"]
        assert "unreachable" in caplog.text and "answers again" in caplog.text
        written = engine.stats()["kv_tier_blocks_written"]
        _generate(engine, _prompt(40, seed=13))
        assert engine.kv_tier.flush(5)
        assert engine.stats()["kv_tier_blocks_written"] > written
    finally:
        engine.close(flush_timeout=1)
        server.terminate()
        server.wait(timeout=10)


def test_an_aborted_request_is_written_back_too(tier_engine, store, namespace):
    engine = tier_engine()
    engine.add_request(_prompt(60, seed=20), greedy(50, ignore_eos=True), request_id="a")
    while engine.seqs["a"].num_output_tokens < 2:  # the prompt is computed: 7 full blocks
        engine.step()
    engine.abort_request("a")
    run_to_completion(engine)
    assert engine.kv_tier is not None and engine.kv_tier.flush(5)
    assert len(_entries(store, namespace)) == 60 // 8


def test_blocks_evicted_from_memory_before_being_written_reach_redis(tier_engine, store, namespace):
    engine = tier_engine()
    engine.kv.__init__(20, 8)  # a 20-block pool
    engine.kv.on_evict = engine._on_evict
    engine.max_model_len = 160
    first = _prompt(60, seed=21)
    _generate(engine, first, 4)
    assert engine.kv_tier is not None and engine.kv_tier.flush(5)
    # As if the write-back had been dropped: Redis lacks the first request's blocks.
    store.delete(*store.scan_iter(f"{namespace}:*"))
    for block in engine.kv.blocks:
        block.persisted = False
    _generate(engine, _prompt(150, seed=22), 4)  # needs the whole pool: evicts them
    assert engine.kv_tier.flush(5)
    _, figures = _generate(tier_engine(), [*first, 1, 2, 3])
    assert figures.cached_tokens_redis == 56


def test_compressed_entries_restore_the_same_kv(tier_engine, make_engine):
    first = tier_engine(kv_tier_compression="zlib")
    turn2 = _first_turn(first)
    first.close()
    tokens, figures = _generate(tier_engine(), turn2)  # reads them whatever its own setting
    assert figures.cached_tokens_redis == (70 + 20 - 1) // 8 * 8
    assert tokens == _cold(make_engine, turn2)


async def test_the_async_engine_serves_a_restored_turn_and_flushes_at_shutdown(
    tiny_model_path: Path, namespace: str, store: redis.Redis, make_engine
):
    from inference.engine import AsyncEngine

    config = EngineConfig(
        model=str(tiny_model_path), dtype="float32", quantization="none",
        kv_cache_memory_mb=8, block_size=8, kv_tier_url=REDIS_URL, kv_tier_namespace=namespace,
    )  # fmt: skip

    async def reply(engine: AsyncEngine, prompt: list[int]):  # type: ignore[no-untyped-def]
        deltas = [d async for d in engine.generate(prompt, greedy(12, ignore_eos=True))]
        return token_ids_of(deltas), deltas[-1].figures

    turn1 = _prompt(70, seed=30)
    first = AsyncEngine(config)
    answer, _ = await reply(first, turn1)
    first.shutdown()  # flushes the write-back queue
    assert len(_entries(store, namespace)) == (70 + 12 - 1) // 8
    turn2 = turn1 + answer + _prompt(10, seed=31)
    second = AsyncEngine(config)
    try:
        tokens, figures = await reply(second, turn2)
    finally:
        second.shutdown()
    assert figures.cached_tokens_redis == (70 + 12 - 1) // 8 * 8
    assert tokens == _cold(make_engine, turn2)


@pytest.mark.slow
def test_a_long_conversation_of_the_real_model_restored_from_redis_equals_cold(
    real_model_path: Path, namespace: str
):
    base = {
        "model": str(real_model_path),
        "dtype": "float32",
        "quantization": "none",
        "kv_cache_memory_mb": 256,
    }
    tier = {**base, "kv_tier_url": REDIS_URL, "kv_tier_namespace": namespace}
    first = LLMEngine(EngineConfig(**tier))  # type: ignore[arg-type]
    tok = first.tokenizer
    text = " ".join(f"Point {i}: the river town traded salt, wool and timber." for i in range(120))
    turn1 = tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    assert len(turn1) >= 1400
    reply, _ = _generate(first, turn1, 16)
    first.close()
    turn2 = turn1 + reply + tok.encode("<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n")
    restarted = LLMEngine(EngineConfig(**tier))  # type: ignore[arg-type]
    try:
        tokens, figures = _generate(restarted, turn2, 24)
    finally:
        restarted.close()
    assert figures.cached_tokens_redis >= len(turn1) // 16 * 16
    cold = LLMEngine(EngineConfig(**base, enable_prefix_caching=False))  # type: ignore[arg-type]
    assert tokens == _generate(cold, turn2, 24)[0]


def test_a_salted_conversation_is_restored_for_its_owner_only(tier_engine, store, namespace):
    first = tier_engine()
    turn1 = _prompt(70, seed=1)
    reply, _ = _generate(first, turn1, 20, cache_salt="alice")
    first.close()
    assert _entries(store, namespace)
    turn2 = turn1 + reply + _prompt(15, seed=2)
    restarted = tier_engine()
    # Another owner, or no owner, finds none of alice's blocks in Redis.
    for salt in ("bob", None):
        _, theirs = _generate(restarted, turn2, cache_salt=salt)
        assert (theirs.cached_tokens, theirs.cached_tokens_redis) == (0, 0), salt
    # Alice's next turn is restored: every full block of turn 1 but its last token.
    _, mine = _generate(restarted, turn2, cache_salt="alice")
    assert mine.cached_tokens == 0
    assert mine.cached_tokens_redis == (70 + 20 - 1) // 8 * 8
    # And the turn after that finds it all in memory.
    _, later = _generate(restarted, [*turn2, 5, 6, 7], cache_salt="alice")
    assert later.cached_tokens >= len(turn2) // 8 * 8


def _busy_engine(engine: LLMEngine) -> tuple[list[list[int]], int]:
    """WRITE_BACK_BUSY_SEQS + 2 requests at once, the first two short: stepped until those
    two finish, while the rest still run. The prompts, and the full blocks of the short two."""
    from inference.engine.engine import WRITE_BACK_BUSY_SEQS

    prompts = [_prompt(24, seed=40 + i) for i in range(WRITE_BACK_BUSY_SEQS + 2)]
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, greedy(3 if i < 2 else 30, ignore_eos=True), request_id=f"r{i}")
    finished: set[str] = set()
    while not {"r0", "r1"} <= finished:
        finished.update(d.request_id for d in engine.step() if d.finish_reason is not None)
    assert len(engine.seqs) == len(prompts) - 2
    return prompts, 2 * ((24 + 3 - 1) // 8)


def test_while_busy_finished_blocks_wait_and_reach_redis_once_quiet(tier_engine, store, namespace):
    engine = tier_engine()
    prompts, short_blocks = _busy_engine(engine)
    assert engine.kv_tier is not None and engine.kv_tier.flush(5)
    assert len(engine._deferred) == short_blocks and not _entries(store, namespace)
    run_to_completion(engine)  # the engine goes quiet: everything is written
    assert engine.kv_tier.flush(5) and not engine._deferred
    assert len(_entries(store, namespace)) == short_blocks + (len(prompts) - 2) * (
        (24 + 30 - 1) // 8
    )
    # And restored from there by another engine.
    _, figures = _generate(tier_engine(), [*prompts[0], 7, 7, 7, 7, 7, 7, 7, 7, 7])
    assert figures.cached_tokens_redis == 24


def test_blocks_still_waiting_at_close_are_written(tier_engine, store, namespace):
    engine = tier_engine()
    _, short_blocks = _busy_engine(engine)
    assert len(engine._deferred) == short_blocks
    engine.close(flush_timeout=10)
    assert len(_entries(store, namespace)) >= short_blocks
