"""Block pool bookkeeping: prefix hits by exact tokens, reference counts, LRU eviction."""

from __future__ import annotations

from inference.engine.kv_cache import KVCacheManager
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence


def _computed(kv: KVCacheManager, rid: str, tokens: list[int]) -> Sequence:
    """A sequence whose tokens all sit in the cache, its full blocks indexed."""
    seq = Sequence(rid, tokens, SamplingParams())
    kv.match_prefix(seq)
    assert kv.allocate(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    kv.commit_full_blocks(seq)
    return seq


def test_shared_prefix_is_found_block_by_block():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = _computed(kv, "a", list(range(10)))  # two full blocks + 2 tokens
    b = Sequence("b", [*range(8), 99, 98, 97], SamplingParams())
    assert kv.match_prefix(b) == 8
    assert b.block_table == a.block_table[:2]
    assert kv.blocks[a.block_table[0]].ref_count == 2


def test_a_prompt_is_never_served_entirely_from_cache():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    _computed(kv, "a", list(range(8)))
    b = Sequence("b", list(range(8)), SamplingParams())
    # The last token must be computed to get logits: only the first block hits.
    assert kv.match_prefix(b) == 4


def test_different_earlier_tokens_mean_no_hit():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    _computed(kv, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = Sequence("b", [0, 2, 3, 4, 5, 6, 7, 8, 9], SamplingParams())
    assert kv.match_prefix(b) == 0


def test_freed_blocks_stay_cached_until_evicted_least_recently_used_first():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a = _computed(kv, "a", [*range(8), 100])
    kv.free(a)
    assert kv.num_free_blocks == 4 and len(kv.evictable) == 2
    b = _computed(kv, "b", [50, 51, 52, 53, 54])  # takes the 2 truly free blocks
    kv.free(b)
    # A new 4-block request must evict; the cached blocks go, the least recently used first.
    c = Sequence("c", list(range(200, 216)), SamplingParams())
    assert kv.allocate(c, 13)
    again = Sequence("again", [*range(8), 100], SamplingParams())
    assert kv.match_prefix(again) == 0
    assert kv.query_tokens > 0


def test_allocation_fails_cleanly_when_the_pool_is_full():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    a = Sequence("a", list(range(9)), SamplingParams())
    assert not kv.allocate(a, 9)
    assert a.block_table == [] and kv.num_free_blocks == 2
