"""Continue generating (issue 45, item 7): a reply cut at the length limit gets a
Continue button that writes the same reply on, in place."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import shot
from tests.e2e.helpers import (
    content,
    current_id,
    new_chat,
    replies,
    saved_messages,
    send,
    wait_finished,
)

pytestmark = pytest.mark.slow  # a real browser and the real default model


def test_a_reply_cut_at_the_limit_goes_on_in_place_with_continue(page: Page) -> None:
    new_chat(page, temperature=0, max_tokens=12)
    reply = send(page, "Write a long story about a dragon who learns to bake bread.")
    assert wait_finished(reply) == "complete"
    expect(reply.get_by_test_id("message-note")).to_have_text("Stopped at the length limit.")
    button = reply.get_by_test_id("message-continue")
    expect(button).to_be_visible()
    first_id = reply.get_attribute("data-message-id")
    first_text = content(reply)
    shot(page, "45-continue-before")

    button.click()
    expect(reply).to_have_attribute("data-status", "streaming")
    assert wait_finished(reply) == "complete"
    expect(replies(page)).to_have_count(1)  # the same reply, longer; no second one
    assert reply.get_attribute("data-message-id") == first_id
    longer = content(reply)
    assert len(longer) > len(first_text) and longer.startswith(first_text.rstrip()[:20])
    shot(page, "45-continue-after")

    saved = [m for m in saved_messages(page, current_id(page)) if m["role"] == "assistant"]
    assert len(saved) == 1 and saved[0]["id"] == int(first_id or 0)
    assert saved[0]["text"].startswith(first_text.strip()[:20])
    # Cut again at the limit: it can go on again; a reply that ended by itself cannot.
    if saved[0]["finish_reason"] == "length":
        expect(reply.get_by_test_id("message-continue")).to_be_visible()
    else:
        expect(reply.get_by_test_id("message-continue")).to_have_count(0)


def test_only_the_last_reply_offers_continue(page: Page) -> None:
    new_chat(page, temperature=0, max_tokens=6)
    wait_finished(send(page, "Write a long story about a dragon."))
    first = replies(page).first  # send() hands back the last reply, whichever it is then
    expect(first.get_by_test_id("message-continue")).to_be_visible()
    wait_finished(send(page, "And then?"))
    expect(first.get_by_test_id("message-continue")).to_have_count(0)
    expect(replies(page).last.get_by_test_id("message-continue")).to_be_visible()
