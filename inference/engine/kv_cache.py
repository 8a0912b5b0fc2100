"""The paged KV cache's bookkeeping: a block pool, reference counts and a prefix index.

The tensors themselves live in the model runner; this file only decides which block holds
which tokens. A block is `block_size` token slots. A sequence owns a block table (a list of
block ids). Every *full* block is entered in the prefix index under a hash chain:

    hash_i = hash((hash_{i-1}, tokens of block i))

so one lookup per block finds the longest cached prefix of a new prompt. The block keeps its
tokens too, and a hit must match them exactly (a hash collision never serves wrong KV).
Generated tokens fill blocks like prompt tokens do, so turn N+1 of a chat, whose prompt
extends turn N's prompt and reply, finds turn N's KV in the index.

A block whose reference count drops to zero stays in the index (its KV is still valid) and
joins an LRU list; it is only reused, and dropped from the index, when no empty block is left.

A finished sequence's last block is usually partial: a chat's reply ends mid-block, and
the next turn's prompt (that reply, then the new question) would recompute up to
block_size - 1 tokens whose KV is still in the pool. So that block is kept too, as a
*tail*, under the chain hash of the full blocks before it (in `tails`, evictable like a
cached block). A new sequence whose full-block hit ends there and whose next tokens start
as the tail's did takes the block over whole (no copy: nobody else holds it, and the slots
past the shared tokens are written over by the new ones). A tail serves one sequence.

Each full block also gets a stable digest, a blake2b chain over the exact token ids
(Python's hash() differs between processes): the Redis tier (kv_tier/) keys blocks by it.
A block records whether the tier holds it (`persisted`); `on_evict` is told before an
indexed block the tier does not hold is reused, while its KV is still in the pool.

Where a block lies in the pool matters to the decode attention: it reads each sequence's
K/V block by block, and memory serves a run of neighbouring blocks at up to twice the rate
of the same bytes scattered (`python -m inference.bench.attention --layouts scattered
contiguous`). So a
sequence grows into the block after its last one, and when it cannot, a new run starts
where there is room for the sequence's reply too (next fit from a cursor). The sequence
claims that room (`Sequence.kv_room`): no other run starts in it, and no other sequence
grows into it, while its owner runs. A run is made of empty blocks, or, where empty ones
leave no run of a few blocks, of empty and *cold* cached blocks: those idle since the
older half of the span between the least recently used cached block and now. That is
what keeps runs in a long-running server, whose pool is all cached blocks left wherever
earlier chats were placed: evicting strictly least recently used first would take them
one by one from all over the pool. Growth takes a cold cached block only where the block
is in the sequence's room or empty blocks make no run of a few; blocks that went idle
recently (a chat between turns) are not evicted while cold or empty ones are left.

Prefix reuse is scoped by a request's `CacheScope` (cache_scope.py, vLLM's `cache_salt`):
the link into its first salted block mixes the salt into both chains, so every later hash
and digest differs from another salt's (or no salt's) and another owner's blocks, in
memory or in Redis, are
never found. The leading `shared_blocks` blocks stay unsalted: public text every user's
prompt starts with (a server-wide system prompt) may be shared.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from inference.engine.cache_scope import (
    ROOT_DIGEST,
    UNSALTED,
    CacheScope,
    chain_digest,
    chain_hash,
)

if TYPE_CHECKING:
    from inference.engine.sequence import Sequence

__all__ = ["ROOT_DIGEST", "UNSALTED", "Block", "CacheScope", "KVCacheManager"]

# The most blocks a new run claims after itself for its sequence's reply (512 tokens
# at 16 a block).
RUNWAY_BLOCKS = 32
# What a new run claims after its reply's blocks for the next turn's question and the
# start of its reply (128 tokens).
FOLLOW_UP_BLOCKS = 8
# Candidate runs a new run's search looks at before it tries a shorter kind (each look is
# a bytes.find and a check of the candidate's blocks).
RUN_TRIES = 16
# Shorter runs a new run settles for, in turn, when no run of its wanted length is found.
SHORT_RUNS = (8, 4, 2)
# The shortest run worth evicting cold blocks for while empty blocks would do.
GOOD_RUN = 4


class Block:
    __slots__ = (
        "block_hash",
        "block_id",
        "digest",
        "idle_since",
        "parent_digest",
        "persisted",
        "ref_count",
        "tail_key",
        "token_ids",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None
        self.token_ids: tuple[int, ...] = ()
        # Set while indexed: the stable chain digest of this block and of the one before.
        self.digest: bytes | None = None
        self.parent_digest: bytes = ROOT_DIGEST
        # The Redis tier holds this block's KV (reset when the block is reused).
        self.persisted = False
        # Set while the block is a finished sequence's partial tail (its key in `tails`).
        self.tail_key: int | None = None
        # The manager's clock when the block last became evictable (unreferenced, cached).
        self.idle_since = 0

    def forget(self) -> None:
        """Drop the block's identity: it is about to hold other tokens."""
        self.block_hash = None
        self.tail_key = None
        self.token_ids = ()
        self.digest = None
        self.parent_digest = ROOT_DIGEST
        self.persisted = False


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Blocks holding nothing worth keeping ("empty"): empty[i] is 1 for block i, so
        # that bytes.find finds a run of them.
        self.empty = bytearray(b"\x01" * num_blocks)
        self.num_empty = num_blocks
        # Blocks nobody references (empty or evictable), likewise: where a run may be
        # made of empty and cold cached blocks once empty ones alone leave no room.
        self.unheld = bytearray(b"\x01" * num_blocks)
        # Blocks in some running sequence's room (Sequence.kv_room): another run starts
        # there only when nothing else is left.
        self.claimed = bytearray(num_blocks)
        # Where the next run of empty blocks is looked for first (next fit).
        self.cursor = 0
        # Counts calls of free(): blocks made evictable in one call share its value.
        self.clock = 0
        # Unreferenced blocks still in the prefix index, least recently used first.
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.index: dict[int, int] = {}  # block hash -> block id
        # Partial tails of finished sequences: the chain hash before them -> block id.
        self.tails: dict[int, int] = {}
        # Called with an indexed block the Redis tier lacks, just before it is reused.
        self.on_evict: Callable[[Block], None] | None = None
        # Prefix cache counters (for stats()), in tokens.
        self.query_tokens = 0
        self.hit_tokens = 0

    # -- capacity ---------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: empty plus evictable."""
        return self.num_empty + len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs so its table covers `num_tokens` tokens."""
        total = -(-num_tokens // self.block_size)
        return max(0, total - len(seq.block_table))

    # -- prefix reuse -----------------------------------------------------------------

    def match_prefix(self, seq: Sequence, tails: bool = True) -> int:
        """Attach the longest cached prefix of a sequence with no blocks; return its tokens.

        At least one token is always left to compute: its logits pick the next token.
        `tails`: also take over a finished sequence's partial block that continues the
        full-block hit (module docstring).
        """
        assert not seq.block_table
        if not self.enable_prefix_caching:
            return 0
        bs = self.block_size
        self.query_tokens += (len(seq) - 1) // bs * bs
        hit_blocks = self._cached_blocks(seq)
        parent = hit_blocks[-1].block_hash if hit_blocks else None
        for block in hit_blocks:
            self._acquire(block)
            seq.block_table.append(block.block_id)
            seq.block_hashes.append(block.block_hash)  # type: ignore[arg-type]
            seq.block_digests.append(block.digest)  # type: ignore[arg-type]
        num_tokens = len(hit_blocks) * bs
        if tails:
            num_tokens += self._take_tail(seq, len(hit_blocks), parent)
        seq.num_computed_tokens = num_tokens
        self.hit_tokens += num_tokens
        return num_tokens

    def _take_tail(self, seq: Sequence, index: int, parent: int | None) -> int:
        """Give `seq` the tail kept after its full-block hit, if its tokens start as the
        tail's did (leaving one to compute); the tokens it covers, else 0."""
        key = self._tail_key(seq, index, parent)
        block_id = self.tails.get(key)
        if block_id is None:
            return 0
        block = self.blocks[block_id]
        start = index * self.block_size
        room = len(seq) - 1 - start
        same = 0
        ahead = seq.token_ids[start : start + room]
        for kept, new in zip(block.token_ids[:room], ahead, strict=False):
            if kept != new:
                break
            same += 1
        if same == 0:
            return 0
        self._hold(block_id)
        self._uncache(block)
        block.ref_count = 1
        seq.block_table.append(block_id)
        self.query_tokens += same
        return same

    def peek_prefix(self, seq: Sequence) -> int:
        """Tokens match_prefix would attach now, without attaching or counting anything."""
        if not self.enable_prefix_caching or seq.block_table:
            return 0
        return len(self._cached_blocks(seq)) * self.block_size

    def _cached_blocks(self, seq: Sequence) -> list[Block]:
        """The indexed blocks holding the longest prefix of a sequence with no blocks, one
        token at least left out (a hit must match the tokens, not just the hash)."""
        hits: list[Block] = []
        for _, h, tokens in self._chain(seq, len(seq) - 1):
            block_id = self.index.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(self.blocks[block_id])
        return hits

    def _chain(self, seq: Sequence, num_tokens: int) -> Iterator[tuple[int, int, tuple[int, ...]]]:
        """(index, chain hash, tokens) of each full block within the first `num_tokens`
        tokens past those the sequence has committed, made one by one as they are asked
        for (a waiting sequence: from its first block)."""
        bs = self.block_size
        scope = seq.cache_scope
        start = len(seq.block_hashes)
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        for i in range(start, num_tokens // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            parent = chain_hash(scope.link_hash(i, parent), tokens)
            yield i, parent, tokens

    def block_hashes_ahead(self, seq: Sequence, num_tokens: int) -> Iterator[int]:
        """The chain hashes of the full blocks within the first `num_tokens` tokens past
        those the sequence has committed, one by one: what commit_full_blocks enters once
        they are computed. Nothing is entered or attached."""
        return (h for _, h, _ in self._chain(seq, num_tokens))

    def commit_full_blocks(self, seq: Sequence) -> None:
        """Enter the sequence's newly filled blocks into the prefix index."""
        if not self.enable_prefix_caching:
            return
        scope = seq.cache_scope
        # The chain is made from the hashes committed before this call: its blocks'
        # hashes are appended as it goes.
        for i, h, tokens in list(self._chain(seq, seq.num_computed_tokens)):
            parent_digest = scope.link_digest(
                i, seq.block_digests[-1] if seq.block_digests else ROOT_DIGEST
            )
            digest = chain_digest(parent_digest, tokens)
            seq.block_hashes.append(h)
            seq.block_digests.append(digest)
            block = self.blocks[seq.block_table[i]]
            # The same content may already be indexed under another block (two identical
            # prompts prefilled side by side); keep the first, this one stays private.
            if h not in self.index and block.block_hash is None:
                block.block_hash = h
                block.token_ids = tokens
                block.digest = digest
                block.parent_digest = parent_digest
                self.index[h] = block.block_id

    def mark_persisted(self, block_ids: list[int], digests: list[bytes]) -> None:
        """The Redis tier holds these blocks (if they are still the indexed copies)."""
        for block_id, digest in zip(block_ids, digests, strict=True):
            block = self.blocks[block_id]
            if block.digest == digest:
                block.persisted = True

    # -- allocation -------------------------------------------------------------------

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow the block table to cover `num_tokens` tokens; False (and no change) if full."""
        needed = self.blocks_needed(seq, num_tokens)
        if needed > self.num_free_blocks:
            return False
        for i in range(needed):
            block = self._take_block(seq, needed - i)
            block.ref_count = 1
            seq.block_table.append(block.block_id)
        return True

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references. The tail goes first so LRU evicts tails first;
        a last block holding computed tokens past the full ones is kept as a tail."""
        tail = self._tail_of(seq)
        self.clock += 1
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.block_hash is not None:
                    block.idle_since = self.clock
                    self._release(block_id)
                elif tail is not None and block_id == tail[1]:
                    self._keep_tail(seq, *tail)
                else:
                    self._empty(block_id)
        self._unclaim(seq)
        seq.block_table = []
        seq.block_hashes = []
        seq.block_digests = []
        seq.num_computed_tokens = 0

    def _tail_of(self, seq: Sequence) -> tuple[int, int] | None:
        """(index, block id) of the sequence's partial last block worth keeping, or None."""
        if not self.enable_prefix_caching:
            return None
        index, partial = divmod(seq.num_computed_tokens, self.block_size)
        # Its full blocks all committed (their hashes are the tail's key) and it owns the
        # block, which is not indexed (a full block is, or has an indexed twin).
        if partial == 0 or len(seq.block_hashes) != index or len(seq.block_table) <= index:
            return None
        block_id = seq.block_table[index]
        if self.blocks[block_id].ref_count != 1 or self.blocks[block_id].block_hash is not None:
            return None
        return index, block_id

    @staticmethod
    def _tail_key(seq: Sequence, index: int, parent: int | None) -> int:
        # The chain hash of an empty block after the full ones: never None (a tail at
        # index 0 has no parent), never a full block's hash.
        return chain_hash(seq.cache_scope.link_hash(index, parent), ())

    def _keep_tail(self, seq: Sequence, index: int, block_id: int) -> None:
        key = self._tail_key(seq, index, seq.block_hashes[-1] if index else None)
        old = self.tails.get(key)
        if old is not None:  # the newer tail replaces the older one
            self.evictable.pop(old)
            self._uncache(self.blocks[old])
            self._empty(old)
        block = self.blocks[block_id]
        block.idle_since = self.clock
        start = index * self.block_size
        block.token_ids = tuple(seq.token_ids[start : seq.num_computed_tokens])
        block.tail_key = key
        self.tails[key] = block_id
        self._release(block_id)

    def _acquire(self, block: Block) -> None:
        if block.ref_count == 0 and block.block_id in self.evictable:
            self._hold(block.block_id)
        block.ref_count += 1

    def _take_block(self, seq: Sequence, remaining: int) -> Block:
        """The block `seq` grows into, `remaining` of this allocation's blocks still to
        take: the one after its last if that is empty, or cold where the sequence has
        claimed it or no run of GOOD_RUN empty blocks is left (as a new run would be made
        of cold blocks then too), and not another sequence's; else the start of a new
        run, which the sequence then claims (module docstring)."""
        after = seq.block_table[-1] + 1 if seq.block_table else self.num_blocks
        if after < self.num_blocks:
            # Still claimed and in its room: not taken by another since the claim.
            mine = bool(self.claimed[after]) and _within(seq.kv_room, after)
            if (mine or not self.claimed[after]) and (
                self.empty[after]
                or (
                    after in self.evictable
                    and (mine or self.empty.find(b"\x01" * GOOD_RUN) < 0)
                    and self._cold(after)
                )
            ):
                return self._take(after)
        self._unclaim(seq)
        start, length = self._new_run(remaining, remaining + self._runway(seq))
        if length > 1:
            seq.kv_room = (start, start + length)
            self.claimed[start : start + length] = b"\x01" * length
        return self._take(start)

    def _unclaim(self, seq: Sequence) -> None:
        if seq.kv_room is not None:
            start, end = seq.kv_room
            self.claimed[start:end] = bytes(end - start)
            seq.kv_room = None

    def _runway(self, seq: Sequence) -> int:
        """Room a new run claims after the blocks taken now: the blocks the sequence's
        reply may still fill, and FOLLOW_UP_BLOCKS more for a chat's next turn, which
        continues from the reply's last block; RUNWAY_BLOCKS at most."""
        left = max(0, (seq.max_tokens or 0) - seq.num_output_tokens)
        return min(RUNWAY_BLOCKS, -(-left // self.block_size) + FOLLOW_UP_BLOCKS)

    def _new_run(self, needed: int, wanted: int) -> tuple[int, int]:
        """(first block, length) of a new run, looked for from the cursor on (wrapping),
        which then moves past it; outside every running sequence's room. Runs of `wanted`
        blocks are looked for first, then of the SHORT_RUNS lengths (at least `needed`):
        those of at least GOOD_RUN blocks made of empty blocks, then of empty or cold ones,
        then the shorter ones likewise. Then any empty block, and last the least recently
        used cached blocks (`_evictable_run`). So a run evicts only cold blocks, and only
        where empty ones leave no good run; and it does not settle for a lone empty block
        while a run can be had, since a pool whose empty blocks lie scattered (one left
        here and there by each finished sequence) would scatter every sequence after it."""
        lengths = sorted({wanted, needed, *(min(wanted, max(needed, n)) for n in SHORT_RUNS)})
        good = [n for n in reversed(lengths) if n >= min(GOOD_RUN, wanted)]
        short = [n for n in reversed(lengths) if n < min(GOOD_RUN, wanted)]
        tries = [(n, False) for n in good] + [(n, True) for n in good]
        for length, cold_too in tries + [(n, c) for n in short for c in (False, True)]:
            start = self._run_of(length, cold_too)
            if start >= 0:
                self.cursor = (start + length) % self.num_blocks
                return start, length
        if self.num_empty:
            start = self._run_of(1, False)
            return (start if start >= 0 else self.empty.find(b"\x01")), 1
        return self._evictable_run(wanted), 1

    def _run_of(self, length: int, cold_too: bool) -> int:
        """The first block of `length` neighbouring empty blocks (or, with `cold_too`,
        blocks each empty or cold) in no running sequence's room, from the cursor on and
        then from the pool's start; -1 if none is found within RUN_TRIES looks."""
        if cold_too and not self.evictable:
            return -1
        where = self.unheld if cold_too else self.empty
        pattern, pos, wrapped = b"\x01" * length, self.cursor, self.cursor == 0
        for _ in range(RUN_TRIES):
            start = where.find(pattern, pos)
            if start < 0 or (wrapped and start >= self.cursor > 0):
                if wrapped:
                    return -1
                pos, wrapped = 0, True
                continue
            end = start + length
            bad = self.claimed.rfind(b"\x01", start, end)
            if bad < 0 and cold_too:
                bad = next((i for i in range(end - 1, start - 1, -1) if not self._reusable(i)), -1)
            if bad < 0:
                return start
            pos = bad + 1
        return -1

    def _evictable_run(self, wanted: int) -> int:
        """The least recently used cached block, or, when the blocks before it in the pool
        went idle in the same free(), the first of up to `wanted` of them: the same blocks
        least-recently-used eviction takes, in pool order."""
        last = next(iter(self.evictable))
        start, since = last, self.blocks[last].idle_since
        while (
            last - start + 1 < wanted
            and start > 0
            and start - 1 in self.evictable
            and self.blocks[start - 1].idle_since == since
        ):
            start -= 1
        return start

    def _reusable(self, block_id: int) -> bool:
        """Empty, or cached and cold."""
        return bool(self.empty[block_id]) or (block_id in self.evictable and self._cold(block_id))

    def _cold(self, block_id: int) -> bool:
        """Cached and idle since the older half of the span between the least recently
        used cached block and now."""
        oldest = self.blocks[next(iter(self.evictable))].idle_since
        return 2 * self.blocks[block_id].idle_since <= oldest + self.clock

    def _take(self, block_id: int) -> Block:
        """Hand out an empty block, or evict a cached one."""
        block = self.blocks[block_id]
        self.claimed[block_id] = 0
        if self.empty[block_id]:
            self.empty[block_id] = 0
            self.num_empty -= 1
            self.unheld[block_id] = 0
        else:
            self._hold(block_id)
            self._unindex(block)
        return block

    def _release(self, block_id: int) -> None:
        """An unreferenced cached block joins the LRU list (most recently used)."""
        self.evictable[block_id] = None
        self.unheld[block_id] = 1

    def _hold(self, block_id: int) -> None:
        """A cached block leaves the LRU list: referenced again, or about to be reused."""
        del self.evictable[block_id]
        self.unheld[block_id] = 0

    def _empty(self, block_id: int) -> None:
        self.empty[block_id] = 1
        self.num_empty += 1
        self.unheld[block_id] = 1

    def _unindex(self, block: Block) -> None:
        """An evictable block is about to be reused: the tier hears of an indexed block it
        lacks, then the block leaves the index or the tails."""
        if block.tail_key is None and not block.persisted and self.on_evict is not None:
            self.on_evict(block)
        self._uncache(block)

    def _uncache(self, block: Block) -> None:
        """Drop a cached block (indexed, or a tail) from its map and forget its identity."""
        if block.tail_key is not None:
            del self.tails[block.tail_key]
        else:
            del self.index[block.block_hash]  # type: ignore[arg-type]
        block.forget()

    def reset_prefix_cache(self) -> None:
        """Forget every unreferenced cached block (used by benchmarks to start cold)."""
        while self.evictable:
            block_id, _ = self.evictable.popitem(last=False)
            self._uncache(self.blocks[block_id])
            self._empty(block_id)


def _within(room: tuple[int, int] | None, block_id: int) -> bool:
    return room is not None and room[0] <= block_id < room[1]
