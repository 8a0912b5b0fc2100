"""The messages between web processes and engine workers over the Redis channel layer.

To a worker, on its channel `engine.worker.<id>`::

    {"type": "generate", "request_id": str, "prompt": [int], "sampling": {...},
     "session_id": str | None, "reply_to": str,
     "cache_salt": str | None, "shared_prefix_tokens": int, "model": str}
    {"type": "abort", "request_id": str}

To a web process, on the reply channel it named (one per process and event loop)::

    {"type": "events", "worker": str, "events": [event, ...]}

An event is either a delta (the engine's Delta as a dict; the finished one carries the
request's figures, token_times included) or a refusal raised before the first delta::

    {"request_id": str, "text": str, "token_ids": [int], "finished": bool,
     "finish_reason": str | None, "error": str | None, "figures": {...} | None,
     "logprobs": [[int, float, [[int, float], ...]], ...] | None}
    {"request_id": str, "refused": "busy" | "prompt_too_long" | ..., "error": str}

The channel layer packs messages with msgpack: plain dicts, lists, str, int, float, None.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import socket
from collections.abc import Callable
from typing import Any

from channels_redis.core import RedisChannelLayer
from redis.exceptions import ConnectionError, RedisError

from inference.engine.errors import (
    EngineBusyError,
    EngineError,
    InvalidRequestError,
    PromptTooLongError,
)
from inference.engine.outputs import Delta, RequestFigures, TokenLogprob
from inference.engine.sampling_params import SamplingParams
from inference.redis_options import REDIS_OPTIONS


class EngineUnavailableError(EngineError):
    """No engine can take the request: it failed to load, or no worker is reachable."""

    code = "engine_unavailable"


class ModelNotFoundError(EngineError):
    """No engine here serves the model a request names (OpenAI's `model_not_found`)."""

    code = "model_not_found"

    def __init__(self, model: str, served: list[str] | None = None) -> None:
        self.model = model
        self.served = sorted(served or [])
        known = f"; the models served are: {', '.join(self.served)}" if self.served else ""
        super().__init__(f"The model '{model[:100]}' is not served here{known}.")


# A refusal's code → the exception the web side raises again.
REFUSALS: dict[str, type[EngineError]] = {
    cls.code: cls
    for cls in (EngineBusyError, PromptTooLongError, InvalidRequestError, EngineUnavailableError)
}

# A worker that stops or dies mid-reply ends the reply with this error.
WORKER_LOST = (
    "the engine worker serving this reply stopped; what was written so far is saved "
    "- send again to continue"
)

# A worker stopped on purpose (SIGTERM, scale down) ends its replies with this.
STOPPED = "the engine worker was stopped; what was written so far is saved - send again to continue"
# The web side could not reach Redis (and so the workers) for too long.
LOST_CONTACT = "lost contact with the engine workers"

# Capacity per channel (messages waiting), and how long an unread message lives. Deltas
# are coalesced, so a reply channel holds a few messages at most while its reader keeps up.
CHANNEL_CAPACITY = 1000
CHANNEL_EXPIRY_S = 30
# What a Redis call raises when Redis is away or slow.
REDIS_ERRORS = (RedisError, OSError, TimeoutError)


def raise_if_cancelled(exc: BaseException | None = None) -> None:
    """Go on with a loop only if its task is not being cancelled. A Redis error may stand
    for a cancellation (redis-py's read timeout can turn the CancelledError into one), and
    Python 3.11's wait_for returns a result that lands together with the cancellation;
    a loop that carried on would never end, and asyncio.run's shutdown would wait on it
    forever. Long-lived loops call this each round and after catching a Redis error."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc


async def send(layer: Any, channel: str, message: dict[str, Any], timeout: float) -> None:
    """layer.send with a time limit, tried again once on a broken connection (a pooled
    connection is stale after Redis restarted)."""
    try:
        await asyncio.wait_for(layer.send(channel, message), timeout)
    except ConnectionError:
        await asyncio.wait_for(layer.send(channel, message), timeout)


async def receive(layer: Any, channel: str) -> dict[str, Any]:
    """layer.receive(channel), cancellable for sure. A blocking read (BZPOPMIN) can lose
    the CancelledError inside redis-py and go on waiting for the next message; closing
    the layer's connections ends it."""
    reading = asyncio.ensure_future(layer.receive(channel))
    reading.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved
    try:
        return await asyncio.shield(reading)
    except asyncio.CancelledError:
        for _ in range(3):  # the read may start over on a new connection: close again
            reading.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(layer.close_pools(), 2)
            if (await asyncio.wait({reading}, timeout=1))[0]:
                break
        raise


async def consume(
    layer: Any,
    channel: str,
    handle: Callable[[dict[str, Any]], None],
    on_failure: Callable[[Exception, bool], None],
    retry_s: float,
    log: logging.Logger,
) -> None:
    """Receive on `channel` until cancelled and hand each message to `handle`. A failed
    read (Redis away, the layer in a bad state) is reported to on_failure(exc, first of a
    streak) and retried after retry_s; a message `handle` chokes on is logged and skipped."""
    failing = False
    while True:
        raise_if_cancelled()
        try:
            message = await receive(layer, channel)
        except Exception as exc:
            raise_if_cancelled(exc)
            on_failure(exc, not failing)
            failing = True
            await asyncio.sleep(retry_s)
            continue
        failing = False
        try:
            handle(message)
        except Exception:
            log.exception("%s: bad message %.200r", channel, message)


def open_layer(url: str, namespace: str) -> Any:
    """A channels_redis layer on `url` whose keys start with `namespace`."""
    # No automatic retry here: a blocking read must fail, not reconnect, when its
    # connection is closed under it (see receive()); sends retry in send().
    host = {"address": url, **REDIS_OPTIONS, "retry_on_error": []}
    return RedisChannelLayer(
        hosts=[host],
        prefix=f"{namespace}:",
        capacity=CHANNEL_CAPACITY,
        expiry=CHANNEL_EXPIRY_S,
    )


def default_worker_id() -> str:
    return safe_worker_id(f"{socket.gethostname()}-{os.getpid()}")


def safe_worker_id(raw: str) -> str:
    """Channel names take letters, digits, '-', '_' and '.' only, under 100 characters."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", raw)[:60] or "worker"


def worker_channel(worker_id: str) -> str:
    return f"engine.worker.{worker_id}"


# --- requests to a worker -------------------------------------------------------------


def generate_message(
    request_id: str,
    prompt_token_ids: list[int],
    sampling: SamplingParams,
    session_id: str | None,
    reply_to: str,
    cache_salt: str | None = None,
    shared_prefix_tokens: int = 0,
    model: str = "",
) -> dict[str, Any]:
    """A request for a worker; `cache_salt` and `shared_prefix_tokens` scope its prefix
    reuse on the worker as in LLMEngine.add_request (the web side derives them); `model`
    is the model it was routed for (a worker serving another refuses it)."""
    return {
        "type": "generate",
        "request_id": request_id,
        "prompt": [int(t) for t in prompt_token_ids],
        "sampling": dataclasses.asdict(sampling),
        "session_id": session_id,
        "reply_to": reply_to,
        "cache_salt": cache_salt,
        "shared_prefix_tokens": int(shared_prefix_tokens),
        "model": model,
    }


def abort_message(request_id: str) -> dict[str, Any]:
    return {"type": "abort", "request_id": request_id}


def sampling_from_dict(d: dict[str, Any]) -> SamplingParams:
    # Fields a newer web process knows and this worker does not are dropped.
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    return SamplingParams(**{k: v for k, v in d.items() if k in known})


# --- answers to a web process ---------------------------------------------------------


def delta_event(delta: Delta) -> dict[str, Any]:
    return {
        "request_id": delta.request_id,
        "text": delta.text,
        "token_ids": list(delta.token_ids),
        "finished": delta.finished,
        "finish_reason": delta.finish_reason,
        "error": delta.error,
        "figures": None if delta.figures is None else dataclasses.asdict(delta.figures),
        # [[token, logprob, [[token, logprob], ...]], ...] where the request asked for them.
        "logprobs": None
        if delta.logprobs is None
        else [[lp.token_id, lp.logprob, [list(t) for t in lp.top]] for lp in delta.logprobs],
    }


def refusal_event(request_id: str, exc: EngineError) -> dict[str, Any]:
    code = getattr(exc, "code", "engine_error")
    return {"request_id": request_id, "refused": code, "error": str(exc)}


def is_refusal(event: dict[str, Any]) -> bool:
    return "refused" in event


def error_from_event(event: dict[str, Any]) -> EngineError:
    """The refusal's exception, of the class the worker's engine raised."""
    return REFUSALS.get(event["refused"], EngineError)(event["error"])


def delta_from_event(event: dict[str, Any], worker_id: str = "") -> Delta:
    m = event.get("figures")
    figures = None
    if m is not None:
        known = {f.name for f in dataclasses.fields(RequestFigures)}
        figures = RequestFigures(**{k: v for k, v in m.items() if k in known})
        # Which worker served it, for the request's record (RequestRecord.worker).
        figures.worker = worker_id  # type: ignore[attr-defined]
    return Delta(
        request_id=event["request_id"],
        text=event.get("text") or "",
        token_ids=list(event.get("token_ids") or ()),
        finished=bool(event.get("finished")),
        finish_reason=event.get("finish_reason"),
        error=event.get("error"),
        figures=figures,
        logprobs=None
        if event.get("logprobs") is None
        else [
            TokenLogprob(int(t), float(lp), [(int(a), float(b)) for a, b in top])
            for t, lp, top in event["logprobs"]
        ],
    )


def lost_delta(request_id: str, why: str = WORKER_LOST) -> Delta:
    return Delta(request_id, finished=True, finish_reason="error", error=why)


def is_worker_lost(delta: Delta) -> bool:
    """Did this reply end because its worker stopped, died or became unreachable (as
    opposed to the model failing)? The chat then tells the user to send again."""
    error = delta.error or ""
    return delta.finish_reason == "error" and (
        error in (WORKER_LOST, STOPPED) or error.startswith(LOST_CONTACT)
    )
