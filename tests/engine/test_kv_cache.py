"""Block pool bookkeeping: prefix hits by exact tokens, reference counts, LRU eviction."""

from __future__ import annotations

import itertools
import random

from inference.engine.kv_cache import FOLLOW_UP_BLOCKS, KVCacheManager
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence


def _computed(
    kv: KVCacheManager, rid: str, tokens: list[int], max_tokens: int | None = None
) -> Sequence:
    """A sequence whose tokens all sit in the cache, its full blocks indexed; its reply
    `max_tokens` long where given (the room its run claims), else the default."""
    params = SamplingParams() if max_tokens is None else SamplingParams(max_tokens=max_tokens)
    seq = Sequence(rid, tokens, params)
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


def test_freed_blocks_stay_cached_until_their_blocks_are_needed():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a = _computed(kv, "a", [*range(8), 100])
    kv.free(a)
    # Its two full blocks and its partial tail (token 100) stay cached.
    assert kv.num_free_blocks == 4 and len(kv.evictable) == 3 and len(kv.tails) == 1
    # A request for the whole pool evicts them all.
    c = Sequence("c", list(range(200, 216)), SamplingParams())
    assert kv.allocate(c, 13)
    again = Sequence("again", [*range(8), 100], SamplingParams())
    assert kv.match_prefix(again) == 0 and not kv.tails


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


def test_with_only_cached_blocks_left_a_run_takes_cold_ones_and_spares_warm_ones():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    old = _computed(kv, "old", list(range(16)))  # blocks 0-3, indexed
    new = _computed(kv, "new", list(range(100, 116)))  # blocks 4-7
    assert (old.block_table, new.block_table) == ([0, 1, 2, 3], [4, 5, 6, 7])
    kv.free(old)
    kv.free(new)
    assert kv.num_empty == 0 and len(kv.evictable) == 8
    # old went idle in the older half of the cache's span: cold. A run is made of its
    # blocks, room for the reply included; new's blocks are not touched.
    c = Sequence("c", list(range(200, 208)), SamplingParams(max_tokens=8))
    kv.match_prefix(c)
    assert kv.allocate(c, 8)
    assert c.block_table == [0, 1] and c.kv_room == (0, 4)
    c.num_computed_tokens = 8
    _grow(kv, c, 8)
    assert c.block_table == [0, 1, 2, 3]
    again = Sequence("again", list(range(100, 116)), SamplingParams())
    assert kv.match_prefix(again) == 12


def test_growth_takes_the_cached_block_after_it_only_when_that_block_is_cold():
    kv = KVCacheManager(num_blocks=12, block_size=4)
    # Three chats, each freed as it finishes: idle since 1, 2 and (after time passes) 7.
    gens = []
    for g in range(3):
        if g == 2:
            for _ in range(4):
                kv.free(Sequence("x", [], SamplingParams()))
        gen = _computed(kv, f"g{g}", list(range(100 * g, 100 * g + 16)))
        kv.free(gen)
        gens.append(gen)
    assert kv.num_empty == 0 and [kv.blocks[4 * g].idle_since for g in range(3)] == [1, 2, 7]
    # The cold blocks (idle since 1 and 2, older than (1 + 7) / 2) make one run.
    s = Sequence("s", list(range(500, 504)), SamplingParams(max_tokens=28))
    kv.match_prefix(s)
    assert kv.allocate(s, 4)
    assert s.block_table == [0] and s.kv_room == (0, 8)
    s.num_computed_tokens = 4
    _grow(kv, s, 28)
    assert s.block_table == list(range(8))
    # The next block is g2's, which went idle at 7: still the only cached blocks, so the
    # least recently used, and cold; it is taken.
    _grow(kv, s, 4)
    assert s.block_table == list(range(9))


def test_growth_leaves_a_warm_cached_block_after_it_while_cold_ones_are_left():
    kv = KVCacheManager(num_blocks=12, block_size=4)
    a = _computed(kv, "a", list(range(16)), max_tokens=0)  # its run claims the pool as room
    b = _computed(kv, "b", list(range(100, 116)), max_tokens=0)  # so these take what is left
    s = _computed(kv, "s", list(range(200, 204)), max_tokens=0)  # block by block
    w = _computed(kv, "w", list(range(300, 312)), max_tokens=0)
    assert [q.block_table for q in (a, b, s, w)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8], [9, 10, 11]]
    kv.free(a)  # idle since 1
    kv.free(b)  # 2
    for _ in range(4):
        kv.free(Sequence("x", [], SamplingParams()))
    kv.free(w)  # 7: the newer half of [1, 7]
    assert kv.num_empty == 0
    _grow(kv, s, 1)
    # w's block after s is warm: s starts a run over a's and b's cold blocks instead.
    assert s.block_table == [8, 0] and s.kv_room == (0, 8)
    again = Sequence("again", list(range(300, 313)), SamplingParams())
    assert kv.match_prefix(again) == 12


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
    first = _computed(kv, "t1", list(range(8)), max_tokens=8)
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


def _chats(kv: KVCacheManager, rng: random.Random, tag: int, reply: int) -> list[Sequence]:
    """Eight chats' prompts of random lengths, then their replies decoded side by side."""
    seqs = []
    for i in range(8):
        prompt = [tag * 100_000 + i * 1_000 + j for j in range(rng.randrange(8, 40))]
        seqs.append(_computed(kv, f"{tag}-{i}", prompt, max_tokens=reply))
    for _ in range(reply):
        for seq in seqs:
            _grow(kv, seq, 1)
    return seqs


def test_in_a_pool_full_of_earlier_chats_blocks_new_chats_still_grow_in_runs():
    # A long-running server's pool: every block holds some earlier chat's cached KV, in
    # the order those chats happened to be placed. (The placement before runs were made
    # of cold blocks left 40-56% of neighbouring table entries adjacent here.)
    for seed in range(3):
        rng = random.Random(seed)
        kv = KVCacheManager(num_blocks=400, block_size=4)
        last: list[Sequence] = []
        for tag in range(1, 30):
            last = _chats(kv, rng, tag, 24)
            for seq in last:
                kv.free(seq)
        assert kv.num_empty < 10
        seqs = _chats(kv, rng, 99, 40)
        pairs = [(x, y) for s in seqs for x, y in itertools.pairwise(s.block_table)]
        assert sum(y == x + 1 for x, y in pairs) / len(pairs) > 0.75
        # The chats freed last are still found whole: only cold blocks were taken.
        for seq in last:
            probe = Sequence("probe", [*seq.token_ids[:-1], 1], SamplingParams())
            assert kv.match_prefix(probe) >= (len(seq.token_ids) - 1) // 4 * 4 - 4
            kv.free(probe)
