"""Where a request's figures go when it ends: the Prometheus histograms at once, and a
RequestRecord row (the dashboard's raw material).

The chat path calls `record_request` from Generation._finish; the OpenAI API wraps its
engine stream in `recorded_stream`, which records when the stream is closed. Neither
can fail the request: a recording error is logged and dropped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from inference import metrics, stats
from inference.engine import Delta, EngineError, RequestMetrics
from inference.workers.protocol import is_worker_lost

log = logging.getLogger(__name__)

WORKER = f"{socket.gethostname()}:{os.getpid()}"


def figures(
    m: RequestMetrics | None, finish_reason: str, error_code: str | None, ended: float
) -> dict[str, Any]:
    """A RequestRecord's fields from the engine's figures (vLLM's definitions)."""
    fig: dict[str, Any] = {
        "finish_reason": finish_reason or "",
        "error_code": error_code or "",
        "finished_at": datetime.fromtimestamp(ended, UTC),
        # The engine worker that served it (distributed mode), else this process.
        "worker": str(getattr(m, "worker", "") or WORKER),
    }
    if m is None:
        return fig
    itl = m.itl
    first, sched, fin = m.first_token_time, m.scheduled_time, m.finish_time
    fig.update(
        ttft=m.ttft,
        tpot=m.tpot,
        itl_p50=stats.percentile(itl, 50),
        itl_p90=stats.percentile(itl, 90),
        itl_p99=stats.percentile(itl, 99),
        itl_hist=stats.histogram(itl),
        queue_time=m.queue_time,
        prefill_time=first - sched if first is not None and sched is not None else None,
        decode_time=fin - first if fin is not None and first is not None else None,
        network_time=max(0.0, ended - fin) if fin is not None else None,
        e2e=m.e2e,
        prompt_tokens=m.prompt_tokens,
        cached_tokens=m.cached_tokens,
        # Figures other backends (upstream servers, replays) lack stay 0.
        cached_tokens_redis=int(getattr(m, "cached_tokens_redis", 0) or 0),
        output_tokens=m.output_tokens,
        drafted_tokens=int(getattr(m, "drafted_tokens", 0) or 0),
        accepted_tokens=int(getattr(m, "accepted_tokens", 0) or 0),
        preemptions=m.preemptions,
        replayed=bool(getattr(m, "replayed", False)),
    )
    return fig


def _model_name() -> str:
    return os.path.basename(str(settings.ENGINE["MODEL"]).rstrip("/")) or "model"


def save(fig: dict[str, Any], **who: Any) -> Any:
    """Store one request's figures (sync); start a title job after a first reply."""
    from chatapp.models import Conversation
    from inference.models import RequestRecord

    conversation_id = who.get("conversation_id")
    user_id = who.get("user_id")
    if conversation_id is not None and user_id is None:
        user_id = (
            Conversation.objects.filter(pk=conversation_id)
            .values_list("owner_id", flat=True)
            .first()
        )
        if user_id is None:
            conversation_id = None  # deleted while the reply streamed
    record = RequestRecord.objects.create(
        source=who.get("source", "chat"),
        request_id=who.get("request_id", "")[:80],
        user_id=user_id,
        conversation_id=conversation_id,
        **fig,
    )
    if conversation_id is not None and not fig["error_code"] and fig["finish_reason"] != "error":
        from inference import titles

        titles.maybe_start(conversation_id)
    return record


async def record_request(
    source: str,
    request_id: str,
    m: RequestMetrics | None,
    finish_reason: str,
    error_code: str | None = None,
    *,
    conversation_id: int | None = None,
    user_id: int | None = None,
) -> None:
    """A request ended: observe its figures and store them. Never raises."""
    ended = time.time()
    try:
        fig = figures(m, finish_reason, error_code, ended)
        metrics.observe_request(_model_name(), fig, m.itl if m else [])
        from inference import sampler

        sampler.ensure_started()
        await asyncio.shield(
            database_sync_to_async(save)(
                fig,
                source=source,
                request_id=request_id,
                conversation_id=conversation_id,
                user_id=user_id,
            )
        )
    except asyncio.CancelledError:
        pass
    except Exception:
        log.exception("could not record request %s", request_id)


async def recorded_stream(
    stream: AsyncIterator[Delta],
    source: str,
    user_id: int | None = None,
    prompt_tokens: int | None = None,
    request_id: str = "",
) -> AsyncGenerator[Delta, None]:
    """Pass an engine stream through, recording the request when the stream is closed
    (finished, aborted, or refused before its first delta).

    A request that ends without the engine's figures (refused, or its worker lost) is
    still recorded with its worker, its `prompt_tokens` (the prompt's length, when this
    side knows it) and the tokens that came."""
    arrival = time.time()
    last: Delta | None = None
    output_tokens = 0
    error: EngineError | None = None
    try:
        async for delta in stream:
            last = delta
            output_tokens += len(delta.token_ids)
            yield delta
    except EngineError as exc:
        error = exc
        raise
    finally:
        closer = getattr(stream, "aclose", None)
        if closer is not None:
            await closer()
        finished = last is not None and last.finished
        reason = (last.finish_reason or "stop") if finished and last else "abort"
        error_code: str | None = None
        if error is not None:
            error_code, reason = error.code, "error"
        elif reason == "error":
            assert last is not None
            error_code = "worker_lost" if is_worker_lost(last) else "engine_error"
        m = last.metrics if finished and last else None
        if m is None and (error is not None or output_tokens or prompt_tokens):
            m = RequestMetrics(
                arrival_time=arrival,
                prompt_tokens=prompt_tokens or 0,
                output_tokens=output_tokens,
            )
            if error is not None and error.worker is not None:
                m.worker = error.worker  # type: ignore[attr-defined]
        await record_request(
            source,
            last.request_id if last else request_id,
            m,
            reason,
            error_code,
            user_id=user_id,
        )
