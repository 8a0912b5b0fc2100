"""Accessibility (issue 17, item 10): a finished reply is announced once to screen
readers, a skip link leads to the message box, the conversation list is one Tab stop
moved with the arrows, touch targets are 44 px on a phone, and axe-core finds no serious
or critical violation on the chat, its settings, Share and account dialogs, the API keys,
log-in and sign-up pages, a shared conversation and the latency dashboard."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import DESKTOP, PASSWORD, _watch, shot, sign_up
from tests.e2e.helpers import api, new_chat, replies, seed_reply, send, wait_finished
from tools.live_server import ROOT, LiveServer

pytestmark = pytest.mark.slow  # a real browser and the real default model

AXE = (ROOT / "frontend" / "node_modules" / "axe-core" / "axe.min.js").read_text()
MARKDOWN = (
    "## Steps\n\nSolve $x^2 = 4$:\n\n$$x = \\pm 2$$\n\n- [x] read\n- [ ] solve\n\n"
    "| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\nprint('hi')\n```\n\n"
    "[a link](https://example.com/) and [a removed one](javascript:alert(1))."
)


def axe_problems(page: Page) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now. axe is
    evaluated through the DevTools protocol: the page's CSP refuses an injected script tag."""
    if not page.evaluate("typeof window.axe === 'object'"):
        page.evaluate(AXE + "\n;0")
    found: list[dict[str, Any]] = page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ['violations']})).violations
             .filter(v => v.impact === 'serious' || v.impact === 'critical')
             .map(v => ({id: v.id, impact: v.impact, help: v.help,
                         nodes: v.nodes.slice(0, 5).map(n => n.target.join(' '))}))"""
    )
    return [f"{v['impact']} {v['id']}: {v['help']} at {v['nodes']}" for v in found]


def test_a_finished_reply_is_announced_once_not_every_token(page: Page) -> None:
    region = page.get_by_test_id("reply-announcer")
    expect(region).to_have_attribute("aria-live", "polite")
    expect(region).to_have_attribute("role", "status")
    page.evaluate(
        """() => { window.__said = [];
          const r = document.querySelector('[data-testid=reply-announcer]');
          new MutationObserver(() => r.textContent.trim() && window.__said.push(r.textContent))
            .observe(r, {subtree: true, childList: true, characterData: true}); }"""
    )
    new_chat(page, temperature=0, max_tokens=24)
    reply = send(page, "Tell me about Paris, the capital of France.")
    expect(reply).to_have_attribute("data-status", "streaming", timeout=60_000)
    assert page.evaluate("window.__said") == []  # nothing while it streams
    wait_finished(reply)
    expect(region).to_have_text(re.compile(r"^Reply: \S"))
    page.wait_for_timeout(500)
    said = page.evaluate("window.__said")
    text = reply.get_by_test_id("message-content").inner_text()
    assert len(said) == 1, said
    assert said[0].strip().startswith("Reply: " + " ".join(text.split()[:3])), (said, text)


def test_skip_link_and_one_tab_stop_for_the_conversation_list(page: Page) -> None:
    titles = ["Tax questions", "Trip to Lisbon", "Pasta recipe"]
    for t in titles:
        assert api(page, "POST", "/api/conversations/", {"title": t})["status"] == 201
    page.reload()
    expect(page.get_by_test_id("conversation-item")).to_have_count(3)

    # The skip link is the page's first Tab stop (just before the sidebar), shown while
    # focused, and leads to the message box.
    first = "document.querySelector('a[href], button, input, textarea, [tabindex]')"
    assert page.evaluate(first + ".dataset.testid") == "skip-to-composer"
    page.get_by_test_id("new-chat").focus()
    page.keyboard.press("Shift+Tab")
    skip = page.get_by_test_id("skip-to-composer")
    expect(skip).to_be_focused()
    box = skip.bounding_box()
    assert box and box["y"] >= 0, box
    shot(page, "60-skip-link")
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("composer-input")).to_be_focused()
    assert "#composer-input" not in page.url, page.url  # the conversation's hash stays

    # Walking on with Tab from the top of the sidebar: the list takes exactly one stop.
    page.get_by_test_id("new-chat").focus()
    stops: list[str] = []
    for _ in range(30):
        page.keyboard.press("Tab")
        stops.append(
            page.evaluate(
                """() => { const e = document.activeElement;
                  return e.closest('[data-testid=conversation-list]') ? 'list'
                    : (e.dataset.testid || e.tagName); }"""
            )
        )
        if stops[-1] == "composer-input":
            break
    assert stops.count("list") == 1, stops
    assert stops[-1] == "composer-input", stops

    # Inside the list: arrows, Home and End move; Enter opens; F2 renames; Delete asks.
    opener = page.get_by_test_id("conversation-open")
    opener.first.focus()
    page.keyboard.press("ArrowDown")
    expect(opener.nth(1)).to_be_focused()
    page.keyboard.press("End")
    expect(opener.nth(2)).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(opener.nth(2)).to_be_focused()
    page.keyboard.press("Home")
    expect(opener.nth(0)).to_be_focused()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    title = opener.nth(1).inner_text()
    expect(page.get_by_test_id("conversation-title")).to_have_text(title)
    expect(opener.nth(1)).to_have_attribute("tabindex", "0")
    assert [opener.nth(i).get_attribute("tabindex") for i in (0, 2)] == ["-1", "-1"]
    opener.nth(1).focus()
    page.keyboard.press("F2")
    expect(page.get_by_test_id("conversation-rename-input")).to_be_focused()
    page.keyboard.press("Escape")
    expect(opener.nth(1)).to_be_focused()
    page.keyboard.press("Delete")
    expect(page.get_by_test_id("conversation-delete-cancel")).to_be_focused()
    shot(page, "61-list-keyboard-delete")
    page.keyboard.press("Escape")
    expect(opener.nth(1)).to_be_focused()
    expect(page.get_by_test_id("conversation-item")).to_have_count(3)


SMALL_TARGETS = """() => {
  const small = [];
  const vw = innerWidth, vh = innerHeight;
  const all = 'button, a[href], input, textarea, select, [tabindex="0"]';
  for (const e of document.querySelectorAll(all)) {
    if (e.closest('.md') && e.tagName === 'A') continue;          // a link inside a sentence
    if (e.disabled && e.closest('.md')) continue;                 // a task list's checkbox
    const r = (e.type === 'checkbox' && e.closest('label') || e).getBoundingClientRect();
    const s = getComputedStyle(e);
    if (!r.width || !r.height || s.visibility === 'hidden' || r.bottom <= 0 || r.top >= vh
        || r.right <= 0 || r.left >= vw) continue;                 // not on screen
    if (Math.round(r.width) < 44 || Math.round(r.height) < 44)
      small.push(`${e.dataset.testid || e.tagName} ${Math.round(r.width)}x${Math.round(r.height)}`);
  }
  return small;
}"""


def test_touch_targets_are_at_least_44px_on_a_phone(browser: Browser, server: LiveServer) -> None:
    ctx = browser.new_context(
        viewport={"width": 390, "height": 844}, base_url=server.url, is_mobile=True, has_touch=True
    )
    try:
        page = ctx.new_page()
        errors = _watch(page)
        sign_up(page, "touchuser")
        seed_reply(server, "touchuser", "Earlier chat", "Show me markdown.", MARKDOWN)
        page.reload()
        new_chat(page, temperature=0, max_tokens=4)
        wait_finished(send(page, "What is the capital of France?"))
        expect(replies(page).last.get_by_test_id("message-regenerate")).to_be_visible()
        assert page.evaluate(SMALL_TARGETS) == []
        shot(page, "62-phone-touch-targets")

        page.get_by_test_id("sidebar-toggle").click()
        page.wait_for_timeout(400)
        expect(page.get_by_test_id("conversation-item")).to_have_count(2)
        assert page.evaluate(SMALL_TARGETS) == []
        page.get_by_test_id("conversation-open").last.click()
        expect(page.get_by_test_id("copy-code")).to_be_visible()
        assert page.evaluate(SMALL_TARGETS) == []

        page.get_by_test_id("settings-button").click()
        expect(page.get_by_test_id("settings-dialog")).to_be_visible()
        assert page.evaluate(SMALL_TARGETS) == []
        shot(page, "63-phone-settings")
        assert not errors, errors
    finally:
        ctx.close()


def test_axe_finds_no_serious_or_critical_violation(
    page: Page, browser: Browser, server: LiveServer
) -> None:
    username = page.get_by_test_id("username").inner_text()
    cid = seed_reply(server, username, "Markdown and math", "Show me.", MARKDOWN)
    found: dict[str, list[str]] = {}

    page.goto(f"/#/c/{cid}")
    page.reload()
    expect(replies(page).last.locator(".katex").first).to_be_visible()
    found["chat"] = axe_problems(page)
    page.emulate_media(color_scheme="dark")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    found["chat, dark"] = axe_problems(page)
    page.emulate_media(color_scheme="light")
    page.keyboard.press("Control+Shift+O")
    found["new chat"] = axe_problems(page)
    page.get_by_test_id("settings-button").click()
    expect(page.get_by_test_id("settings-dialog")).to_be_visible()
    found["settings dialog"] = axe_problems(page)
    page.keyboard.press("Escape")

    page.goto("/settings/keys/")
    page.fill("#key-name", "axe check")
    page.get_by_test_id("create-key").click()
    expect(page.locator("table.keys tbody tr")).to_have_count(1)
    found["API keys"] = axe_problems(page)

    anon = browser.new_context(viewport=DESKTOP, base_url=server.url)
    try:
        other = anon.new_page()
        other.goto("/accounts/login/")
        found["log in"] = axe_problems(other)
        other.fill("#id_username", "nobody")
        other.fill("#id_password", "wrong-password")
        other.click("[data-testid=login-submit]")
        expect(other.locator(".errorlist, .errornote").first).to_be_visible()
        found["log in, refused"] = axe_problems(other)
        other.goto("/accounts/signup/")
        found["sign up"] = axe_problems(other)
    finally:
        anon.close()

    server.make_user("axeops", PASSWORD, staff=True)
    staff_ctx = browser.new_context(viewport=DESKTOP, base_url=server.url)
    try:
        staff = staff_ctx.new_page()
        staff.goto("/admin/login/?next=/admin/latency/")
        staff.fill("#id_username", "axeops")
        staff.fill("#id_password", PASSWORD)
        staff.click("input[type=submit]")
        expect(staff.locator("#latency-dashboard[data-ready='1']")).to_be_attached(timeout=20_000)
        found["dashboard"] = axe_problems(staff)
    finally:
        staff_ctx.close()

    assert {k: v for k, v in found.items() if v} == {}, found


def test_sharing_and_keys_show_axe_no_serious_or_critical_violation(
    page: Page, browser: Browser, server: LiveServer
) -> None:
    username = page.get_by_test_id("username").inner_text()
    cid = seed_reply(server, username, "Shared maths", "Show me.", MARKDOWN)
    found: dict[str, list[str]] = {}
    page.goto(f"/#/c/{cid}")
    page.reload()
    expect(replies(page).last.locator(".katex").first).to_be_visible()

    page.get_by_test_id("share-button").click()
    dialog = page.get_by_test_id("share-dialog")
    expect(dialog.get_by_test_id("share-create")).to_have_text("Create link")
    found["share dialog"] = axe_problems(page)
    dialog.get_by_test_id("share-create").click()
    expect(dialog.get_by_test_id("share-url")).to_be_visible()
    url = dialog.get_by_test_id("share-url").input_value()
    found["share dialog, shared"] = axe_problems(page)
    dialog.get_by_test_id("share-revoke").click()
    found["share dialog, stop sharing?"] = axe_problems(page)
    dialog.get_by_test_id("share-revoke-cancel").click()
    # Tab stays inside the dialog.
    for _ in range(12):
        page.keyboard.press("Tab")
        assert page.evaluate(
            "document.activeElement.closest('[data-testid=share-dialog]') !== null"
        )
    page.keyboard.press("Escape")

    page.get_by_test_id("account-button").click()
    account = page.get_by_test_id("account-dialog")
    account.get_by_test_id("key-name").fill("axe check")
    account.get_by_test_id("key-create").click()
    expect(account.get_by_test_id("new-key")).to_be_visible()
    expect(account.get_by_test_id("link-row")).to_have_count(1)
    found["account dialog, new key"] = axe_problems(page)
    account.get_by_test_id("key-revoke").click()
    account.get_by_test_id("link-revoke").click()
    found["account dialog, revoke?"] = axe_problems(page)
    page.emulate_media(color_scheme="dark")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    found["account dialog, dark"] = axe_problems(page)
    page.emulate_media(color_scheme="light")
    page.keyboard.press("Escape")

    page.goto("/settings/keys/")
    page.fill("#key-name", "page check")
    page.get_by_test_id("create-key").click()
    expect(page.get_by_test_id("copy-key")).to_be_visible()
    found["API keys page, new key"] = axe_problems(page)

    anon = browser.new_context(viewport=DESKTOP, base_url=server.url)
    try:
        visitor = anon.new_page()
        visitor.goto(url)
        expect(visitor.get_by_test_id("shared-page")).to_have_attribute("data-ready", "true")
        found["shared page"] = axe_problems(visitor)
        visitor.emulate_media(color_scheme="dark")
        expect(visitor.locator("html")).to_have_attribute("data-theme", "dark")
        found["shared page, dark"] = axe_problems(visitor)
        visitor.goto(url[:-1] + ("A" if url[-1] != "A" else "B"))
        expect(visitor.get_by_test_id("shared-missing")).to_be_visible()
        found["shared page, 404"] = axe_problems(visitor)
    finally:
        anon.close()
    assert {k: v for k, v in found.items() if v} == {}, found
