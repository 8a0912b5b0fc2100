"""The Redis client of the tier and its upkeep: no retries and short timeouts, as the
tier is a cache and a slow answer is a miss."""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

# Short socket timeouts: a dead Redis costs a lookup at most this long.
SOCKET_TIMEOUT_S = 0.5


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=SOCKET_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
        socket_read_size=1 << 20,
    )
