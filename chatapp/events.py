"""What the web apps tell each other without importing each other (a declared shared
module: the import contracts in pyproject.toml allow it to every app).

`request_ended`: a chat reply or an OpenAI API request ended (finished, stopped, refused
or failed), with the engine's figures. The chat and the API send it; observability
(chatapp/observability/apps.py) connects the receiver that observes and stores them.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from inference.engine import RequestFigures

log = logging.getLogger(__name__)

# Keyword arguments: request_id, figures (RequestFigures | None), finish_reason, error_code
# (str | None), conversation_id, user_id, model (the served model's name, blank: the
# default); the sender is the source ("chat" or "api").
request_ended = Signal()


async def send_request_ended(
    source: str,
    request_id: str,
    figures: RequestFigures | None,
    finish_reason: str,
    error_code: str | None = None,
    *,
    conversation_id: int | None = None,
    user_id: int | None = None,
    model: str = "",
) -> None:
    """Tell the receivers a request ended. Never raises: a receiver's failure is logged,
    it never fails the request."""
    fields: dict[str, Any] = {
        "request_id": request_id,
        "figures": figures,
        "finish_reason": finish_reason,
        "error_code": error_code,
        "conversation_id": conversation_id,
        "user_id": user_id,
        "model": model,
    }
    for receiver, result in await request_ended.asend_robust(sender=source, **fields):
        if isinstance(result, Exception):
            log.error("request %s: %r failed: %r", request_id, receiver, result)
