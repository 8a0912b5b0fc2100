"""A conversation's generated title reaches the open page (the `title` frame) without a
reload: the sidebar and the header both show it (docs/titles.md)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from playwright.sync_api import Page, WebSocket, expect

from tests.e2e.conftest import shot
from tests.e2e.helpers import api, current_id, new_chat, send, wait_finished

pytestmark = pytest.mark.slow  # a real browser and the real default model

QUESTION = "How do I bake a simple loaf of bread at home without a machine?"


def test_the_sidebar_shows_the_generated_title_without_a_reload(page: Page) -> None:
    frames: list[dict[str, Any]] = []

    def watch(ws: WebSocket) -> None:
        def received(payload: str | bytes) -> None:
            if isinstance(payload, str):
                frames.append(json.loads(payload))

        ws.on("framereceived", received)

    # The page's socket is already open: reopen it so its frames are watched.
    page.on("websocket", watch)
    page.reload()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "open")
    page.evaluate("window.__sameDocument = true")

    new_chat(page, temperature=0, max_tokens=8)
    wait_finished(send(page, QUESTION))
    cid = current_id(page)
    entry = page.locator(f"[data-testid=conversation-item][data-conversation-id='{cid}']")
    # What the conversation was called when it was made: its first words.
    (made,) = [f for f in frames if f["type"] == "conversation"]
    first_words = made["conversation"]["title"]
    assert first_words.startswith("How do I bake a simple loaf")

    # The server's title job runs after the reply; wait until it stored its title.
    deadline = time.monotonic() + 90
    while True:
        title = api(page, "GET", f"/api/conversations/{cid}/")["data"]["conversation"]["title"]
        if title != first_words or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert title != first_words, "the title job wrote no title"
    assert len(title.split()) <= 6 and not title.endswith((".", "?", "…"))

    # The page got the title frame and shows the title, without a reload.
    expect(entry.get_by_test_id("conversation-open")).to_have_text(title)
    expect(page.get_by_test_id("conversation-title")).to_have_text(title)
    assert {"type": "title", "conversation_id": cid, "title": title} in frames
    assert page.evaluate("window.__sameDocument") is True
    shot(page, "titles-sidebar-updated")
