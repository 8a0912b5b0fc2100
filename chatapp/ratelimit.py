"""django-ratelimit's counters, failing open (a declared shared module: the chat socket's
per-user and the API keys' limits count through it; the log-in throttle keeps counters of
its own, whose window opens at the first failure: accounts/login_throttle.py).
The counters live in the Django cache, shared by every process when that is Redis."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from django_ratelimit.core import get_usage

log = logging.getLogger(__name__)


def usage(request: HttpRequest, **kwargs: Any) -> dict[str, Any] | None:
    """The counter's usage (get_usage's keyword arguments); None when the cache (Redis) is
    away: requests are then served uncounted and a warning is logged, rather than refused."""
    try:
        return get_usage(request, **kwargs)
    except Exception as exc:
        log.warning("rate-limit counters unavailable (%s); not limiting", exc)
        return None


async def counted_usage(request: Any, **kwargs: Any) -> dict[str, Any] | None:
    """`usage` from async code."""
    return await sync_to_async(usage)(request, **kwargs)
