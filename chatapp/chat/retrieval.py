"""Documents larger than the context window (docs/http.md, "Attachments"): cut into
passages, the passages most relevant to the question found with BM25 (a keyword ranking
that needs no second model), and only those put in the prompt, each with a number the
reply's sources refer to.

A PDF's text keeps its pages apart with a form feed (pdf_reader.py), so a passage knows
its page.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

PAGE_BREAK = "\f"
PASSAGE_CHARS = 800  # about 200 tokens: enough to answer from, small enough to pick many
# At most this many passages go (about 1,600 tokens): what answers a question is in the
# best few, and a prompt that fills the window costs its first token seconds of prefill.
MOST_PASSAGES = 8
K1, B = 1.5, 0.75  # BM25's usual constants
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class Passage:
    attachment_id: int
    name: str
    page: int | None  # 1-based, for a PDF
    text: str
    index: int = 0  # its place in the document

    @staticmethod
    def from_json(data: dict) -> Passage:
        return Passage(data["attachment_id"], data["name"], data.get("page"), data["text"])

    def as_json(self, number: int) -> dict:
        return {
            "n": number,
            "attachment_id": self.attachment_id,
            "name": self.name,
            "page": self.page,
            "text": self.text,
        }


def words(text: str) -> list[str]:
    """Lower-case words, a plural's "s" taken off ("zebras" matches "zebra")."""
    out = []
    for w in _WORD.findall(text.lower()):
        out.append(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def _pieces(text: str) -> Iterable[str]:
    """Paragraphs, each cut at PASSAGE_CHARS on a space."""
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        while len(para) > PASSAGE_CHARS:
            cut = para.rfind(" ", 0, PASSAGE_CHARS)
            cut = cut if cut > PASSAGE_CHARS // 2 else PASSAGE_CHARS
            yield para[:cut]
            para = para[cut:].lstrip()
        if para:
            yield para


def passages(attachment_id: int, name: str, text: str) -> list[Passage]:
    """A document's passages: paragraphs joined up to PASSAGE_CHARS, never across pages."""
    pages = text.split(PAGE_BREAK)
    out: list[Passage] = []
    for number, page_text in enumerate(pages, start=1):
        page = number if len(pages) > 1 else None
        current = ""
        for piece in _pieces(page_text):
            if current and len(current) + 1 + len(piece) > PASSAGE_CHARS:
                out.append(Passage(attachment_id, name, page, current, len(out)))
                current = ""
            current = f"{current} {piece}" if current else piece
        if current:
            out.append(Passage(attachment_id, name, page, current, len(out)))
    return out


def rank(items: list[Passage], query: str) -> list[Passage]:
    """The passages by BM25 score against `query`, best first; ties keep document order."""
    docs = [Counter(words(p.text)) for p in items]
    if not docs:
        return []
    avg = sum(sum(d.values()) for d in docs) / len(docs) or 1.0
    terms = set(words(query))
    df = {t: sum(1 for d in docs if t in d) for t in terms}
    n = len(docs)

    def score(d: Counter) -> float:
        length = sum(d.values())
        total = 0.0
        for t in terms:
            f = d.get(t, 0)
            if f:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                total += idf * f * (K1 + 1) / (f + K1 * (1 - B + B * length / avg))
        return total

    scored = sorted(range(n), key=lambda i: (-score(docs[i]), i))
    return [items[i] for i in scored]


def passage_block(number: int, p: Passage) -> str:
    where = f' page="{p.page}"' if p.page else ""
    return f'<passage n="{number}" document="{p.name}"{where}>\n{p.text}\n</passage>\n\n'


def select(ranked: list[Passage], fits: Callable[[list[Passage]], bool]) -> list[Passage]:
    """The best passages, at most MOST_PASSAGES, that fit together (`fits` says whether a
    choice does), in the order of the documents."""
    chosen: list[Passage] = []
    for p in ranked[: MOST_PASSAGES * 4]:
        if len(chosen) == MOST_PASSAGES:
            break
        if fits([*chosen, p]):
            chosen.append(p)
        elif chosen:
            break
    return sorted(chosen, key=lambda p: (p.attachment_id, p.index))


def prompt_text(question: str, chosen: list[Passage]) -> str:
    """A user turn made of the chosen passages, then the question."""
    if not chosen:
        return question
    head = (
        "The documents attached are too long to read whole; these passages from them are "
        "the most relevant to the question. Cite them by number, like [1].\n\n"
    )
    return head + "".join(passage_block(i, p) for i, p in enumerate(chosen, start=1)) + question
