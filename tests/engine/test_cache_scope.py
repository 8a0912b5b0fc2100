"""Prefix reuse scoped by owner (kv_cache.CacheScope, vLLM's cache_salt): a salted request's
blocks are found only by requests with the same salt, in the memory index and under the
Redis tier's keys alike; a declared public lead stays shared."""

from __future__ import annotations

import pytest

from inference.engine.errors import InvalidRequestError
from inference.engine.kv_cache import UNSALTED, CacheScope, KVCacheManager
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence

from .conftest import greedy, run_to_completion

ALICE = CacheScope("alice-salt")
BOB = CacheScope("bob-salt")


def _computed(kv: KVCacheManager, rid: str, tokens: list[int], scope: CacheScope) -> Sequence:
    """A sequence whose tokens all sit in the cache, its full blocks indexed."""
    seq = Sequence(rid, tokens, SamplingParams(), cache_scope=scope)
    kv.match_prefix(seq)
    assert kv.allocate(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    kv.commit_full_blocks(seq)
    return seq


def _hit(kv: KVCacheManager, tokens: list[int], scope: CacheScope) -> int:
    seq = Sequence("probe", tokens, SamplingParams(), cache_scope=scope)
    peeked = kv.peek_prefix(seq)
    assert kv.match_prefix(seq) == peeked
    kv.free(seq)
    return peeked


def test_two_salts_never_share_a_block_and_the_same_salt_does() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    secret = list(range(100, 113))  # three full blocks and a token
    alice = _computed(kv, "alice", secret, ALICE)
    assert _hit(kv, [*secret, 7], ALICE) == 12
    assert _hit(kv, [*secret, 7], BOB) == 0
    assert _hit(kv, [*secret, 7], UNSALTED) == 0
    # The Redis tier's keys are the digests: none of alice's names bob's or the shared chain's.
    bob = _computed(kv, "bob", secret, BOB)
    plain = _computed(kv, "plain", secret, UNSALTED)
    assert len({*alice.block_digests, *bob.block_digests, *plain.block_digests}) == 9
    assert len(set(alice.block_hashes) | set(bob.block_hashes)) == 6


def test_bob_does_not_hit_alice_blocks_even_from_inside_the_shared_lead() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    public = [1, 2, 3, 4, 5, 6, 7, 8]  # two blocks every conversation opens with
    secret = [90, 91, 92, 93, 94, 95, 96, 97, 98]
    _computed(kv, "alice", public + secret, CacheScope("alice-salt", shared_blocks=2))
    bob = CacheScope("bob-salt", shared_blocks=2)
    # The public lead is shared; from the first salted block on, nothing is.
    assert _hit(kv, public + secret, bob) == 8
    assert _hit(kv, public + secret, CacheScope("alice-salt", shared_blocks=2)) == 16


def test_the_engine_scopes_requests_by_cache_salt(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(block_size=8)
    prompt = list(range(300, 341))  # five full blocks and a token

    def cached(salt: str | None, **kw: object) -> int:
        rid = engine.add_request(prompt, greedy(2, ignore_eos=True), cache_salt=salt, **kw)
        return run_to_completion(engine)[rid][-1].figures.cached_tokens

    assert cached("alice") == 0
    assert cached("bob") == 0 and cached(None) == 0
    assert cached("alice") == 40
    # A shared lead of 17 tokens covers two whole blocks of it.
    cached("carol", shared_prefix_tokens=17)
    assert cached("dave", shared_prefix_tokens=17) == 16


@pytest.mark.parametrize("salt", ["", 5])
def test_an_empty_or_non_string_salt_is_refused(make_engine, salt: object) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequestError):
        make_engine().add_request([1, 2, 3], greedy(2), cache_salt=salt)
