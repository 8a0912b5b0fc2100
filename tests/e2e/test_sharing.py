"""Sharing a conversation (issue 17, item 3) in the browser: the Share dialog makes a
read-only link; anyone opens it without logging in and sees the snapshot rendered as the
chat renders it (markdown, code, math, tables; hostile HTML inert, under the app's CSP,
not indexed); the owner updates it, revokes it (it then answers 404) and manages every
link from the account dialog."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.e2e.conftest import DESKTOP, XSS_USER, _watch, shot
from tests.e2e.helpers import api, replies, seed_reply
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow  # a real browser and the real default model

REPLY = (
    "## Plan\n\nSolve $x^2 = 4$:\n\n$$x = \\pm 2$$\n\n- [x] read\n- [ ] solve\n\n"
    "| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\ndef add(a, b):\n    return a + b\n```\n\n"
    'Inline HTML: <img src=x onerror="window.__xss=3"> <script>window.__xss=4</script> '
    '<a href="javascript:window.__xss=5">a js link</a> [md link](javascript:window.__xss=6) '
    '<iframe src="javascript:window.__xss=7"></iframe>'
)
# Collects the page's Content-Security-Policy violations (an init script runs before the
# page's own and is not subject to its policy).
CSP_WATCH = (
    "window.__csp = []; document.addEventListener('securitypolicyviolation', "
    "e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"
)
SHARE_URL = re.compile(r"^http://[^/]+/share/[A-Za-z0-9_-]{43}$")


@pytest.fixture
def visitor(browser: Browser, server: LiveServer) -> Iterator[BrowserContext]:
    """A browser of someone who is not logged in."""
    ctx = browser.new_context(viewport=DESKTOP, base_url=server.url)
    ctx.add_init_script(CSP_WATCH)
    yield ctx
    ctx.close()


def open_conversation(page: Page, cid: int) -> None:
    page.goto(f"/#/c/{cid}")
    page.reload()
    expect(replies(page).last).to_have_attribute("data-status", "complete")


def create_link(page: Page, **options: bool) -> str:
    page.get_by_test_id("share-button").click()
    dialog = page.get_by_test_id("share-dialog")
    expect(dialog.get_by_test_id("share-create")).to_be_enabled()
    for name, on in options.items():
        dialog.get_by_test_id(f"share-{name.replace('_', '-')}").set_checked(on)
    dialog.get_by_test_id("share-create").click()
    expect(dialog.get_by_test_id("share-url")).to_have_value(SHARE_URL)
    return dialog.get_by_test_id("share-url").input_value()


def visit(visitor: BrowserContext, url: str) -> tuple[Page, int, dict[str, str]]:
    page = visitor.new_page()
    page.errors = _watch(page)  # type: ignore[attr-defined]
    answer = page.goto(url)
    assert answer is not None
    if answer.status == 200:
        expect(page.get_by_test_id("shared-page")).to_have_attribute("data-ready", "true")
    return page, answer.status, answer.headers


def test_a_shared_link_shows_the_conversation_as_the_chat_renders_it(
    page: Page, visitor: BrowserContext, server: LiveServer
) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    username = page.get_by_test_id("username").inner_text()
    cid = seed_reply(server, username, "Maths <b>and</b> code", XSS_USER, REPLY)
    open_conversation(page, cid)
    page.get_by_test_id("share-button").click()
    dialog = page.get_by_test_id("share-dialog")
    expect(dialog).to_be_focused()
    expect(dialog.get_by_test_id("share-create")).to_have_text("Create link")
    expect(dialog.get_by_test_id("share-show-author")).not_to_be_checked()
    shot(page, "70-share-dialog")
    dialog.get_by_test_id("share-create").click()
    expect(dialog.get_by_test_id("share-url")).to_have_value(SHARE_URL)
    url = dialog.get_by_test_id("share-url").input_value()
    expect(dialog.get_by_test_id("share-info")).to_contain_text("2 messages")
    dialog.get_by_test_id("share-copy").click()
    expect(dialog.get_by_test_id("share-status")).to_have_text("Link copied.")
    assert page.evaluate("navigator.clipboard.readText()") == url
    shot(page, "71-share-link")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(page.get_by_test_id("share-button")).to_be_focused()

    shared, status, headers = visit(visitor, url)
    assert status == 200
    assert headers["x-robots-tag"] == "noindex, nofollow, noarchive"
    assert headers["referrer-policy"] == "no-referrer"
    assert "script-src 'self'" in headers["content-security-policy"]
    robots = shared.locator("meta[name=robots]").get_attribute("content")
    assert robots == "noindex, nofollow, noarchive"
    expect(shared.get_by_test_id("shared-title")).to_have_text("Maths <b>and</b> code")
    messages = shared.get_by_test_id("shared-message")
    expect(messages).to_have_count(2)
    expect(messages.nth(0)).to_have_attribute("data-role", "user")
    expect(messages.nth(0).get_by_test_id("message-content")).to_have_text(XSS_USER)
    reply = messages.nth(1).get_by_test_id("message-content")
    # The same renderer as the chat: headings, math typeset (its layout set through the
    # CSSOM), task lists, tables, highlighted code with its copy button.
    expect(reply.locator("h2")).to_have_text("Plan")
    expect(reply.locator(".katex").first).to_be_visible()
    expect(reply.locator(".math-display")).to_have_count(1)
    assert reply.locator("[data-math-style]").first.evaluate("e => e.style.cssText") != ""
    expect(reply.locator("input.task-check")).to_have_count(2)
    expect(reply.locator("table td").first).to_have_text("1")
    expect(reply.locator(".hljs-keyword").first).to_have_text("def")
    expect(reply.locator("[data-testid=copy-code]")).to_have_count(1)
    # Hostile HTML is inert: nothing ran, no script, frame or handler made it in, and a
    # javascript: link is plain text.
    assert shared.evaluate("window.__xss") is None
    expect(shared.locator(".shared-page script, iframe, [onerror]")).to_have_count(0)
    expect(reply.locator("a[href^='javascript']")).to_have_count(0)
    expect(reply.locator(".link-removed")).to_have_count(2)
    # Nothing private: no username, no figures.
    assert username not in shared.content()
    expect(shared.locator("[data-testid=message-figures]")).to_have_count(0)
    expect(shared.get_by_test_id("shared-settings")).to_have_count(0)
    # The page works under the app's CSP: its script, styles and fonts all load. The one
    # thing the policy refuses is the reply's own event handler, seen (never run) while the
    # sanitizer parses the reply, as in the chat itself.
    assert set(shared.evaluate("window.__csp")) <= {"script-src-attr inline"}
    shot(shared, "72-shared-page", full_page=True)
    shared.emulate_media(color_scheme="dark")
    expect(shared.locator("html")).to_have_attribute("data-theme", "dark")
    shot(shared, "73-shared-page-dark", full_page=True)
    assert set(shared.evaluate("window.__csp")) <= {"script-src-attr inline"}
    assert not shared.errors, shared.errors  # type: ignore[attr-defined]


def test_the_link_is_a_snapshot_until_updated_and_revoking_it_makes_it_404(
    page: Page, visitor: BrowserContext, server: LiveServer
) -> None:
    username = page.get_by_test_id("username").inner_text()
    cid = seed_reply(server, username, "Snapshot", "First question?", "First answer.")
    open_conversation(page, cid)
    url = create_link(page)
    page.keyboard.press("Escape")
    # The owner goes on chatting (stored as the chat stores a turn).
    server.python(
        "from chatapp.chat.models import Conversation as C, Message as M; "
        f"c = C.objects.get(pk={cid}); "
        "u = M.objects.create(conversation=c, role='user', parent=c.active_leaf, "
        "text='Second question?'); "
        "a = M.objects.create(conversation=c, role='assistant', parent=u, text='Second answer.'); "
        "c.active_leaf = a; c.save()"
    )
    shared, _, _ = visit(visitor, url)
    expect(shared.get_by_test_id("shared-message")).to_have_count(2)
    assert shared.evaluate("window.__csp") == []  # nothing the policy had to refuse
    expect(shared.get_by_text("Second answer.")).to_have_count(0)

    page.reload()
    page.get_by_test_id("share-button").click()
    dialog = page.get_by_test_id("share-dialog")
    expect(dialog.get_by_test_id("share-changed")).to_be_visible()
    expect(dialog.get_by_test_id("share-create")).to_have_text("Update link")
    dialog.get_by_test_id("share-show-author").check()
    shot(page, "74-share-changed")
    dialog.get_by_test_id("share-create").click()
    expect(dialog.get_by_test_id("share-changed")).to_be_hidden()
    expect(dialog.get_by_test_id("share-info")).to_contain_text("4 messages")
    assert dialog.get_by_test_id("share-url").input_value() == url  # same address
    shared.reload()
    expect(shared.get_by_test_id("shared-message")).to_have_count(4)
    expect(shared.get_by_test_id("shared-author")).to_have_text(username)

    # Stop sharing, asked first; the link is then gone for everyone.
    dialog.get_by_test_id("share-revoke").click()
    expect(dialog.get_by_test_id("share-revoke-cancel")).to_be_focused()
    dialog.get_by_test_id("share-revoke-cancel").click()
    expect(dialog.get_by_test_id("share-url")).to_have_value(url)
    dialog.get_by_test_id("share-revoke").click()
    shot(page, "75-share-revoke-prompt")
    dialog.get_by_test_id("share-revoke-confirm").click()
    expect(dialog.get_by_test_id("share-create")).to_have_text("Create link")
    expect(dialog.get_by_test_id("share-status")).to_contain_text("no longer works")
    gone, status, headers = visit(visitor, url)
    assert status == 404 and headers["x-robots-tag"].startswith("noindex")
    expect(gone.get_by_test_id("shared-missing")).to_be_visible()
    assert "Second answer." not in gone.content()

    # Sharing again makes a new address; the old one stays gone.
    dialog.get_by_test_id("share-create").click()
    expect(dialog.get_by_test_id("share-url")).to_have_value(SHARE_URL)
    assert dialog.get_by_test_id("share-url").input_value() != url
    assert visit(visitor, url)[1] == 404


def test_the_account_dialog_lists_the_links_and_revokes_them(
    page: Page, visitor: BrowserContext, server: LiveServer
) -> None:
    username = page.get_by_test_id("username").inner_text()
    urls = {}
    for title in ("Lisbon trip", "Pasta recipe"):
        cid = seed_reply(server, username, title, "Tell me.", f"About {title}.")
        answer = api(page, "POST", f"/api/conversations/{cid}/share/", {})
        assert answer["status"] == 201, answer
        urls[title] = (cid, answer["data"]["share"]["url"])
    page.reload()
    page.get_by_test_id("account-button").click()
    dialog = page.get_by_test_id("account-dialog")
    rows = dialog.get_by_test_id("link-row")
    expect(rows).to_have_count(2)
    expect(rows.get_by_test_id("link-open")).to_have_text(["Pasta recipe", "Lisbon trip"])
    assert rows.first.get_by_test_id("link-open").get_attribute("href") == urls["Pasta recipe"][1]
    shot(page, "76-account-shared-links")

    pasta = rows.filter(has_text="Pasta recipe")
    pasta.get_by_test_id("link-revoke").click()
    expect(pasta.get_by_test_id("link-revoke-cancel")).to_be_focused()
    pasta.get_by_test_id("link-revoke-confirm").click()
    expect(rows).to_have_count(1)
    expect(dialog.get_by_test_id("account-status")).to_contain_text("Stopped sharing")
    assert visit(visitor, urls["Pasta recipe"][1])[1] == 404
    assert visit(visitor, urls["Lisbon trip"][1])[1] == 200

    # "Open chat" shows the shared conversation in the chat.
    rows.first.get_by_test_id("link-conversation").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_test_id("conversation-title")).to_have_text("Lisbon trip")

    # Deleting a conversation takes its link with it.
    lisbon_id = urls["Lisbon trip"][0]
    assert api(page, "DELETE", f"/api/conversations/{lisbon_id}/")["status"] == 204
    assert visit(visitor, urls["Lisbon trip"][1])[1] == 404
    page.get_by_test_id("account-button").click()
    expect(dialog.get_by_test_id("links-empty")).to_be_visible()
