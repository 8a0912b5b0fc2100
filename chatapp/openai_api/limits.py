"""Per-API-key limits: requests per minute (django-ratelimit's counters in the Django
cache, shared by every process when the cache is Redis) and concurrent streams (counted
in this process, and across every web replica with the Redis channel layer: slots.py)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest

from chatapp.ratelimit import counted_usage
from chatapp.slots import Lease, LimitReached, leases

log = logging.getLogger(__name__)


class RateLimited(Exception):
    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class KeyLimiter:
    def __init__(self) -> None:
        self.active: dict[int, int] = defaultdict(int)

    def limits(self, key: Any) -> tuple[int, int]:
        per_minute = key.rate_limit_per_minute or settings.OPENAI_RATE_LIMIT_PER_MINUTE
        concurrent = key.max_concurrent or settings.OPENAI_MAX_CONCURRENT
        return per_minute, concurrent

    async def acquire(self, key: Any, request: HttpRequest) -> Callable[[], Awaitable[None]]:
        """Count one request against `key`; return the function that ends it (idempotent;
        awaited, the slot is free in Redis too, so the client may send its next request at
        once: a response gives its slot back before its last byte).

        The concurrency slot is checked and claimed before anything is awaited, so
        requests arriving together cannot all pass the check; a request refused by the
        per-minute limit gives its slot straight back."""
        per_minute, concurrent = self.limits(key)
        if self.active[key.pk] >= concurrent:
            raise RateLimited(
                f"Too many concurrent requests: at most {concurrent} for this key.", 1
            )
        self.active[key.pk] += 1
        released = False
        lease: Lease | None = None

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.active[key.pk] -= 1
                if self.active[key.pk] <= 0:
                    del self.active[key.pk]
                await asyncio.shield(leases.release(lease))

        try:
            lease = await leases.acquire(f"api-key:{key.pk}", concurrent)
        except LimitReached as exc:
            await release()
            raise RateLimited(
                f"Too many concurrent requests: at most {concurrent} for this key.", 1
            ) from exc
        except BaseException:
            await release()
            raise
        try:
            usage = await counted_usage(
                request,
                group="openai-api",
                key=lambda _g, _r: str(key.pk),
                rate=f"{per_minute}/m",
                increment=True,
            )
        except BaseException:
            await release()
            raise
        if usage and usage["should_limit"]:
            await release()
            # django-ratelimit's time_left is whole seconds to its window's edge, counted
            # from the second now is in, and that window still counts its last second: the
            # window is over only a second later.
            retry = max(1, math.ceil(usage.get("time_left", 60)) + 1)
            raise RateLimited(
                f"Rate limit reached: {per_minute} requests per minute for this key.", retry
            )
        return release


limiter = KeyLimiter()

__all__ = ["KeyLimiter", "RateLimited", "limiter"]
