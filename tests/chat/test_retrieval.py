"""Documents larger than the context window: their passages most relevant to the
question go in the prompt instead of being refused, and the user message keeps which
(chatapp/chat/retrieval.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chatapp.chat import attachments, retrieval
from chatapp.chat.models import Attachment, Message
from tests.sockets import ChatSocket

FACT = "The lighthouse keeper Marguerite repaints the copper lantern every October."
FILLER = [
    "harvest",
    "river",
    "stone",
    "market",
    "bridge",
    "winter",
    "candle",
    "orchard",
    "ledger",
    "wagon",
]


def book(pages: int = 200, fact_page: int = 150, seed: int = 3) -> str:
    """A PDF's text as pdf_reader gives it: pages apart by form feeds, one fact on one page."""
    rng = random.Random(seed)
    texts = []
    for n in range(1, pages + 1):
        paragraphs = [" ".join(rng.choices(FILLER, k=60)) + "." for _ in range(3)]
        if n == fact_page:
            paragraphs.insert(1, FACT)
        texts.append("\n\n".join(paragraphs))
    return "\n\f\n".join(texts)


def test_a_200_page_document_answers_about_page_150_from_its_passage() -> None:
    found = retrieval.passages(7, "book.pdf", book())
    assert {p.page for p in found} == set(range(1, 201))
    assert all(len(p.text) <= retrieval.PASSAGE_CHARS for p in found)
    best = retrieval.rank(found, "Who repaints the lantern of the lighthouse?")[0]
    assert best.page == 150 and FACT in best.text


def test_the_chosen_passages_fit_and_keep_the_documents_order() -> None:
    found = retrieval.passages(7, "book.pdf", book())
    ranked = retrieval.rank(found, "copper lantern October")
    chosen = retrieval.select(ranked, lambda ps: sum(len(p.text) for p in ps) <= 3000)
    assert chosen and sum(len(p.text) for p in chosen) <= 3000
    assert any(FACT in p.text for p in chosen)
    assert [p.index for p in chosen] == sorted(p.index for p in chosen)
    text = retrieval.prompt_text("Who repaints it?", chosen)
    assert '<passage n="1" document="book.pdf" page="' in text and text.endswith("Who repaints it?")


@pytest.mark.django_db(transaction=True)
async def test_a_document_past_the_window_is_sent_as_its_relevant_passages(
    alice_socket: ChatSocket, tiny_engine: Any, settings: Any
) -> None:
    settings.CHAT_ATTACHMENT_MAX_CHARS = 10**6
    text = book()
    doc = await database_sync_to_async(attachments.create_pending)(
        alice_socket.user,  # type: ignore[attr-defined]
        "book.txt",
        text.encode(),
        None,
    )
    question = "Who repaints the copper lantern?"
    await alice_socket.send(
        {
            "type": "send",
            "conversation_id": None,
            "text": question,
            "attachments": [doc.pk],
            "settings": {"max_tokens": 4},
        }
    )
    frames = await alice_socket.recv_until("done")
    start = next(f for f in frames if f["type"] == "start")
    sources = start["user_message"]["sources"]
    assert sources and any(FACT in s["text"] and s["page"] == 150 for s in sources)
    assert [s["n"] for s in sources] == list(range(1, len(sources) + 1))
    figures = frames[-1]["figures"]
    assert figures["prompt_tokens"] + 4 <= tiny_engine.max_model_len
    user = await Message.objects.aget(pk=start["user_message"]["id"])
    assert user.sources == sources
    # The document stays the message's own, whole.
    kept = await Attachment.objects.aget(pk=doc.pk)
    assert kept.message_id == user.pk and kept.text == text

    # The next turn reads the same passages in its history, and fits too.
    conv_id = start["conversation_id"]
    await alice_socket.send({"type": "send", "conversation_id": conv_id, "text": "And then?"})
    nxt = await alice_socket.recv_until("done")
    assert nxt[-1]["status"] == "complete"
    assert nxt[-1]["figures"]["cached_tokens"] >= figures["prompt_tokens"] // 16 * 16 - 16
