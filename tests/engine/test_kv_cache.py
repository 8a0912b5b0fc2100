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
    # Its two full blocks and its partial tail (token 100) stay cached.
    assert kv.num_free_blocks == 4 and len(kv.evictable) == 3 and len(kv.tails) == 1
    b = _computed(kv, "b", [50, 51, 52, 53, 54])  # the free block, then a's tail (LRU)
    assert not kv.tails
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


def test_a_finished_sequences_partial_tail_serves_the_tokens_a_follow_up_shares():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = _computed(kv, "a", list(range(11)))  # two full blocks, 3 tokens in the third
    tail_block = a.block_table[2]
    kv.free(a)
    assert kv.tails and kv.blocks[tail_block].token_ids == (8, 9, 10)
    # Shares 8, 9 of the tail, then parts: the block is taken over for those two.
    b = Sequence("b", [*range(10), 77, 78], SamplingParams())
    assert kv.match_prefix(b) == 10
    assert b.block_table[2] == tail_block and kv.blocks[tail_block].ref_count == 1
    assert not kv.tails and tail_block not in kv.evictable
    kv.free(b)
    # The tail never leaves its sequence nothing to compute.
    c = Sequence("c", list(range(10)), SamplingParams())
    assert kv.match_prefix(c) == 9
    kv.free(c)
    # A first token that differs, or a tail after other blocks, serves nothing.
    d = Sequence("d", [*range(8), 50, 51], SamplingParams())
    assert kv.match_prefix(d) == 8
    kv.free(d)
    e = Sequence("e", [0, 1, 2, 3, 40, 41, 42, 43, 8, 9], SamplingParams())
    assert kv.match_prefix(e) == 4


def test_a_tail_stays_in_its_cache_scope():
    from inference.engine.cache_scope import CacheScope

    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = Sequence("a", list(range(7)), SamplingParams(), cache_scope=CacheScope("alice"))
    kv.match_prefix(a)
    assert kv.allocate(a, 7)
    a.num_computed_tokens = 7
    kv.commit_full_blocks(a)
    kv.free(a)
    bob = Sequence("b", list(range(9)), SamplingParams(), cache_scope=CacheScope("bob"))
    assert kv.match_prefix(bob) == 0
    kv.free(bob)
    again = Sequence("a2", list(range(9)), SamplingParams(), cache_scope=CacheScope("alice"))
    assert kv.match_prefix(again) == 7


def test_without_prefix_caching_nothing_is_kept():
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    a = _computed(kv, "a", list(range(6)))
    kv.free(a)
    assert not kv.tails and len(kv.free_ids) == 4


def test_a_tail_in_the_first_block_is_evicted_and_reset_like_any_cached_block():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    a = _computed(kv, "a", [1, 2, 3])  # all in block 0: a tail with no full block before
    kv.free(a)
    assert len(kv.tails) == 1 and kv.num_free_blocks == 2
    kv.reset_prefix_cache()
    assert not kv.tails and not kv.evictable and len(kv.free_ids) == 2
    a = _computed(kv, "a", [1, 2, 3])
    kv.free(a)
    b = Sequence("b", list(range(8)), SamplingParams())
    assert kv.allocate(b, 8)  # takes the free block, then evicts the tail
    assert not kv.tails


def test_block_hashes_ahead_are_the_hashes_a_commit_enters():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    seq = Sequence("a", list(range(14)), SamplingParams())
    kv.match_prefix(seq)
    assert kv.allocate(seq, 14)
    ahead = list(kv.block_hashes_ahead(seq, 9))  # two full blocks in the first 9 tokens
    assert len(ahead) == 2 and not kv.index
    seq.num_computed_tokens = 9
    kv.commit_full_blocks(seq)
    assert seq.block_hashes == ahead
    # Past the committed blocks: only the next one.
    later = list(kv.block_hashes_ahead(seq, 14))
    seq.num_computed_tokens = 14
    kv.commit_full_blocks(seq)
    assert seq.block_hashes == ahead + later and len(later) == 1
