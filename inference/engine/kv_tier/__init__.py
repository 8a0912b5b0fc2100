"""The Redis tier of the KV cache: full prefix blocks kept across restarts and shared by workers.

One idea per file:

    blocks.py      what a block is: its layout, an entry to write, a prefix restored
    wire.py        the stored value: header, token ids, K/V bytes, crc32 (encode, verify)
    keys.py        the Redis key names and the Lua scripts that keep the tier's books
    tier.py        KVTier: lookups on a reader thread, write-back on a writer thread
    connection.py  the Redis client the tier and its upkeep use (redis imported here)
    upkeep.py      the periodic pass: expired entries' books dropped, the cap enforced
    redaction.py   a Redis URL without its password, for logs
    counters.py    the tier's counters in the engine's stats

Only tier.py, connection.py, keys.py and upkeep.py need redis (the `kv-tier` extra): the
engine imports them when the tier is on, so `import inference.engine` works without it.


One Redis entry per full KV block, under

    {namespace}:{fingerprint}:{chain digest}

The fingerprint covers the model's weights, dtype, KV pool dtype, quantization, device type,
block size and cache layout (fingerprint.py); the chain digest is blake2b over the previous
block's digest and this block's exact token ids (cache_scope.chain_digest), the link into a
request's first salted block salted with its owner (cache_scope.CacheScope), so one owner's
keys never name another's blocks. The value is a header (magic, version, compression,
fingerprint, parent digest, lengths) and the block's token ids, then the block's K and V for
every layer in the pool dtype, byte for byte (or compressed), then a crc32 of all that. A
reader checks every field against what it expects and the crc over the whole value; anything
off is deleted and counted, never used.

Lookups run on a reader thread (one MGET for all candidate blocks of a prompt), writes on a
writer thread (a pipeline of small Lua scripts that also keep a last-use sorted set and a
byte counter, so the tier stays under its size cap, least recently used out first). Neither
ever blocks the engine's step thread. When Redis stops answering the tier logs one warning
and reports itself unavailable (the engine then runs memory-only); the writer thread pings
every few seconds and logs when Redis is back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inference.engine.kv_tier.blocks import BlockEntry, BlockLayout, RestoredPrefix
from inference.engine.kv_tier.counters import DISABLED_STATS
from inference.engine.kv_tier.wire import LAYOUT_VERSION

if TYPE_CHECKING:  # tier.py needs redis: imported by start_tier, when the tier is on
    from inference.engine.kv_tier.tier import KVTier

__all__ = [
    "DISABLED_STATS",
    "LAYOUT_VERSION",
    "BlockEntry",
    "BlockLayout",
    "RestoredPrefix",
    "start_tier",
]


def start_tier(url: str, **options: Any) -> KVTier:
    """A running KVTier (tier.py) for `url`: the one place the engine reaches redis."""
    try:
        from inference.engine.kv_tier.tier import KVTier
    except ModuleNotFoundError as exc:
        if exc.name not in ("redis", "hiredis"):
            raise
        raise RuntimeError(
            f"the Redis KV tier (kv_tier_url={url!r}) needs the redis package: install the "
            "`kv-tier` extra (pip install 'chatapp[kv-tier]'), or turn the tier off with "
            "kv_tier_url=''"
        ) from exc
    return KVTier(url, **options)
