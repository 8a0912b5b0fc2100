"""The whole path with the real default model (slow: loads SmolLM2-135M)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from inference.backends.embedded import EmbeddedClient
from tests.engines import installed_engine
from tests.sockets import open_socket

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def real_engine(real_model_dir: Path) -> Iterator[EmbeddedClient]:
    with installed_engine(real_model_dir) as client:
        yield client


async def test_capital_of_france_streams_back_paris(
    real_engine: EmbeddedClient, make_user: Any, settings: Any
) -> None:
    settings.CHAT_FLUSH_INTERVAL_MS = 0
    user = await database_sync_to_async(make_user)("erin")
    sock, connected, _ = await open_socket(user)
    assert connected
    await sock.send(
        {
            "type": "send",
            "conversation_id": None,
            "text": "What is the capital of France?",
            "settings": {"temperature": 0, "max_tokens": 32},
        }
    )
    frames = await sock.recv_until("done", timeout=120)
    await sock.close()
    deltas = [f for f in frames if f["type"] == "delta"]
    done = frames[-1]
    assert len(deltas) >= 3, "streamed word by word"
    assert "Paris" in "".join(d["text"] for d in deltas)
    assert done["status"] == "complete" and done["finish_reason"] == "stop"
    assert done["figures"]["ttft_ms"] > 0 and done["figures"]["tokens_per_s"] > 0


async def test_a_reply_in_json_mode_parses_as_a_json_object(
    real_engine: EmbeddedClient, make_user: Any
) -> None:
    user = await database_sync_to_async(make_user)("jay")
    sock, connected, _ = await open_socket(user)
    assert connected
    settings = {"json_mode": True, "temperature": 0, "max_tokens": 200}
    await sock.send(
        {"type": "send", "conversation_id": None, "settings": settings,
         "text": "Give the name and colour of one fruit, as JSON."}
    )  # fmt: skip
    frames = await sock.recv_until("done", timeout=120)
    await sock.close()
    done = frames[-1]
    assert done["finish_reason"] == "stop", done["message"]["text"]
    streamed = "".join(f["text"] for f in frames if f["type"] == "delta")
    assert isinstance(json.loads(streamed), dict)
    assert done["message"]["text"] == streamed
