"""A reply being written when the page loses its network (issue 43, point 9): it shows
that it is paused, Stop is off with its reason, and once the network is back the page
resumes the reply, which finishes with exactly the saved text."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import shot
from tests.e2e.helpers import content, current_id, new_chat, saved_messages, send, wait_finished

pytestmark = pytest.mark.slow  # a real browser and the real default model


def test_offline_mid_reply_pauses_then_resumes_to_the_saved_text(page: Page) -> None:
    # Size the reply to about 10 s of streaming at the engine's speed right now, so the
    # network is cut and restored mid-reply on a fast machine and on a slow one.
    new_chat(page, temperature=0, max_tokens=8)
    wait_finished(send(page, "What is the capital of France?"))
    rate = saved_messages(page, current_id(page))[-1]["figures"]["tokens_per_s"]
    new_chat(page, temperature=0, max_tokens=max(48, min(400, round(rate * 10))))
    reply = send(page, "Tell me about the history of Paris in detail.")
    expect(reply.get_by_test_id("message-content")).not_to_have_text("", timeout=60_000)
    assert reply.get_attribute("data-status") == "streaming"
    stop = page.get_by_test_id("stop-button")
    expect(stop).to_be_enabled()
    expect(reply).to_have_class(re.compile(r"\bstatus-streaming\b"))  # the blinking cursor

    page.context.set_offline(True)
    expect(page.get_by_test_id("connection-status")).not_to_have_attribute(
        "data-state", "open", timeout=15_000
    )
    # Paused, in words, in place of the cursor; Stop is off and says why.
    expect(reply).to_have_attribute("data-paused", "true")
    expect(reply).to_have_attribute("data-status", "streaming")
    expect(reply).not_to_have_class(re.compile(r"\bstatus-streaming\b"))
    expect(reply.get_by_test_id("message-paused")).to_have_text(
        "Reconnecting… the reply will continue."
    )
    cursor = reply.evaluate(
        """el => { const last = el.querySelector('.md > :last-child');
                   return last ? getComputedStyle(last, '::after').content : 'none'; }"""
    )
    assert cursor in ("none", "normal"), cursor
    expect(stop).to_be_disabled()
    expect(stop).to_have_attribute("title", re.compile(r"connection is lost"))
    page.keyboard.press("Escape")  # refused too: no stop waits for the connection
    before = content(reply)
    page.wait_for_timeout(1500)
    assert content(reply) == before  # nothing reaches the page while it is offline
    shot(page, "offline-reply-paused")

    page.context.set_offline(False)
    expect(page.get_by_test_id("connection-status")).to_have_attribute(
        "data-state", "open", timeout=30_000
    )
    expect(reply).not_to_have_attribute("data-paused", "true")
    expect(reply.get_by_test_id("message-paused")).to_have_count(0)
    # The server kept writing while the page was away (CHAT_DISCONNECT_GRACE_S): the resume
    # brings it back, and the reply ends as it would have (not stopped by the Escape).
    assert wait_finished(reply) == "complete"
    final = content(reply)
    assert final.startswith(before.rstrip()[:40]), (before, final)
    assert len(final) > len(before)
    saved = saved_messages(page, current_id(page))[-1]
    assert saved["status"] == "complete"
    assert saved["finish_reason"] in ("stop", "length"), saved["finish_reason"]
    # Exactly the saved text on screen (raw, via the Copy button): no text repeated by the
    # snapshot and the deltas after it, none lost.
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    reply.get_by_test_id("message-copy").click()
    expect(reply.get_by_test_id("message-copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == saved["text"]
    shot(page, "offline-reply-resumed")
