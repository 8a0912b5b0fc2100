"""The tier's Redis key names and the small Lua scripts that keep its books: a last-use
sorted set and a byte counter beside the entries, so the tier stays under its size cap,
least recently used out first."""

from __future__ import annotations

import redis

# KEYS: entry, lru zset, sizes hash, byte counter. ARGV: value, ttl, now.
_WRITE = """
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
local n = string.len(ARGV[1])
local old = tonumber(redis.call('HGET', KEYS[3], KEYS[1]) or 0)
redis.call('HSET', KEYS[3], KEYS[1], n)
redis.call('INCRBY', KEYS[4], n - old)
redis.call('ZADD', KEYS[2], ARGV[3], KEYS[1])
return n
"""
# KEYS: lru zset, then entries. ARGV: ttl, now. Refreshes TTL and last use of live entries.
_TOUCH = """
local missing = 0
for i = 2, #KEYS do
  if redis.call('EXPIRE', KEYS[i], ARGV[1]) == 1 then
    redis.call('ZADD', KEYS[1], ARGV[2], KEYS[i])
  else
    missing = missing + 1
  end
end
return missing
"""
# KEYS: lru zset, sizes hash, byte counter. ARGV: cap in bytes. Oldest out until under cap.
_EVICT = """
local total = tonumber(redis.call('GET', KEYS[3]) or 0)
local cap = tonumber(ARGV[1])
local evicted = 0
while total > cap do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 63)
  if #oldest == 0 then break end
  for _, k in ipairs(oldest) do
    total = total - tonumber(redis.call('HGET', KEYS[2], k) or 0)
    redis.call('UNLINK', k)
    redis.call('ZREM', KEYS[1], k)
    redis.call('HDEL', KEYS[2], k)
    evicted = evicted + 1
    if total <= cap then break end
  end
end
if evicted > 0 then redis.call('SET', KEYS[3], total) end
return evicted
"""
# KEYS: lru zset, sizes hash, byte counter, then entries. ARGV: 'delete' (all of them) or
# 'gone' (only those whose key expired). Drops them and their bookkeeping.
_FORGET = """
local removed, freed = 0, 0
for i = 4, #KEYS do
  local k = KEYS[i]
  if ARGV[1] == 'delete' or redis.call('EXISTS', k) == 0 then
    redis.call('UNLINK', k)
    local n = tonumber(redis.call('HGET', KEYS[2], k) or 0)
    if redis.call('HDEL', KEYS[2], k) == 1 then freed = freed + n end
    redis.call('ZREM', KEYS[1], k)
    removed = removed + 1
  end
end
if freed > 0 then redis.call('DECRBY', KEYS[3], freed) end
return {removed, freed}
"""


class TierKeys:
    """The tier's Redis key names and its bookkeeping scripts."""

    def __init__(self, client: redis.Redis, namespace: str, fingerprint: str = "") -> None:
        self.prefix = f"{namespace}:{fingerprint}:"
        self.lru = f"{namespace}:lru"
        self.sizes = f"{namespace}:sizes"
        self.total = f"{namespace}:bytes"
        self.meta = [self.lru, self.sizes, self.total]
        self.write = client.register_script(_WRITE)
        self.touch = client.register_script(_TOUCH)
        self.evict = client.register_script(_EVICT)
        self.forget = client.register_script(_FORGET)

    def entry(self, digest: bytes) -> str:
        return self.prefix + digest.hex()
