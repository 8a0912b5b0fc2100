"""A follow-up question about a long document, on the real default model (slow): the
second turn does not read the document again, by the engine's own figures.

The turn-2 TTFT of each case is recorded in test-artifacts/documents-followup.json (REPS
runs each, never asserted: timings and their spread live in `python -m
inference.bench.followup`); what is asserted is its cause, the tokens the engine computed for
turn 2, which one run shows as well as three: they are counts, not timings.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chatapp.chat import attachments
from chatapp.chat.models import Message
from inference.backends.embedded import EmbeddedClient
from inference.bench.followup import QUESTION_1, QUESTION_2, document
from inference.client import set_engine_client
from tests.engines import make_engine_client
from tests.sockets import open_socket
from tools.live_server import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DOC_TOKENS = 4000
REPS = 1


@pytest.fixture(scope="module")
def engine_8k(real_model_dir: Path) -> Iterator[EmbeddedClient]:
    """The real model with KV room for its whole 8,192-token window."""
    client = make_engine_client(real_model_dir, kv_cache_memory_mb=768, max_num_batched_tokens=512)
    set_engine_client(client)
    try:
        yield client
    finally:
        set_engine_client(None)


async def two_turns(user: Any, doc: attachments.Attachment | None) -> tuple[dict, dict]:
    sock, connected, _ = await open_socket(user)
    assert connected
    frame: dict[str, Any] = {
        "type": "send",
        "conversation_id": None,
        "text": QUESTION_1,
        "settings": {"temperature": 0, "max_tokens": 12},
    }
    if doc is not None:
        frame["attachments"] = [doc.pk]
    await sock.send(frame)
    first = await sock.recv_until("done", timeout=300)
    conv_id = next(f for f in first if f["type"] == "start")["conversation_id"]
    await sock.send({"type": "send", "conversation_id": conv_id, "text": QUESTION_2})
    second = await sock.recv_until("done", timeout=300)
    await sock.close()
    return first[-1]["figures"], second[-1]["figures"]


async def test_a_follow_up_about_a_long_document_does_not_read_it_again(
    engine_8k: EmbeddedClient, make_user: Any, settings: Any
) -> None:
    settings.RESPONSE_CACHE_ENABLED = False
    settings.CHAT_FLUSH_INTERVAL_MS = 0
    assert engine_8k.max_model_len == 8192  # SmolLM2-135M's window: the document fits
    block = engine_8k.engine.config.block_size
    runs: dict[str, list[tuple[dict, dict]]] = {"with_document": [], "without": []}
    for r in range(REPS):  # interleaved; a user each, so no run finds another's blocks
        for case in runs:
            user = await database_sync_to_async(make_user)(f"reader{r}-{case}")
            doc = None
            if case == "with_document":
                text = document(engine_8k.tokenizer, DOC_TOKENS, f"run{r}")
                doc = await database_sync_to_async(attachments.create_pending)(
                    user, "inventory.txt", text.encode(), engine_8k
                )
            runs[case].append(await two_turns(user, doc))

    for first, second in runs["with_document"]:
        assert first["prompt_tokens"] > DOC_TOKENS
        # Turn 2 found turn 1 (document included) in the cache, all but a partial block ...
        assert second["cached_tokens"] >= first["prompt_tokens"] - block
    # ... so it computed as few tokens as the same follow-up after no document.
    computed = {
        case: [s["prompt_tokens"] - s["cached_tokens"] for _, s in pairs]
        for case, pairs in runs.items()
    }
    for with_doc, without in zip(computed["with_document"], computed["without"], strict=True):
        assert abs(with_doc - without) <= block, computed

    ttft = {case: statistics.median(s["ttft_ms"] for _, s in pairs) for case, pairs in runs.items()}
    out = ROOT / "test-artifacts" / "documents-followup.json"
    out.parent.mkdir(exist_ok=True)
    figures = {
        "doc_prompt_tokens": [f["prompt_tokens"] for f, _ in runs["with_document"]],
        "turn2_tokens_computed": computed,
        "turn2_ttft_ms_median": ttft,
        "turn2_ttft_with_over_without": ttft["with_document"] / ttft["without"],
        "runs": {case: [s for _, s in pairs] for case, pairs in runs.items()},
    }
    out.write_text(json.dumps(figures, indent=2))
    assert await database_sync_to_async(Message.objects.count)() == REPS * 2 * 4
