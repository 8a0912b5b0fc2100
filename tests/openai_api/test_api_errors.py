"""Which status and code each engine-side failure answers with on the OpenAI API, and
what the request's record keeps of a failed request. The distributed cases, against real
workers, are in tests/workers/test_api_status.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from chatapp.observability.models import RequestRecord
from chatapp.openai_api import streams
from chatapp.openai_api.views import engine_failure, failed_reply, sse
from inference.backends.upstream import _error_for
from inference.engine import Delta, EngineBusyError, EngineError, PromptTooLongError
from inference.engine.errors import InvalidRequestError
from inference.workers.protocol import (
    LOST_CONTACT,
    STOPPED,
    WORKER_LOST,
    EngineUnavailableError,
    lost_delta,
)


def answer(error: object) -> tuple[int, str | None, str, str | None]:
    """(status, code, type, Retry-After) of an ApiError."""
    return (error.status, error.code, error.type, error.headers.get("Retry-After"))  # type: ignore[attr-defined]


def test_each_engine_error_type_has_its_status_and_code() -> None:
    assert answer(engine_failure(EngineBusyError("full"))) == (503, "busy", "server_error", "1")
    unavailable = engine_failure(EngineUnavailableError("no engine worker is running"))
    assert answer(unavailable) == (503, "engine_unavailable", "server_error", "5")
    too_long = engine_failure(PromptTooLongError("too long"), "prompt")
    assert answer(too_long) == (400, "context_length_exceeded", "invalid_request_error", None)
    assert too_long.param == "prompt"
    bad = engine_failure(InvalidRequestError("token ids out of range"))
    assert answer(bad)[0] == 400 and answer(bad)[2] == "invalid_request_error"
    assert answer(engine_failure(EngineError("kernel failed"))) == (
        500,
        "engine_error",
        "server_error",
        None,
    )


def test_an_unavailable_engine_does_not_tell_the_client_where_redis_is() -> None:
    exc = EngineUnavailableError("cannot reach the engine workers: Redis at redis://:pw@h:1/3")
    assert "redis" not in json.dumps(engine_failure(exc).body()).lower()


@pytest.mark.parametrize("why", [WORKER_LOST, STOPPED, f"{LOST_CONTACT}: Redis did not answer"])
def test_a_reply_whose_worker_went_away_fails_with_worker_lost(why: str) -> None:
    error = failed_reply(lost_delta("r1", why))
    assert answer(error) == (503, "worker_lost", "server_error", "1")


def test_a_reply_the_engine_failed_is_an_engine_error() -> None:
    error = failed_reply(lost_delta("r1", "the engine worker failed: CUDA error"))
    assert answer(error) == (500, "engine_error", "server_error", None)


def test_a_streamed_error_is_an_sse_error_event_with_the_same_object() -> None:
    error = failed_reply(lost_delta("r1", WORKER_LOST))
    event = sse(error.body(), event="error").decode()
    head, data = event.removesuffix("\n\n").split("\n")
    assert head == "event: error"
    assert json.loads(data.removeprefix("data: ")) == error.body()


def test_an_upstream_that_fails_is_an_engine_error_and_one_out_of_reach_is_unavailable() -> None:
    assert type(_error_for(500, '{"error": {"message": "boom"}}')) is EngineError
    assert isinstance(_error_for(502, "bad gateway"), EngineUnavailableError)
    assert isinstance(_error_for(503, ""), EngineBusyError)


async def refused(worker: str | None) -> AsyncIterator[Delta]:
    exc = EngineBusyError("the engine is busy")
    exc.worker = worker
    raise exc
    yield Delta("never")  # an async generator, as the engines' streams are


async def lost_after(tokens: int) -> AsyncIterator[Delta]:
    for i in range(tokens):
        yield Delta("api-lost", text="x", token_ids=[i])
    yield lost_delta("api-lost", STOPPED)


@pytest.mark.django_db(transaction=True)
async def test_a_refused_request_is_recorded_with_its_worker_and_prompt_length() -> None:
    stream = streams.recorded_stream(
        refused("w7"), "api", prompt_tokens=37, request_id="api-refused"
    )
    with pytest.raises(EngineBusyError):
        await stream.__anext__()
    rec = await RequestRecord.objects.aget(request_id="api-refused")
    assert (rec.worker, rec.prompt_tokens, rec.output_tokens) == ("w7", 37, 0)
    assert (rec.finish_reason, rec.error_code) == ("error", "busy")


@pytest.mark.django_db(transaction=True)
async def test_a_reply_cut_short_is_recorded_as_worker_lost_with_its_counts() -> None:
    stream = streams.recorded_stream(lost_after(5), "api", prompt_tokens=12)
    deltas = [d async for d in stream]
    assert deltas[-1].finish_reason == "error"
    rec = await RequestRecord.objects.aget(request_id="api-lost")
    assert (rec.prompt_tokens, rec.output_tokens) == (12, 5)
    assert (rec.finish_reason, rec.error_code) == ("error", "worker_lost")
