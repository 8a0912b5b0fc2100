"""Talking to the model in the browser: streaming, figures, stop, regenerate, edit,
resume after a refresh, and the TTFT a person sees."""

from __future__ import annotations

import json
import os
import re
import statistics
import time

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.e2e.conftest import SCREENSHOTS, _watch, log_in, shot
from tests.e2e.helpers import (
    content,
    current_id,
    new_chat,
    replies,
    saved_messages,
    send,
    user_messages,
    wait_finished,
)

# Records, in the page, each different text of the newest reply as the DOM changes.
SAMPLER = """() => {
  const samples = window.__samples = [];
  const list = document.querySelector('[data-testid=message-list]');
  new MutationObserver(() => {
    const all = list.querySelectorAll('[data-role=assistant] [data-testid=message-content]');
    const text = all.length ? all[all.length - 1].textContent : '';
    if (text.trim() && text !== samples[samples.length - 1]) samples.push(text);
  }).observe(list, {subtree: true, childList: true, characterData: true});
}"""

pytestmark = pytest.mark.slow  # a real browser and the real default model


def test_logged_in_user_sees_the_reply_stream_in_and_its_figures(context: BrowserContext) -> None:
    page = context.new_page()
    errors = _watch(page)
    page.goto("/")
    assert "/accounts/login/" in page.url  # the chat needs a login
    shot(page, "01-login")
    log_in(page, "alice")
    expect(page.get_by_test_id("username")).to_have_text("alice")
    expect(page.get_by_test_id("empty-state")).to_be_visible()
    shot(page, "02-empty-chat")

    new_chat(page, temperature=0, max_tokens=16)
    page.evaluate(SAMPLER)
    reply = send(page, "Tell me about Paris, the capital of France.")
    expect(user_messages(page).last).to_contain_text("Tell me about Paris")
    seen: list[str] = []
    deadline = time.monotonic() + 90
    while (
        reply.get_attribute("data-status") in ("sending", "streaming")
        and time.monotonic() < deadline
    ):
        text = content(reply)
        if text and (not seen or text != seen[-1]):
            seen.append(text)
            if len(seen) == 3:
                shot(page, "03-streaming")
        page.wait_for_timeout(120)
    assert wait_finished(reply) == "complete"
    final = content(reply)
    seen.append(final)
    # The text grew over several frames: at least three different, ever longer texts,
    # both as sampled from here and as recorded in the page at each DOM change.
    observed = page.evaluate("window.__samples")
    for samples in (seen, observed):
        assert len(set(samples)) >= 3, samples
        lengths = [len(t) for t in samples]
        assert lengths == sorted(lengths), samples
    assert "Paris" in final

    figures = reply.get_by_test_id("message-figures")
    expect(figures).to_have_attribute("data-ready", "true")
    for figure in ("ttft", "rate", "tokens", "cached"):
        expect(figures.locator(f"[data-figure={figure}]")).to_be_visible()
    expect(figures.locator("[data-figure=ttft]")).to_contain_text("TTFT")
    expect(figures.locator("[data-figure=tokens]")).to_contain_text("token")
    assert int(reply.get_attribute("data-client-ttft-ms") or "-1") >= 0
    shot(page, "04-reply-with-figures")

    # The saved reply is what the page shows; the page title follows the conversation.
    saved = saved_messages(page, current_id(page))
    assert saved[-1]["role"] == "assistant" and saved[-1]["status"] == "complete"
    assert "Paris" in saved[-1]["text"]
    assert saved[-1]["figures"]["output_tokens"] <= 16
    # Titled automatically (first words, or the title job's summary).
    expect(page.get_by_test_id("conversation-title")).not_to_have_text(re.compile(r"^(New chat)?$"))
    assert not errors, errors


def test_stop_button_and_escape_stop_a_reply_midway(page: Page) -> None:
    new_chat(page, temperature=0, max_tokens=300)
    reply = send(page, "Write a long story about a dragon who lives in a castle.")
    expect(reply.get_by_test_id("message-content")).not_to_have_text("", timeout=60_000)
    page.get_by_test_id("stop-button").click()
    assert wait_finished(reply, 20_000) == "stopped"
    expect(reply.get_by_test_id("message-note")).to_contain_text("Stopped")
    expect(page.get_by_test_id("send-button")).to_be_visible()
    text = content(reply)
    page.wait_for_timeout(800)
    assert content(reply) == text  # nothing more arrives after the stop
    shot(page, "05-stopped")

    reply = send(page, "Now write a long story about a cat who sails the sea.")
    expect(reply.get_by_test_id("message-content")).not_to_have_text("", timeout=60_000)
    page.keyboard.press("Escape")
    assert wait_finished(reply, 20_000) == "stopped"
    saved = saved_messages(page, current_id(page))
    assert [m["status"] for m in saved if m["role"] == "assistant"] == ["stopped", "stopped"]
    assert all(m["figures"]["output_tokens"] < 300 for m in saved if m["role"] == "assistant")


def test_regenerate_keeps_both_replies_as_alternatives(page: Page) -> None:
    new_chat(page, temperature=1.0, max_tokens=6)
    reply = send(page, "What is the capital of France?")
    wait_finished(reply)
    first = content(reply)
    expect(reply.get_by_test_id("alternatives")).to_have_count(0)
    reply.get_by_test_id("message-regenerate").click()
    reply = replies(page).last
    expect(replies(page)).to_have_count(1)
    alts = reply.get_by_test_id("alternatives")
    expect(alts.get_by_test_id("alt-counter")).to_have_text("2/2")
    wait_finished(reply)
    second = content(reply)
    shot(page, "06-alternatives")
    alts.get_by_test_id("alt-prev").click()
    expect(alts.get_by_test_id("alt-counter")).to_have_text("1/2")
    expect(reply.get_by_test_id("message-content")).to_have_text(first)
    alts.get_by_test_id("alt-next").click()
    expect(alts.get_by_test_id("alt-counter")).to_have_text("2/2")
    expect(reply.get_by_test_id("message-content")).to_have_text(second)
    # Kept on the server: after a reload both are still there.
    page.reload()
    expect(replies(page).last.get_by_test_id("alt-counter")).to_have_text("2/2")


def test_editing_an_earlier_message_branches_and_keeps_the_old_branch(page: Page) -> None:
    new_chat(page, temperature=0, max_tokens=4)
    wait_finished(send(page, "What is the capital of France?"))
    wait_finished(send(page, "And what about its population?"))
    expect(user_messages(page)).to_have_count(2)

    first_user = user_messages(page).first
    first_user.get_by_test_id("message-edit").click()
    edit = first_user.get_by_test_id("edit-input")
    expect(edit).to_have_value("What is the capital of France?")
    edit.fill("What is the capital of Italy?")
    first_user.get_by_test_id("edit-save").click()
    # The conversation branches from the edited message: what came after it is gone.
    expect(user_messages(page)).to_have_count(1)
    expect(user_messages(page).first.get_by_test_id("message-content")).to_have_text(
        "What is the capital of Italy?"
    )
    wait_finished(replies(page).last)
    expect(replies(page)).to_have_count(1)
    shot(page, "07-edited-branch")

    # The old branch is still reachable through the switcher on the edited message.
    switcher = page.get_by_test_id("alternatives").first
    expect(switcher.get_by_test_id("alt-counter")).to_have_text("2/2")
    switcher.get_by_test_id("alt-prev").click()
    expect(user_messages(page)).to_have_count(2)
    expect(user_messages(page).first.get_by_test_id("message-content")).to_have_text(
        "What is the capital of France?"
    )
    expect(user_messages(page).last.get_by_test_id("message-content")).to_have_text(
        "And what about its population?"
    )


def test_refresh_mid_reply_resumes_and_finishes_with_the_saved_text(page: Page) -> None:
    # Size the reply to about 5 s of streaming at the speed the engine has right now, so
    # the refresh lands mid-reply on a fast machine and the test stays short on a slow one.
    new_chat(page, temperature=0, max_tokens=8)
    wait_finished(send(page, "What is the capital of France?"))
    rate = saved_messages(page, current_id(page))[-1]["figures"]["tokens_per_s"]
    new_chat(page, temperature=0, max_tokens=max(24, min(200, round(rate * 5))))
    reply = send(page, "Tell me about the history of Paris in detail.")
    expect(reply.get_by_test_id("message-content")).not_to_have_text("", timeout=60_000)
    assert reply.get_attribute("data-status") == "streaming"
    before = content(reply)
    cid = current_id(page)

    page.reload()
    reply = replies(page).last
    # After the refresh the reply shows at least what was there (the saved checkpoint,
    # then the server's snapshot), is still being written, and keeps growing.
    expect(reply).to_have_attribute("data-status", "streaming")
    deadline = time.monotonic() + 15
    resumed = content(reply)
    while len(resumed) < len(before) and time.monotonic() < deadline:
        page.wait_for_timeout(50)
        resumed = content(reply)
    assert reply.get_attribute("data-status") == "streaming"
    assert len(resumed) >= len(before), (before, resumed)
    assert resumed.startswith(before.rstrip()[:20]), (before, resumed)
    shot(page, "08-resumed-after-refresh")
    assert wait_finished(reply) == "complete"
    final = content(reply)
    assert len(final) > len(resumed)
    saved = saved_messages(page, cid)[-1]
    assert saved["status"] == "complete"
    # The reply on screen is exactly the saved one (raw text, via the Copy button).
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    reply.get_by_test_id("message-copy").click()
    expect(reply.get_by_test_id("message-copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == saved["text"]


# Records, in the page, when Enter goes down in the composer and when the first text of
# the new reply is painted (the frame after the DOM first shows it).
TTFT_PROBE = """() => {
  const probe = window.__probe = {enter: null, painted: null};
  const input = document.querySelector('[data-testid=composer-input]');
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && probe.enter === null) probe.enter = performance.now();
  }, {capture: true});
  const sel = '[data-testid=message][data-role=assistant]';
  const known = new Set([...document.querySelectorAll(sel)]);
  const list = document.querySelector('[data-testid=message-list]');
  const obs = new MutationObserver(() => {
    if (probe.enter === null) return;
    for (const m of document.querySelectorAll(sel)) {
      if (known.has(m)) continue;
      const c = m.querySelector('[data-testid=message-content]');
      if (c && c.textContent.trim()) {
        obs.disconnect();
        requestAnimationFrame(() => { probe.painted = performance.now(); });
        return;
      }
    }
  });
  obs.observe(list, {subtree: true, childList: true, characterData: true});
}"""


def test_ttft_a_person_sees_from_enter_to_first_painted_token(page: Page) -> None:
    """Median of 5: 'What is the capital of France?' in a new chat, default settings."""
    runs = []
    for _ in range(5):
        new_chat(page, temperature=None)
        page.evaluate(TTFT_PROBE)
        box = page.get_by_test_id("composer-input")
        box.fill("What is the capital of France?")
        box.press("Enter")
        reply = replies(page).last
        expect(reply).to_have_attribute("data-client-ttft-ms", re.compile(r"^\d+$"), timeout=60_000)
        page.wait_for_function("window.__probe.painted !== null")
        probe = page.evaluate("window.__probe")
        page.keyboard.press("Escape")  # the rest of the reply does not matter here
        wait_finished(reply)
        server = saved_messages(page, current_id(page))[-1]["figures"]
        runs.append(
            {
                "ui_ms": int(reply.get_attribute("data-client-ttft-ms") or 0),
                "observer_ms": round(probe["painted"] - probe["enter"], 1),
                "server_ttft_ms": round(server["ttft_ms"], 1),
                "cached_tokens": server["cached_tokens"],
            }
        )
    result = {
        "median_ui_ms": statistics.median(r["ui_ms"] for r in runs),
        "median_observer_ms": statistics.median(r["observer_ms"] for r in runs),
        "median_server_ttft_ms": statistics.median(r["server_ttft_ms"] for r in runs),
        "runs": runs,
        "load_average": os.getloadavg(),
    }
    (SCREENSHOTS.parent / "ttft.json").write_text(json.dumps(result, indent=2))
    print("TTFT", json.dumps(result))
    for r in runs:
        # The page's own figure and an independent observer agree (same Enter, same paint).
        assert abs(r["ui_ms"] - r["observer_ms"]) < 150, r
        assert r["observer_ms"] >= r["server_ttft_ms"] - 50, r
