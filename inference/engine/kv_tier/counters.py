"""The tier's counters, as the engine's stats() reports them (kv_tier_<name>)."""

from __future__ import annotations

COUNTERS = (
    "lookups",
    "hits",
    "hit_tokens",
    "miss_tokens",
    "bytes_written",
    "bytes_read",
    "blocks_written",
    "restore_seconds_total",
    "rejected",
    "write_drops",
    "errors",
)
DISABLED_STATS: dict[str, object] = {
    "kv_tier_enabled": False,
    "kv_tier_degraded": False,
    **{f"kv_tier_{name}": 0 for name in COUNTERS},
}
