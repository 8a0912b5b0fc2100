"""Variants of ours side by side in one benchmark get equal KV pools (servers.equal_pools)."""

from __future__ import annotations

import torch

from inference.bench.servers import POOL_SETTING, TIER_SETTING, equal_pools
from inference.engine.config import EngineConfig
from inference.engine.kv_budget import KV_MEMORY_SHARE, available_memory


def test_each_of_several_servers_gets_an_equal_share_of_one_servers_pool() -> None:
    one = KV_MEMORY_SHARE * available_memory(torch.device("cpu")) / 2**20
    pools = equal_pools(3, [{}, {"ENGINE_KV_DTYPE": "int8"}, {}, {}])
    mb = int(pools[POOL_SETTING])
    # Memory available moves a little between the two reads.
    assert abs(mb - one / 3) < 0.05 * one / 3


def test_one_server_or_a_pool_set_anywhere_is_left_as_it_is() -> None:
    assert equal_pools(1, [{}, {}]) == {}
    assert POOL_SETTING not in equal_pools(3, [{}, {}, {POOL_SETTING: "512"}, {}])
    assert POOL_SETTING not in equal_pools(2, [{POOL_SETTING: "800"}, {}, {}])


def test_their_redis_tier_caps_share_one_servers_cap() -> None:
    """One Redis holds every server's KV tier blocks: four at the default cap each filled
    it past the machine's memory."""
    assert equal_pools(4, [{}, {}, {}, {}, {}])[TIER_SETTING] == str(
        EngineConfig.kv_tier_max_mb // 4
    )
    assert TIER_SETTING not in equal_pools(2, [{}, {TIER_SETTING: "100"}, {}])
    assert equal_pools(2, [{}, {TIER_SETTING: "100"}, {}])[POOL_SETTING]
