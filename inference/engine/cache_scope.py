"""Whose prefix chain a block joins, and the chains themselves: the per-process hash the
prefix index uses and the stable blake2b digest the Redis tier keys blocks by. A
request's `CacheScope` (vLLM's `cache_salt`) salts the link into its first salted block,
so every later hash and digest differs from another owner's (kv_cache.py has the rest).
A batch-invariant request's chain (model_runner.py's invariant rows) is salted from its
first block: its K/V are other bits than the same tokens' computed in a batch."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

# The parent digest of a sequence's first block.
ROOT_DIGEST = bytes(16)


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent, token_ids))


def chain_digest(parent: bytes, token_ids: tuple[int, ...] | list[int]) -> bytes:
    """The stable (cross-process) digest of a block: blake2b(parent digest, token ids)."""
    data = struct.pack(f"<{len(token_ids)}I", *token_ids)
    return hashlib.blake2b(parent + data, digest_size=16).digest()


def salted_hash(parent: int | None, salt: str) -> int:
    return hash(("cache_salt", salt, parent))


def salted_digest(parent: bytes, salt: str) -> bytes:
    # The salt's length goes first, so no (salt, parent) pair reads as another.
    data = struct.pack("<I", len(salt)) + salt.encode() + parent
    return hashlib.blake2b(b"cache_salt\0" + data, digest_size=16).digest()


def invariant_hash(parent: int | None) -> int:
    return hash(("batch_invariant", parent))


def invariant_digest(parent: bytes) -> bytes:
    return hashlib.blake2b(b"batch_invariant\0" + parent, digest_size=16).digest()


@dataclass(frozen=True)
class CacheScope:
    """Whose prefix chain a request's full blocks join.

    No salt: the one chain every unsalted request shares. With a salt, blocks from
    `shared_blocks` on hang off a link salted with it, so only requests with the same salt
    (and the same unsalted lead) find them.
    """

    salt: str | None = None
    shared_blocks: int = 0
    # The request's rows are computed batch-invariant: its blocks never meet the others'.
    invariant: bool = False

    def link_hash(self, index: int, previous: int | None) -> int | None:
        """The parent hash of block `index`, given the hash of the block before (None for
        the first)."""
        if self.invariant and index == 0:
            previous = invariant_hash(previous)
        if self.salt is not None and index == self.shared_blocks:
            return salted_hash(previous, self.salt)
        return previous

    def link_digest(self, index: int, previous: bytes) -> bytes:
        """The parent digest of block `index`, given the digest of the block before
        (ROOT_DIGEST for the first): what the Redis tier stores as the block's parent."""
        if self.invariant and index == 0:
            previous = invariant_digest(previous)
        if self.salt is not None and index == self.shared_blocks:
            return salted_digest(previous, self.salt)
        return previous

    def digest_chain(
        self, token_ids: list[int], block_size: int, num_blocks: int
    ) -> list[tuple[bytes, bytes]]:
        """(parent digest, digest) of each of the first `num_blocks` full blocks."""
        out = []
        previous = ROOT_DIGEST
        for i in range(num_blocks):
            parent = self.link_digest(i, previous)
            previous = chain_digest(parent, token_ids[i * block_size : (i + 1) * block_size])
            out.append((parent, previous))
        return out


UNSALTED = CacheScope()
