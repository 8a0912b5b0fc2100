"""Variants of ours side by side in one benchmark get equal KV pools (servers.equal_pools)."""

from __future__ import annotations

import torch

from inference.bench.servers import POOL_SETTING, equal_pools
from inference.engine.kv_budget import KV_MEMORY_SHARE, available_memory


def test_each_of_several_servers_gets_an_equal_share_of_one_servers_pool() -> None:
    one = KV_MEMORY_SHARE * available_memory(torch.device("cpu")) / 2**20
    pools = equal_pools(3, [{}, {"ENGINE_KV_DTYPE": "int8"}, {}, {}])
    mb = int(pools[POOL_SETTING])
    # Memory available moves a little between the two reads.
    assert abs(mb - one / 3) < 0.05 * one / 3


def test_one_server_or_a_pool_set_anywhere_is_left_as_it_is() -> None:
    assert equal_pools(1, [{}, {}]) == {}
    assert equal_pools(3, [{}, {}, {POOL_SETTING: "512"}, {}]) == {}
    assert equal_pools(2, [{POOL_SETTING: "800"}, {}, {}]) == {}
