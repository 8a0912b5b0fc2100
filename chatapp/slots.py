"""Concurrency limits that hold across every web process (CHANNEL_LAYER=redis): the chat's
replies per user (CHAT_MAX_CONCURRENT_STREAMS) and one reply per conversation, an API
key's concurrent requests (max_concurrent). Each process still counts its own in memory
first; these leases are the count of all of them.

A lease is a member of a sorted set in Redis scored by when it lapses; the holder renews
it every RENEW_S while it runs, so the leases of a process that died lapse within
LEASE_TTL_MS instead of holding their slots forever. Redis's own clock scores them, so
replicas on hosts whose clocks differ agree. Like the per-minute counters (ratelimit.py),
the limits fail open: with Redis away a request is served, counted in its process only.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from redis import asyncio as aioredis
from redis.exceptions import RedisError

from inference.redis_options import REDIS_OPTIONS

log = logging.getLogger(__name__)

LEASE_TTL_MS = 15_000
RENEW_S = 5.0
ERRORS = (RedisError, OSError, TimeoutError)

# KEYS: the set of leases, and optionally a lock the lease must also hold (one holder).
# ARGV: ttl ms, limit, token. Returns -2 when taken, -1 when the lock has another holder,
# else the number of leases already held (the limit is reached).
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if #KEYS > 1 then
  local holder = redis.call('GET', KEYS[2])
  if holder and holder ~= ARGV[3] then return -1 end
end
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[2]) then return n end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
if #KEYS > 1 then redis.call('SET', KEYS[2], ARGV[3], 'PX', ttl) end
return -2
"""
# KEYS and ARGV[1] as above; ARGV[2]: the token. Renews (ARGV[3] == "1") or releases.
_KEEP = """
local token = ARGV[2]
if ARGV[3] == '1' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), token)
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  if #KEYS > 1 and redis.call('GET', KEYS[2]) == token then
    redis.call('PEXPIRE', KEYS[2], ARGV[1])
  end
else
  redis.call('ZREM', KEYS[1], token)
  if #KEYS > 1 and redis.call('GET', KEYS[2]) == token then redis.call('DEL', KEYS[2]) end
end
return 0
"""


class LimitReached(Exception):
    def __init__(self, held: int) -> None:
        super().__init__(f"{held} held")
        self.held = held


class Locked(Exception):
    """The lock is held by another lease."""


@dataclass(frozen=True)
class Lease:
    keys: tuple[str, ...]
    token: str


@dataclass
class _Loop:
    redis: Any
    held: set[Lease] = field(default_factory=set)
    renewer: asyncio.Task[None] | None = None


def enabled() -> bool:
    return settings.CHANNEL_LAYER == "redis"


def key(name: str) -> str:
    return f"{settings.CHANNEL_LAYER_PREFIX}:slots:{name}"


class Leases:
    def __init__(self) -> None:
        self._loops: dict[asyncio.AbstractEventLoop, _Loop] = {}

    def _here(self) -> _Loop:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = _Loop(aioredis.Redis.from_url(settings.REDIS_URL, **REDIS_OPTIONS))
            self._loops[loop] = state
        if state.renewer is None or state.renewer.done():
            state.renewer = loop.create_task(self._renew(state))
        return state

    async def acquire(self, name: str, limit: int, lock: str | None = None) -> Lease | None:
        """One of `limit` leases on `name` (and the lock `lock`, if given), across every
        process; None when not shared (one process) or Redis is away. Raises LimitReached
        or Locked."""
        if not enabled():
            return None
        lease = Lease((key(name), *([key(lock)] if lock else [])), uuid.uuid4().hex)
        state = self._here()
        try:
            got = await state.redis.eval(
                _ACQUIRE, len(lease.keys), *lease.keys, LEASE_TTL_MS, limit, lease.token
            )
        except ERRORS as exc:
            log.warning("shared limits unavailable (%r); counting in this process only", exc)
            return None
        if got == -1:
            raise Locked
        if got != -2:
            raise LimitReached(int(got))
        state.held.add(lease)
        return lease

    async def with_lock(self, lease: Lease, lock: str) -> Lease:
        """The lease, now holding the lock `lock` too: for what had no name yet when its
        lease was taken (a new conversation). Redis away: the lease as it was."""
        state = self._here()
        locked = Lease((*lease.keys, key(lock)), lease.token)
        try:
            await state.redis.set(key(lock), lease.token, px=LEASE_TTL_MS)
        except ERRORS as exc:
            log.warning("lock %s not taken (%r)", lock, exc)
            return lease
        state.held.discard(lease)
        state.held.add(locked)
        return locked

    async def release(self, lease: Lease | None) -> None:
        if lease is None:
            return
        state = self._here()
        state.held.discard(lease)
        try:
            await state.redis.eval(_KEEP, len(lease.keys), *lease.keys, 0, lease.token, "0")
        except ERRORS as exc:
            log.warning("lease left to lapse (%r)", exc)

    def release_soon(self, lease: Lease | None) -> None:
        """`release` from code that cannot await: on the running loop, else (no loop) the
        lease is only no longer renewed, and lapses within LEASE_TTL_MS."""
        if lease is None:
            return
        for state in self._loops.values():
            state.held.discard(lease)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self.release(lease))
        _background.add(task)
        task.add_done_callback(_background.discard)

    async def _renew(self, state: _Loop) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            if not state.held:
                continue
            try:
                pipe = state.redis.pipeline(transaction=False)
                for lease in list(state.held):
                    pipe.eval(_KEEP, len(lease.keys), *lease.keys, LEASE_TTL_MS, lease.token, "1")
                await pipe.execute()
            except ERRORS as exc:
                log.warning("could not renew the leases: %r", exc)


_background: set[asyncio.Task[None]] = set()
leases = Leases()
