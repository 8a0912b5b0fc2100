"""The chat-shaped benchmark workload (inference/bench/chat_workload.py): the same
conversations for the same seed, histories that grow turn by turn, short and long
prompts, and a few pasted documents from the repository's docs."""

from __future__ import annotations

import itertools

from inference.bench.api_clients import workload_conversations
from inference.bench.chat_workload import ROOT, conversations, messages


def test_the_same_seed_gives_the_same_conversations_and_another_seed_others() -> None:
    a, b = conversations(16, 3, seed=7), conversations(16, 3, seed=7)
    assert a == b
    assert conversations(8, 3, seed=7) == a[:8]  # more clients add conversations
    other = conversations(16, 3, seed=8)
    assert sum(x.turns[0] != y.turns[0] for x, y in zip(a, other, strict=True)) >= 12
    # Every conversation opens differently: no two share a history.
    assert len({c.turns[0] for c in conversations(64, 3, seed=0)}) == 64


def test_a_level_mixes_short_long_and_document_prompts() -> None:
    convs = conversations(64, 3, seed=0)
    kinds = [c.kind for c in convs]
    assert kinds.count("short") == 32 and kinds.count("long") == 24
    assert kinds.count("document") == 8  # a few, one client in eight
    first = {k: [len(c.turns[0]) for c in convs if c.kind == k] for k in set(kinds)}
    assert max(first["short"]) < 120 < min(first["long"])
    assert max(first["long"]) < 1500 < min(first["document"])
    for c in convs:
        assert len(c.turns) == 3
        if c.kind == "document":
            # A passage of a file in the repository, pasted whole into the first turn.
            text = (ROOT / c.source).read_text()
            passage = c.turns[0].split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
            assert passage in text and len(passage) > 1500
    # Follow-ups are mostly short, sometimes a paragraph.
    follow = [len(t) for c in convs for t in c.turns[1:]]
    assert min(follow) < 40 and max(follow) > 150


def test_each_turn_sends_the_whole_history_so_far() -> None:
    conv = conversations(4, 3, seed=1)[1]
    replies = ["first answer", "second answer", "third answer"]
    sent = [messages(conv, t, replies) for t in range(3)]
    assert [len(m) for m in sent] == [1, 3, 5]
    for earlier, later in itertools.pairwise(sent):
        assert later[: len(earlier)] == earlier  # a prefix: the server can reuse its KV
    assert sent[2][1] == {"role": "assistant", "content": "first answer"}
    assert sent[2][-1] == {"role": "user", "content": conv.turns[2]}


def test_the_fixed_workloads_keep_their_prompts() -> None:
    (conv,) = workload_conversations("rewrite", 1, 2)
    assert conv.turns[0].startswith("Repeat the following passage exactly")
    assert workload_conversations("chat-mix", 3, 2, seed=4) == conversations(3, 2, seed=4)
