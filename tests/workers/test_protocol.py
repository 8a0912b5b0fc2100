"""The worker protocol without workers: what travels survives the trip, figures add up,
and a web process with no worker to reach says so at once."""

from __future__ import annotations

import time
from pathlib import Path

import msgpack
import pytest

from inference.backends.remote import combine
from inference.engine import (
    Delta,
    EngineBusyError,
    PromptTooLongError,
    RequestFigures,
    SamplingParams,
)
from inference.workers import protocol
from inference.workers.protocol import EngineUnavailableError
from tests.engine_workers import distributed_client
from tools.live_server import free_port


def through_the_layer(message: dict) -> dict:
    """What the channel layer does to a message: msgpack there and back."""
    return msgpack.unpackb(msgpack.packb(message), raw=False)


def test_a_finished_delta_arrives_with_its_figures_and_worker() -> None:
    m = RequestFigures(arrival_time=1.0, scheduled_time=1.1, first_token_time=1.2,
                       finish_time=1.5, token_times=[1.2, 1.3, 1.5], prompt_tokens=40,
                       cached_tokens=16, cached_tokens_redis=16, output_tokens=3)  # fmt: skip
    delta = Delta("r1", text="hi", token_ids=[5, 6], finished=True, finish_reason="stop",
                  figures=m)  # fmt: skip
    event = through_the_layer(protocol.delta_event(delta))
    back = protocol.delta_from_event(event, "worker-7")
    assert back.figures is not None and back.figures.worker == "worker-7"
    back.figures.__dict__.pop("worker")
    assert back == delta
    assert back.figures.itl == m.itl and back.figures.ttft == m.ttft
    assert (back.figures.cached_tokens, back.figures.cached_tokens_redis) == (16, 16)


def test_sampling_settings_survive_and_unknown_fields_are_dropped() -> None:
    s = SamplingParams(max_tokens=7, temperature=0.3, top_k=5, seed=9, stop=["\n"])
    message = through_the_layer(protocol.generate_message("r", [1, 2], s, "conv-1", "reply!x"))
    assert message["prompt"] == [1, 2] and message["session_id"] == "conv-1"
    assert protocol.sampling_from_dict({**message["sampling"], "from_the_future": 1}) == s


def test_a_request_carries_its_cache_scope_to_the_worker() -> None:
    s = SamplingParams(max_tokens=2)
    message = through_the_layer(
        protocol.generate_message(
            "r", [1, 2], s, None, "reply!x", cache_salt="owner-salt", shared_prefix_tokens=32
        )
    )
    assert (message["cache_salt"], message["shared_prefix_tokens"]) == ("owner-salt", 32)


@pytest.mark.parametrize("error", [EngineBusyError, PromptTooLongError, EngineUnavailableError])
def test_a_refusal_is_raised_again_as_the_same_error(error: type[Exception]) -> None:
    event = through_the_layer(protocol.refusal_event("r", error("no room")))
    assert protocol.is_refusal(event)
    again = protocol.error_from_event(event)
    assert type(again) is error and str(again) == "no room"


def test_worker_ids_make_valid_channel_names() -> None:
    wid = protocol.safe_worker_id("my host:with/odd chars" + "x" * 100)
    assert protocol.worker_channel(wid).startswith("engine.worker.my-host-with-odd-chars")
    assert len(protocol.worker_channel(wid)) < 100


def test_stats_add_up_across_workers() -> None:
    a = {"running": 2, "waiting": 1, "kv_blocks_total": 100, "last_step_seconds": 0.02,
         "prefix_cache_queries": 10, "prefix_cache_hits": 5, "prefix_cache_hit_rate": 0.5,
         "total_requests": 7, "dtype": "float32", "max_model_len": 2048}  # fmt: skip
    b = {**a, "running": 1, "waiting": 0, "last_step_seconds": 0.05, "prefix_cache_hits": 0,
         "prefix_cache_hit_rate": 0.0, "max_model_len": 1024}  # fmt: skip
    s = combine([a, b])
    assert (s["running"], s["waiting"], s["kv_blocks_total"], s["total_requests"]) == (
        3,
        1,
        200,
        14,
    )
    assert s["last_step_seconds"] == 0.05 and s["max_model_len"] == 1024
    assert s["prefix_cache_hit_rate"] == 0.25 and s["dtype"] == "float32"
    assert combine([]) == {"running": 0, "waiting": 0}


async def test_no_live_worker_is_a_clear_error(tiny_model_dir: Path) -> None:
    with distributed_client(tiny_model_dir, "test-nobody-home") as client:
        with pytest.raises(EngineUnavailableError, match="no engine worker is running"):
            async for _ in client.generate([1, 2, 3], SamplingParams(max_tokens=2)):
                pass
        assert client.stats()["workers"] == []
        assert client.max_model_len is None


async def test_unreachable_redis_is_a_clear_error_not_a_hang(tiny_model_dir: Path) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/3"
    with distributed_client(tiny_model_dir, "test-no-redis", url=nobody) as client:
        started = time.monotonic()
        with pytest.raises(EngineUnavailableError, match="Redis"):
            async for _ in client.generate([1, 2, 3], SamplingParams(max_tokens=2)):
                pass
        assert time.monotonic() - started < 3
        assert "Redis" in client.stats()["error"]
