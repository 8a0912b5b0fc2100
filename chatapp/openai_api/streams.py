"""An engine stream as the API serves it, announcing the request's end when the stream is
closed (chatapp.events.request_ended: observability stores its figures)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator

from chatapp.events import send_request_ended
from inference.engine import Delta, EngineError, RequestFigures
from inference.workers.protocol import is_worker_lost


async def recorded_stream(
    stream: AsyncIterator[Delta],
    source: str,
    user_id: int | None = None,
    prompt_tokens: int | None = None,
    request_id: str = "",
    model: str = "",
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
        m = last.figures if finished and last else None
        if m is None and (error is not None or output_tokens or prompt_tokens):
            m = RequestFigures(
                arrival_time=arrival,
                prompt_tokens=prompt_tokens or 0,
                output_tokens=output_tokens,
            )
            if error is not None and error.worker is not None:
                m.worker = error.worker  # type: ignore[attr-defined]
        await send_request_ended(
            source,
            last.request_id if last else request_id,
            m,
            reason,
            error_code,
            user_id=user_id,
            model=model,
        )
