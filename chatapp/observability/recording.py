"""Where a request's figures go when it ends: the Prometheus histograms at once, and a
RequestRecord row (the dashboard's raw material).

The chat (Generation._finish) and the OpenAI API (openai_api/streams.py) announce each
request's end (chatapp.events.request_ended); `on_request_ended`, connected in apps.py,
records it. Recording never fails the request: an error is logged and dropped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from chatapp import db_worker
from chatapp.observability import percentiles
from chatapp.observability.models import RequestRecord
from inference import metrics
from inference.catalog import model_name
from inference.engine import RequestFigures

log = logging.getLogger(__name__)

WORKER = f"{socket.gethostname()}:{os.getpid()}"


def record_fields(
    m: RequestFigures | None, finish_reason: str, error_code: str | None, ended: float
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
        itl_p50=percentiles.percentile(itl, 50),
        itl_p90=percentiles.percentile(itl, 90),
        itl_p99=percentiles.percentile(itl, 99),
        itl_hist=percentiles.histogram(itl),
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


def save(fig: dict[str, Any], **who: Any) -> RequestRecord:
    """Store one request's figures (sync)."""
    conversation_id = who.get("conversation_id")
    if conversation_id is not None:
        # Read through the foreign key: observability imports nothing of the chat.
        conversations = RequestRecord.conversation.field.related_model.objects
        if not conversations.filter(pk=conversation_id).exists():
            conversation_id = None  # deleted while the reply streamed
    return RequestRecord.objects.create(
        source=who.get("source", "chat"),
        request_id=who.get("request_id", "")[:80],
        user_id=who.get("user_id"),
        conversation_id=conversation_id,
        **fig,
    )


async def record_request(
    source: str,
    request_id: str,
    m: RequestFigures | None,
    finish_reason: str,
    error_code: str | None = None,
    *,
    conversation_id: int | None = None,
    user_id: int | None = None,
    model: str = "",
) -> None:
    """A request ended: observe its figures (labelled with its model, blank: the default
    model) and store them. Never raises."""
    ended = time.time()
    try:
        fig = record_fields(m, finish_reason, error_code, ended)
        label = model or model_name(settings.ENGINE["MODEL"])
        metrics.observe_request(label, fig, m.itl if m else [])
        await asyncio.shield(
            db_worker.run(
                save,
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


async def on_request_ended(
    sender: str,
    request_id: str,
    figures: RequestFigures | None,
    finish_reason: str,
    error_code: str | None,
    conversation_id: int | None,
    user_id: int | None,
    model: str = "",
    **_: Any,
) -> None:
    """The receiver of chatapp.events.request_ended (connected in apps.py)."""
    await record_request(
        sender,
        request_id,
        figures,
        finish_reason,
        error_code,
        conversation_id=conversation_id,
        user_id=user_id,
        model=model,
    )
