"""The tier's periodic upkeep (a job of the web app runs it): the books of entries whose
TTL ran out are dropped, the size cap is enforced again, and the size is reported."""

from __future__ import annotations

from typing import cast

import redis

from inference.engine.kv_tier.connection import connect
from inference.engine.kv_tier.keys import TierKeys


def upkeep(client: redis.Redis, namespace: str, max_bytes: int) -> dict[str, int]:
    """Drop bookkeeping of entries whose TTL ran out, enforce the cap, report the size."""
    keys = TierKeys(client, namespace)
    # connect() keeps responses as bytes (decode_responses is off).
    members = [m.decode() for m in cast("list[bytes]", client.zrange(keys.lru, 0, -1))]
    expired = 0
    for i in range(0, len(members), 500):
        removed, _ = keys.forget(keys=keys.meta + members[i : i + 500], args=["gone"])
        expired += int(removed)
    evicted = int(keys.evict(keys=keys.meta, args=[max_bytes]))
    return {
        "entries": int(client.zcard(keys.lru)),
        "bytes": int(client.get(keys.total) or 0),
        "expired_dropped": expired,
        "evicted": evicted,
    }


def upkeep_url(url: str, namespace: str, max_mb: int) -> dict[str, int]:
    """upkeep() for a periodic job that has settings, not an engine."""
    client = connect(url)
    try:
        return upkeep(client, namespace, max_mb * 2**20)
    finally:
        client.close()
