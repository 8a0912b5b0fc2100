"""Suffix decoding: guesses from the same owner's earlier requests, never another's; the
greedy text with them is the text without speculation."""

from __future__ import annotations

import random
from collections.abc import Callable

from inference.engine.engine import LLMEngine
from inference.engine.sequence import Sequence
from inference.engine.speculative import NgramProposer
from inference.engine.suffix_index import SuffixStore
from tests.engine.conftest import greedy, run_to_completion, token_ids_of

# -- the store alone -------------------------------------------------------------------


def test_the_longest_match_is_continued_and_a_short_match_earns_a_short_guess() -> None:
    store = SuffixStore(max_tokens=1000, max_total_tokens=1000)
    store.add("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    store.add("a", [0, 0, 4, 5, 6, 70, 80, 90, 95])  # more recent, shorter match for ...4 5 6
    assert store.propose("a", [1, 2, 3, 4, 5, 6], 4) == ([7, 8, 9], 6)  # the document ends
    assert store.propose("a", [9, 9, 4, 5, 6], 4) == ([70, 80, 90], 3)  # 3 matched: 3 guessed
    assert store.propose("a", [9, 9, 4, 5, 6], 2) == ([70, 80], 3)
    assert store.propose("a", [5, 6], 4) == ([], 0)  # under KEY_TOKENS
    assert store.propose("a", [4, 5, 7], 4) == ([], 0)


def test_the_most_frequent_continuation_wins_then_the_most_recent() -> None:
    store = SuffixStore(max_tokens=1000, max_total_tokens=1000)
    for tail in ([10, 11], [20, 21], [10, 11], [30, 31]):
        store.add("a", [1, 2, 3, *tail])
    assert store.propose("a", [1, 2, 3], 2) == ([10, 11], 3)
    store.add("a", [1, 2, 3, 30, 31])
    assert store.propose("a", [1, 2, 3], 2) == ([30, 31], 3)  # 2 against 2: the newer


def test_an_owner_gets_guesses_from_its_own_text_only() -> None:
    store = SuffixStore(max_tokens=1000, max_total_tokens=1000)
    store.add("alice", [5, 6, 7, 8, 100, 101, 102])
    assert store.propose("alice", [5, 6, 7, 8], 3) == ([100, 101, 102], 4)
    assert store.propose("bob", [5, 6, 7, 8], 3) == ([], 0)
    store.add("bob", [6, 7, 8, 200])
    assert store.propose("bob", [5, 6, 7, 8], 3) == ([200], 3)
    assert store.propose("alice", [5, 6, 7, 8], 3) == ([100, 101, 102], 4)


def test_memory_is_bounded_per_owner_and_in_all() -> None:
    store = SuffixStore(max_tokens=400, max_total_tokens=1000)
    rng = random.Random(0)
    docs = [[rng.randrange(1000, 30000) for _ in range(50)] for _ in range(40)]
    for doc in docs:
        store.add("a", doc)
        assert store.owners["a"].num_tokens <= 400
    assert store.propose("a", docs[-1][:10], 4)[0] == docs[-1][10:14]
    assert store.propose("a", docs[0][:10], 4) == ([], 0)  # the oldest went first
    for owner in ("b", "c", "d"):
        store.add(owner, docs[0] * 6)
    assert len(store) <= 1000
    assert "a" not in store.owners  # the least recently seen owner went first
    assert set(store.owners) == {"b", "c", "d"}
    # A document longer than the cap keeps its tail.
    store.add("e", list(range(1000, 2000)))
    assert store.owners["e"].num_tokens <= 400
    assert store.propose("e", [1997, 1998, 1999], 1) == ([], 0)  # nothing after the end
    assert store.propose("e", [1990, 1991, 1992], 2) == ([1993, 1994], 3)


# -- in the engine ---------------------------------------------------------------------

RNG = random.Random(46)


def _words(n: int) -> list[int]:
    return [RNG.randrange(300, 20000) for _ in range(n)]


SYSTEM, QUESTION, FOLLOW_UP, OTHER = _words(24), _words(20), _words(12), _words(18)


def _ask(engine: LLMEngine, *asks: tuple[str, list[int], str | None], n: int = 16):
    """Run requests (id, prompt, salt) together; their replies, by id."""
    for rid, prompt, salt in asks:
        engine.add_request(prompt, greedy(n, ignore_eos=True), request_id=rid, cache_salt=salt)
    out = run_to_completion(engine)
    return {rid: token_ids_of(out[rid]) for rid, _, _ in asks}


def _chat(engine: LLMEngine) -> dict[str, list[int]]:
    """Alice's turns: a question, a follow-up in the same chat beside bob's and an unsalted
    request, then her question again in a new chat."""
    first = [*SYSTEM, *QUESTION]
    out = _ask(engine, ("a1", first, "alice"))
    follow_up = [*first, *out["a1"], *FOLLOW_UP]
    out |= _ask(
        engine, ("a2", follow_up, "alice"), ("b1", OTHER, "bob"), ("u1", [*OTHER, *QUESTION], None)
    )
    return out | _ask(engine, ("a3", first, "alice"))


def test_greedy_text_with_a_warm_suffix_store_is_the_text_without_speculation(
    make_engine: Callable[..., LLMEngine],
) -> None:
    plain = _chat(make_engine())
    for mode in ("auto", "ngram"):
        engine = make_engine(speculative_mode=mode, speculative_min_acceptance=0.0)
        assert _chat(engine) == plain, mode
        stats = engine.stats()
        # The question asked again was answered from alice's first reply.
        assert stats["spec_suffix_accepted_tokens"] > 0, mode
        assert stats["spec_suffix_owners"] == 2  # alice and bob; unsalted: nobody's


def test_guesses_from_the_store_stand_where_prompt_lookup_has_none(
    make_engine: Callable[..., LLMEngine],
) -> None:
    """The same question in a new chat: prompt lookup finds little in a prompt of random
    tokens; the store has the first answer."""
    prompt = [*SYSTEM, *QUESTION]
    alone = make_engine(speculative_mode="ngram", suffix_max_tokens=0)
    first = _ask(alone, ("q1", prompt, "alice"), n=24)["q1"]
    engine = make_engine(speculative_mode="ngram")
    assert _ask(engine, ("q1", prompt, "alice"), n=24)["q1"] == first
    before = engine.stats()
    assert before["spec_suffix_drafted_tokens"] == 0  # nothing stored before q1 ended
    assert _ask(engine, ("q2", prompt, "alice"), n=24)["q2"] == first
    stats = engine.stats()
    from_store = stats["spec_suffix_accepted_tokens"]
    assert from_store >= 18  # nearly the whole reply, four guesses a check
    assert stats["spec_accepted_tokens"] - before["spec_accepted_tokens"] >= from_store
    assert alone.stats()["spec_suffix_accepted_tokens"] == 0
    assert alone.stats()["spec_accepted_tokens"] < from_store


def _spy(engine: LLMEngine) -> list[tuple[str, list[int], list[int]]]:
    """Every guess the speculator hands out: (request id, the sequence's tokens, guess)."""
    speculator = engine.speculator
    assert speculator is not None
    seen: list[tuple[str, list[int], list[int]]] = []
    propose = speculator.propose

    def spy(running: list[Sequence]) -> None:
        propose(running)
        for seq in running:
            if seq.draft_tokens:
                seen.append((seq.request_id, list(seq.token_ids), list(seq.draft_tokens)))

    speculator.propose = spy  # type: ignore[method-assign]
    return seen


def test_no_owner_and_no_unsalted_request_is_guessed_anothers_text(
    make_engine: Callable[..., LLMEngine],
) -> None:
    prompt = [*SYSTEM, *QUESTION]
    engine = make_engine(speculative_mode="auto", speculative_min_acceptance=0.0)
    seen = _spy(engine)
    answer = _ask(engine, ("alice-1", prompt, "alice"), n=20)["alice-1"]
    # Bob, and requests without a salt, ask alice's question: their guesses may only come
    # from their own tokens (prompt lookup), never from alice's answer in the store.
    out = _ask(engine, ("bob-1", prompt, "bob"), ("anon-1", prompt, None), n=20)
    out |= _ask(engine, ("anon-2", prompt, None), n=20)
    assert list(out.values()) == [answer] * 3
    assert engine.stats()["spec_suffix_drafted_tokens"] == 0
    own = NgramProposer(4, 2, 4)  # auto's prompt lookup
    for _, token_ids, guess in seen:
        assert guess == own.propose(token_ids)[: len(guess)]
    # The control: alice asking again is guessed her answer, which the spy sees.
    assert _ask(engine, ("alice-2", prompt, "alice"), n=20)["alice-2"] == answer
    assert engine.stats()["spec_suffix_accepted_tokens"] >= 14
    assert [g for rid, ids, g in seen if rid == "alice-2" and g != own.propose(ids)[: len(g)]]
