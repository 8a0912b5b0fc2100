"""The chat-shaped workload of the API benchmarks (`vs_llama --workload chat-mix`, the
default): conversations as people hold them, deterministic from a seed.

Each conversation is a list of user turns; the client sends, at every turn, the whole
history so far (the earlier questions and the server's own replies) plus the next turn,
so histories grow. Replies end where the model ends them (bounded by the client's cap).
Conversations come in three kinds, in a fixed pattern over the clients (per 8: 4 short,
3 long, 1 document), so that every level of 8 or more clients has all three in the same
proportions:

- `short`: a one-line question (10-20 tokens), then short follow-ups;
- `long`: a paragraph of context before the question (100-250 tokens), follow-ups
  sometimes a paragraph too;
- `document`: a passage of one of the repository's docs (docs/*.md, 1,800-2,600
  characters: 500-750 tokens) pasted with a question about it, then questions about it.

Texts are composed from the word lists below and the repository's own files, nothing
downloaded. Every conversation differs from every other (topics, sentences, document
slices are drawn from the seed), so that no two share more than a few tokens of prefix.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("short", "long", "document")
# The kind of conversation i is PATTERN[i % 8]: client 0 short, 3 a document.
PATTERN = ("short", "long", "short", "document", "short", "long", "short", "long")
# Prose documents to paste (the settings reference is a table, left out).
DOCUMENTS = (
    "architecture.md", "http.md", "jobs.md", "kv-tier.md", "models.md", "reliability.md",
    "serving.md", "speculative.md", "titles.md", "workers.md", "websocket.md",
)  # fmt: skip
DOC_CHARS = (1800, 2600)

TOPICS = (
    "photosynthesis", "the French revolution", "black holes", "sourdough bread",
    "compound interest", "the immune system", "volcanoes", "machine learning",
    "the Roman empire", "climate change", "jazz music", "the water cycle", "chess openings",
    "electric cars", "honey bees", "the stock market", "plate tectonics", "coffee brewing",
    "the human heart", "solar panels", "ancient Egypt", "the internet", "tides",
    "vaccines", "origami", "the moon landing", "rainforests", "public speaking",
    "marathon training", "houseplants", "recycling", "the printing press",
)  # fmt: skip
SHORT = (
    "What is {t}?", "Explain {t} in simple terms.", "Give me three facts about {t}.",
    "Why does {t} matter?", "Write a short poem about {t}.", "How would you describe {t} "
    "to a child?", "What are common myths about {t}?", "Summarise the history of {t}.",
)  # fmt: skip
WHO = (
    "I am a high school teacher", "I work at a small startup", "I am a retired engineer",
    "I am a university student", "I run a bakery", "I am writing a novel",
    "I volunteer at a library", "I am a nurse on night shifts",
)  # fmt: skip
CONTEXT = (
    "Last week I started reading about {t} and realised how little I know about it.",
    "A friend of mine keeps bringing up {t} at dinner and I would like to follow along.",
    "I have to give a ten minute talk about {t} to a group that knows nothing about it.",
    "My notes so far are scattered across a notebook, a few browser tabs and some emails.",
    "I tried two books on the subject but the first was too technical and the second too "
    "shallow.",
    "I learn best from concrete examples, and I like to know why something works, not just "
    "that it does.",
    "I have about an hour a day to spend on this for the next two weeks.",
    "Some of what I read contradicted itself, so I am not sure which sources to trust.",
    "I would also like to connect it to things people see in their everyday lives.",
    "Please keep in mind that my audience ranges from teenagers to retired people.",
)  # fmt: skip
ASK_LONG = (
    "Could you give me an outline of the main ideas about {t}, in the order you would "
    "teach them?",
    "What would be a good plan for learning about {t}, and which misconceptions should "
    "I watch out for?",
    "Can you explain the key ideas behind {t} with one example for each?",
)  # fmt: skip
ASK_DOC = (
    "Summarise this document in a few sentences.",
    "What are the main points of this text?",
    "Explain what this text says to someone new to the project.",
    "List the settings or commands this text mentions, with what each does.",
)  # fmt: skip
FOLLOW_SHORT = (
    "Tell me more.", "Can you make it shorter?", "Why is that?", "Give an example.",
    "Thanks! What else should I know?", "Can you put that as a list?", "Is that always true?",
)  # fmt: skip
FOLLOW_LONG = (
    "That helps, thank you. I think I understood the first part, but I am still unsure "
    "about how the pieces fit together. Could you go over the second point again, more "
    "slowly, with a different example, and tell me what usually goes wrong when people "
    "first try it?",
    "Good. Now imagine I have to explain this to my colleagues tomorrow morning in five "
    "minutes, with no slides. What would you say first, what would you leave out, and "
    "which single example would make it stick?",
)  # fmt: skip
FOLLOW_DOC = (
    "Which part of the text is the most important, and why?",
    "What does the text leave unexplained?",
    "Rewrite the first paragraph of the text in plain words.",
    "What would a user have to do, according to this text?",
)  # fmt: skip


@dataclass(frozen=True)
class Conversation:
    """One conversation's user turns, in order; `source`: the pasted document's file."""

    kind: str
    turns: tuple[str, ...]
    source: str = ""


def conversations(n: int, turns: int, seed: int = 0) -> list[Conversation]:
    """n conversations of `turns` user turns each, the same for the same arguments: the
    first k of n are those of k (a level of more clients adds conversations)."""
    return [conversation(i, turns, seed) for i in range(n)]


def conversation(i: int, turns: int, seed: int = 0) -> Conversation:
    rng = random.Random(f"chat-mix/{seed}/{i}")
    kind = PATTERN[i % len(PATTERN)]
    topic = rng.choice(TOPICS)
    source = ""
    if kind == "short":
        first = rng.choice(SHORT).format(t=topic)
        follow = [_pick(rng, FOLLOW_SHORT, FOLLOW_LONG, 0.1) for _ in range(turns - 1)]
    elif kind == "long":
        context = rng.sample(CONTEXT, rng.randint(3, 6))
        first = " ".join([f"{rng.choice(WHO)}.", *context, rng.choice(ASK_LONG)])
        first = first.format(t=topic)
        follow = [_pick(rng, FOLLOW_SHORT, FOLLOW_LONG, 0.4) for _ in range(turns - 1)]
    else:
        source, passage = _document(rng)
        first = f"Here is a document:\n\n{passage}\n\n{rng.choice(ASK_DOC)}"
        follow = [_pick(rng, FOLLOW_DOC, FOLLOW_SHORT, 0.3) for _ in range(turns - 1)]
    return Conversation(kind, (first, *follow)[:turns], source)


def messages(conv: Conversation, turn: int, replies: list[str]) -> list[dict[str, str]]:
    """What turn `turn` (0-based) sends: every earlier turn with its reply, then this one."""
    out: list[dict[str, str]] = []
    for question, reply in zip(conv.turns[:turn], replies[:turn], strict=True):
        out += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
    return [*out, {"role": "user", "content": conv.turns[turn]}]


def _pick(rng: random.Random, usual: tuple[str, ...], other: tuple[str, ...], p: float) -> str:
    return rng.choice(other if rng.random() < p else usual)


@cache
def _document_text(name: str) -> str:
    path = ROOT / "docs" / name
    return path.read_text() if path.is_file() else ""


def _document(rng: random.Random) -> tuple[str, str]:
    """A slice of one of DOCUMENTS, from a paragraph's start, about DOC_CHARS long."""
    names = [n for n in DOCUMENTS if len(_document_text(n)) > DOC_CHARS[1]]
    if not names:
        raise FileNotFoundError(f"none of docs/{{{','.join(DOCUMENTS)}}} is long enough")
    name = rng.choice(names)
    text = _document_text(name)
    length = rng.randint(*DOC_CHARS)
    starts = [0] + [k + 2 for k in range(len(text) - length) if text.startswith("\n\n", k)]
    start = rng.choice(starts)
    passage = text[start : start + length]
    # End at a word's end, as a pasted selection does.
    return f"docs/{name}", passage[: passage.rfind(" ")] if " " in passage else passage
