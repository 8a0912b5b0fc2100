"""Suffix decoding's memory: an owner's earlier prompts and replies, and guesses from them.

Prompt lookup (speculative.py, NgramProposer) guesses only from the sequence itself. A
user's requests repeat one another too: the same question asked again in a new chat, a
reply regenerated, the same kind of answer (code skeletons, lists, closing lines) written
again. SuffixDecoding (Oliinyk et al. 2024) keeps finished requests' text and proposes what
followed the longest earlier match of the sequence's last tokens, as many tokens as the
match is long. This is that store, scoped like the KV cache: an owner is a request's
`CacheScope.salt`, and an owner's guesses come from its own text only. Requests without a
salt never reach it (the Speculator neither feeds nor asks it for them).

Each owner's text is a few token lists (segments; documents separated by SEPARATOR, so
neither a match nor a guess crosses from one request into the next), each with a dict from
each KEY_TOKENS-gram to the positions that follow it. A lookup takes the most recent
CANDIDATES positions of the sequence's last KEY_TOKENS tokens, extends each match
backwards up to MAX_MATCH tokens, keeps the longest, and walks forward from them by vote:
at each step the token most of the surviving candidates continue with (the most recent on
a tie). That is the most frequent path below the match in a suffix tree of the owner's
text, without building the tree.

Memory is bounded: `max_tokens` per owner (the oldest segment goes first) and
`max_total_tokens` in all (the least recently used owners go first). Positions are indexed
when a request finishes, never during a step.
"""

from __future__ import annotations

from collections import OrderedDict

# Matches start at this many tokens: across requests, a one- or two-token match (", the")
# says little about what comes next.
KEY_TOKENS = 3
# Matches are extended backwards up to this many tokens: a longer one is no more telling.
MAX_MATCH = 16
# The most recent positions of a key a lookup examines: bounds a step's cost for keys
# every reply contains (the chat template's turn markers).
CANDIDATES = 16
SEPARATOR = -1
# An owner's text is kept in this many segments or so; the oldest goes when it is over.
SEGMENTS = 4
_KEY_BITS = 21
_KEY_MASK = (1 << _KEY_BITS) - 1


def _key(a: int, b: int, c: int) -> int:
    # Token ids past 2**21 share keys with others: harmless, every match is checked token
    # by token.
    return ((a & _KEY_MASK) << (2 * _KEY_BITS)) | ((b & _KEY_MASK) << _KEY_BITS) | (c & _KEY_MASK)


class _Segment:
    """Some of an owner's documents, in one token list, and their index."""

    __slots__ = ("index", "tokens")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        # KEY_TOKENS-gram key -> positions of the token after each occurrence, ascending.
        self.index: dict[int, list[int]] = {}

    def append(self, doc: list[int]) -> None:
        t = self.tokens
        index = self.index
        first = len(t) + KEY_TOKENS
        t.extend(doc)
        t.append(SEPARATOR)
        for p in range(first, len(t) - 1):  # positions with a whole key before them
            key = _key(t[p - 3], t[p - 2], t[p - 1])
            positions = index.get(key)
            if positions is None:
                index[key] = [p]
            else:
                positions.append(p)


class _OwnerText:
    """One owner's documents, oldest first, in segments of up to `segment_tokens` tokens:
    the oldest segment is dropped whole, so keeping the owner under its cap never
    re-indexes anything."""

    __slots__ = ("num_tokens", "segment_tokens", "segments")

    def __init__(self, segment_tokens: int) -> None:
        self.segments: list[_Segment] = [_Segment()]
        self.segment_tokens = segment_tokens
        self.num_tokens = 0

    def append(self, doc: list[int], max_tokens: int) -> None:
        last = self.segments[-1]
        if last.tokens and len(last.tokens) + len(doc) > self.segment_tokens:
            last = _Segment()
            self.segments.append(last)
        before = len(last.tokens)
        last.append(doc)
        self.num_tokens += len(last.tokens) - before
        while self.num_tokens > max_tokens and len(self.segments) > 1:
            self.num_tokens -= len(self.segments.pop(0).tokens)

    def lookup(self, tail: list[int], limit: int) -> tuple[list[int], int]:
        """(guess, match length) for a sequence ending in `tail`; ([], 0) without a match."""
        if len(tail) < KEY_TOKENS or limit <= 0:
            return [], 0
        key = _key(tail[-3], tail[-2], tail[-1])
        longest = min(MAX_MATCH, len(tail))
        whole = tail[-longest:]
        best = 0
        best_at: list[tuple[list[int], int]] = []  # (segment's tokens, position)
        left = CANDIDATES
        for segment in reversed(self.segments):  # most recent first
            positions = segment.index.get(key)
            if not positions:
                continue
            t = segment.tokens
            for p in reversed(positions[-left:]):
                if p >= longest and t[p - longest : p] == whole:
                    n = longest  # the common case in a repeat, compared in C
                else:
                    n = 0
                    while n < longest and n < p and t[p - 1 - n] == tail[-1 - n]:
                        n += 1
                if n > best:
                    best, best_at = n, [(t, p)]
                elif n == best:
                    best_at.append((t, p))
            left -= min(left, len(positions))
            if not left:
                break
        if best < KEY_TOKENS:  # a key shared by masking only
            return [], 0
        # As SuffixDecoding scales its guess with the match: a short match earns a short
        # guess.
        want = min(limit, best)
        guess: list[int] = []
        alive = best_at
        while alive and len(guess) < want:
            counts: dict[int, int] = {}
            for t, p in alive:
                token = t[p]
                if token != SEPARATOR:
                    counts[token] = counts.get(token, 0) + 1
            if not counts:
                break
            # max() keeps the first of equals: candidates run most recent first.
            token = max(counts, key=counts.__getitem__)
            guess.append(token)
            alive = [(t, p + 1) for t, p in alive if t[p] == token]
        return guess, best


class SuffixStore:
    """Finished requests' tokens by owner, bounded; guesses for an owner's sequences."""

    def __init__(self, max_tokens: int, max_total_tokens: int) -> None:
        if max_tokens <= KEY_TOKENS or max_total_tokens < max_tokens:
            raise ValueError(
                f"the suffix store needs {KEY_TOKENS} < max_tokens <= max_total_tokens"
            )
        self.max_tokens = max_tokens
        self.max_total_tokens = max_total_tokens
        self.owners: OrderedDict[str, _OwnerText] = OrderedDict()  # least recent first
        self.total_tokens = 0

    def add(self, owner: str, token_ids: list[int]) -> None:
        """Keep a finished request's text (its new prompt part and its reply) for `owner`."""
        if len(token_ids) <= KEY_TOKENS:
            return
        text = self.owners.get(owner)
        if text is None:
            text = self.owners[owner] = _OwnerText(max(64, self.max_tokens // SEGMENTS))
        self.owners.move_to_end(owner)
        before = text.num_tokens
        # The separator counts too: a document and its separator fit the cap.
        text.append(token_ids[-(self.max_tokens - 1) :], self.max_tokens)
        self.total_tokens += text.num_tokens - before
        while self.total_tokens > self.max_total_tokens and len(self.owners) > 1:
            _, oldest = self.owners.popitem(last=False)
            self.total_tokens -= oldest.num_tokens

    def propose(self, owner: str, token_ids: list[int], limit: int) -> tuple[list[int], int]:
        """(guess, match length) for an owner's sequence `token_ids`: up to `limit` tokens,
        from the owner's own text only; ([], 0) when it has none that matches."""
        text = self.owners.get(owner)
        if text is None:
            return [], 0
        return text.lookup(token_ids[-MAX_MATCH:], limit)

    def __len__(self) -> int:
        return self.total_tokens
