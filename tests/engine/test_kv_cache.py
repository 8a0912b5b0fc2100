"""Block pool bookkeeping: prefix hits by exact tokens, reference counts, LRU eviction."""

from __future__ import annotations

from inference.engine.kv_cache import FOLLOW_UP_BLOCKS, KVCacheManager
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
    assert not kv.tails and kv.num_empty == 4


def test_a_tail_in_the_first_block_is_evicted_and_reset_like_any_cached_block():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    a = _computed(kv, "a", [1, 2, 3])  # all in block 0: a tail with no full block before
    kv.free(a)
    assert len(kv.tails) == 1 and kv.num_free_blocks == 2
    kv.reset_prefix_cache()
    assert not kv.tails and not kv.evictable and kv.num_empty == 2
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


def _grow(kv: KVCacheManager, seq: Sequence, tokens: int) -> None:
    """The sequence's next `tokens` tokens computed, as decode steps would."""
    for _ in range(tokens):
        seq.token_ids.append(7)
        assert kv.allocate(seq, len(seq))
        seq.num_computed_tokens = len(seq)
    kv.commit_full_blocks(seq)


def test_sequences_decoding_side_by_side_each_grow_in_one_run():
    # Blocks of 4, replies of up to 32 tokens: each new run leaves 8 blocks after itself
    # for the reply and FOLLOW_UP_BLOCKS for a next turn.
    kv = KVCacheManager(num_blocks=4 * (2 + 8 + FOLLOW_UP_BLOCKS), block_size=4)
    seqs = [Sequence(f"s{i}", list(range(10 * i, 10 * i + 6)), SamplingParams(max_tokens=32))
            for i in range(4)]  # fmt: skip
    for seq in seqs:
        kv.match_prefix(seq)
        assert kv.allocate(seq, len(seq))
        seq.num_computed_tokens = len(seq)
    for _ in range(30):  # one token each in turn, as a batch decodes
        for seq in seqs:
            _grow(kv, seq, 1)
    for seq in seqs:
        assert len(seq.block_table) == 9
        assert seq.block_table == list(range(seq.block_table[0], seq.block_table[0] + 9))
    assert len({b for seq in seqs for b in seq.block_table}) == 36


def test_a_growing_sequence_starts_a_new_run_when_the_next_block_is_taken():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = Sequence("a", list(range(4)), SamplingParams(max_tokens=0))
    kv.match_prefix(a)
    assert kv.allocate(a, 4)
    b = Sequence("b", list(range(50, 54)), SamplingParams(max_tokens=0))
    kv.match_prefix(b)
    assert kv.allocate(b, 4)
    assert (a.block_table, b.block_table) == ([0], [1])
    a.num_computed_tokens = 4
    _grow(kv, a, 1)
    assert a.block_table == [0, 2]  # block 1 is b's: the next empty one
    assert kv.num_free_blocks == 5


def test_with_only_cached_blocks_left_a_run_takes_the_least_recent_ones_in_pool_order():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    old = _computed(kv, "old", list(range(16)))  # blocks 0-3, indexed
    new = _computed(kv, "new", list(range(100, 116)))  # blocks 4-7
    kv.free(old)
    kv.free(new)
    assert kv.num_empty == 0 and len(kv.evictable) == 8
    # Two blocks: the least recently used are old's last two (freed tail first), taken in
    # pool order, so old's first two stay found.
    c = Sequence("c", list(range(200, 208)), SamplingParams(max_tokens=0))
    kv.match_prefix(c)
    assert kv.allocate(c, 8)
    assert c.block_table == [2, 3]
    again = Sequence("again", list(range(12)), SamplingParams())
    assert kv.match_prefix(again) == 8
    kv.free(again)
    assert kv.blocks[4].block_hash is not None  # new's blocks were not touched


def test_growth_takes_the_cached_block_after_it_only_when_that_block_is_cold():
    kv = KVCacheManager(num_blocks=7, block_size=4)

    def placed(rid: str, tokens: list[int]) -> Sequence:
        seq = Sequence(rid, tokens, SamplingParams(max_tokens=0))  # no room left after it
        kv.match_prefix(seq)
        assert kv.allocate(seq, len(tokens))
        seq.num_computed_tokens = len(tokens)
        return seq

    s = placed("s", list(range(4)))  # block 0
    a = _computed(kv, "a", list(range(100, 108)))  # blocks 1-2
    t = placed("t", list(range(200, 204)))  # block 3
    c = _computed(kv, "c", list(range(300, 308)))  # blocks 4-5
    u = placed("u", list(range(400, 404)))  # block 6
    assert [q.block_table for q in (s, a, t, c, u)] == [[0], [1, 2], [3], [4, 5], [6]]
    kv.free(a)  # idle since 1
    for _ in range(3):  # time passes
        kv.free(Sequence("x", [], SamplingParams()))
    kv.free(c)  # idle since 5
    # t's next block (c's, idle since 5) is in the newer half of [1, 5]: the least
    # recently used block is taken instead (a's last; its first stays found).
    _grow(kv, t, 1)
    assert t.block_table == [3, 2]
    # s's next block (a's first, idle since 1) is in the older half: taken.
    _grow(kv, s, 1)
    assert s.block_table == [0, 1]
    assert kv.blocks[4].block_hash is not None and kv.blocks[5].block_hash is not None


def test_growth_never_evicts_a_cached_block_while_empty_ones_are_left():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    s = Sequence("s", list(range(4)), SamplingParams(max_tokens=0))
    kv.match_prefix(s)
    assert kv.allocate(s, 4)  # block 0
    s.num_computed_tokens = 4
    a = _computed(kv, "a", list(range(100, 108)))  # blocks 1-2
    kv.free(a)
    for _ in range(4):  # a's blocks grow cold
        kv.free(Sequence("x", [], SamplingParams()))
    _grow(kv, s, 1)
    assert s.block_table == [0, 3]
    again = Sequence("again", list(range(100, 109)), SamplingParams())
    assert kv.match_prefix(again) == 8


def test_a_chats_next_turn_continues_in_the_run_of_the_turn_before():
    kv = KVCacheManager(num_blocks=64, block_size=4)
    first = Sequence("t1", list(range(8)), SamplingParams(max_tokens=8))
    kv.match_prefix(first)
    assert kv.allocate(first, 8)
    first.num_computed_tokens = 8
    kv.commit_full_blocks(first)
    other = Sequence("other", list(range(100, 108)), SamplingParams(max_tokens=8))
    kv.match_prefix(other)
    assert kv.allocate(other, 8)  # its run starts after first's room
    _grow(kv, first, 6)  # the reply: 14 tokens, the last block partial
    kv.free(first)
    follow_up = Sequence("t2", [*first.token_ids[:14], 50, 51, 52, 53, 54, 55], SamplingParams())
    assert kv.match_prefix(follow_up) == 14  # its blocks and the tail
    assert kv.allocate(follow_up, len(follow_up))
    table = follow_up.block_table
    assert table == list(range(table[0], table[0] + 5))
    assert not set(table) & set(other.block_table)
