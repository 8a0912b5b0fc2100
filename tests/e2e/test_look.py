"""How the page looks and behaves: markdown and code, inert HTML, themes, phone layout,
offline sends."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.e2e.conftest import CODE, XSS_USER, _watch, log_in, shot, sign_up
from tests.e2e.helpers import content, new_chat, replies, send, user_messages, wait_finished

pytestmark = pytest.mark.slow  # a real browser and the real default model


def assert_inert(page: Page) -> None:
    found = page.evaluate(
        """() => {
          const list = document.querySelector('[data-testid=message-list]');
          const all = [...list.querySelectorAll('*')];
          return {
            scripts: list.querySelectorAll('script, iframe, object, embed').length,
            handlers: all.filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
            jsLinks: all.filter(e => /^\\s*javascript:/i.test(
              e.getAttribute('href') || e.getAttribute('src') || '')).length,
            xss: window.__xss ?? null,
          };
        }"""
    )
    assert found == {"scripts": 0, "handlers": 0, "jsLinks": 0, "xss": None}, found


def test_markdown_and_code_render_with_copy_and_html_stays_inert(
    context: BrowserContext, seeded: dict
) -> None:
    page = context.new_page()
    errors = _watch(page)
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    log_in(page, seeded["username"])
    page.goto(f"/#/c/{seeded['conversation']}")
    page.reload()
    reply = replies(page).last
    md = reply.get_by_test_id("message-content")
    expect(md.locator("h2")).to_have_text("A heading")
    expect(md.locator("strong")).to_have_text("bold")
    expect(md.locator("li")).to_have_count(2)
    expect(md.locator("table td")).to_have_count(2)
    code = md.locator("pre code")
    expect(code).to_have_text(CODE)
    assert code.locator("span[class^=hljs-]").count() > 0  # highlighted
    # HTML in a message is shown as text or removed, never run.
    expect(user_messages(page).first.get_by_test_id("message-content")).to_have_text(XSS_USER)
    assert_inert(page)
    shot(page, "20-markdown-code")
    reply.get_by_test_id("copy-code").click()
    expect(reply.get_by_test_id("copy-code")).to_contain_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()").rstrip("\n") == CODE

    # The same payload typed by a person and streamed back by the model stays inert too.
    new_chat(page, temperature=0, max_tokens=6)
    reply = send(page, XSS_USER + " Repeat exactly what I wrote.")
    wait_finished(reply)
    expect(user_messages(page).last.get_by_test_id("message-content")).to_contain_text("<script>")
    assert_inert(page)
    assert not errors, errors


def test_dark_theme_follows_the_system_and_the_toggle(
    browser: Browser, server, seeded: dict
) -> None:
    ctx = browser.new_context(
        viewport={"width": 1280, "height": 800}, base_url=server.url, color_scheme="dark"
    )
    try:
        page = ctx.new_page()
        errors = _watch(page)
        log_in(page, seeded["username"])
        page.goto(f"/#/c/{seeded['conversation']}")
        page.reload()
        expect(page.locator("html")).to_have_attribute("data-theme", "dark")
        toggle = page.get_by_test_id("theme-toggle")
        expect(toggle).to_have_attribute("data-theme", "dark")
        expect(replies(page).last.locator("pre code")).to_be_visible()

        def background() -> tuple[int, ...]:
            css = page.evaluate("getComputedStyle(document.body).backgroundColor")
            return tuple(int(x) for x in css[css.index("(") + 1 : css.index(")")].split(",")[:3])

        assert sum(background()) < 3 * 80, background()
        shot(page, "21-dark")
        toggle.click()
        expect(page.locator("html")).to_have_attribute("data-theme", "light")
        assert sum(background()) > 3 * 200, background()
        shot(page, "22-light")
        # The choice is remembered over the system's.
        page.reload()
        expect(page.locator("html")).to_have_attribute("data-theme", "light")
        page.get_by_test_id("theme-toggle").click()
        expect(page.locator("html")).to_have_attribute("data-theme", "dark")
        assert not errors, errors
    finally:
        ctx.close()


def test_phone_layout_drawer_and_composer(browser: Browser, server) -> None:
    ctx = browser.new_context(
        viewport={"width": 390, "height": 844}, base_url=server.url, is_mobile=True, has_touch=True
    )
    try:
        page = ctx.new_page()
        errors = _watch(page)
        sign_up(page, "phoneuser")
        app = page.get_by_test_id("app")
        sidebar = page.get_by_test_id("sidebar")

        def sidebar_on_screen() -> bool:
            box = sidebar.bounding_box()
            return bool(box) and box["x"] + box["width"] > 10 and box["x"] >= -1

        def no_sideways_scroll() -> None:
            assert page.evaluate("document.documentElement.scrollWidth") <= 390

        expect(page.get_by_test_id("sidebar-toggle")).to_be_visible()
        page.wait_for_timeout(300)
        assert not sidebar_on_screen()
        no_sideways_scroll()

        new_chat(page, temperature=0, max_tokens=2)
        reply = send(page, "What is the capital of France?")
        wait_finished(reply)
        assert content(reply)
        box = page.get_by_test_id("composer-input").bounding_box()
        assert (
            box
            and box["x"] >= 0
            and box["x"] + box["width"] <= 390
            and box["y"] + box["height"] <= 844
        )
        no_sideways_scroll()
        shot(page, "30-phone-chat")

        page.get_by_test_id("sidebar-toggle").click()
        expect(app).to_have_attribute("class", re.compile(r"\bdrawer-open\b"))
        page.wait_for_timeout(400)
        assert sidebar_on_screen()
        expect(page.get_by_test_id("conversation-item")).to_have_count(1)
        shot(page, "31-phone-drawer")
        page.get_by_test_id("drawer-scrim").click(position={"x": 370, "y": 400})
        expect(app).not_to_have_attribute("class", re.compile(r"\bdrawer-open\b"))
        page.wait_for_timeout(400)
        assert not sidebar_on_screen()
        # Opening a conversation from the drawer closes it.
        page.get_by_test_id("sidebar-toggle").click()
        page.get_by_test_id("conversation-open").first.click()
        expect(app).not_to_have_attribute("class", re.compile(r"\bdrawer-open\b"))
        assert not errors, errors
    finally:
        ctx.close()


def test_sending_while_offline_is_refused_visibly(page: Page) -> None:
    new_chat(page, temperature=0, max_tokens=2)
    wait_finished(send(page, "What is the capital of France?"))
    # Shift+Enter makes a new line, it does not send.
    box = page.get_by_test_id("composer-input")
    box.type("line one")
    box.press("Shift+Enter")
    box.type("line two")
    expect(box).to_have_value("line one\nline two")
    expect(user_messages(page)).to_have_count(1)
    box.fill("")
    page.context.set_offline(True)
    page.wait_for_function("navigator.onLine === false")
    status = page.get_by_test_id("connection-status")
    expect(status).not_to_have_attribute("data-state", "open", timeout=15_000)
    expect(page.get_by_test_id("composer-offline")).to_be_visible()
    box = page.get_by_test_id("composer-input")
    box.fill("Are you there?")
    box.press("Enter")
    # Not silently dropped: said in words, and the text is kept for later.
    expect(box).to_have_value("Are you there?")
    expect(user_messages(page)).to_have_count(1)
    shot(page, "40-offline")
    page.context.set_offline(False)
    expect(status).to_have_attribute("data-state", "open", timeout=30_000)
    expect(page.get_by_test_id("composer-offline")).to_be_hidden()
    box.press("Enter")
    expect(user_messages(page)).to_have_count(2)
    wait_finished(replies(page).last)


def test_auto_scroll_follows_the_reply_until_the_reader_scrolls_up(page: Page) -> None:
    page.set_viewport_size({"width": 1000, "height": 520})
    new_chat(page, temperature=0, max_tokens=40)
    box = page.get_by_test_id("composer-input")
    box.fill("\n".join(f"Line {i} of a long question." for i in range(30)) + "\nSay hello.")
    box.press("Enter")
    reply = replies(page).last
    expect(reply.get_by_test_id("message-content")).not_to_have_text("", timeout=60_000)
    list_ = page.get_by_test_id("message-list")
    gap = "e => e.scrollHeight - e.scrollTop - e.clientHeight"
    # While the reply streams, the view stays at the bottom.
    page.wait_for_timeout(300)
    assert list_.evaluate(gap) <= 40
    expect(page.get_by_test_id("scroll-bottom")).to_have_count(0)
    # The reader scrolls up: the view stays where they put it, and offers a way back. The
    # page shows the button from the wheel event itself, before the browser has moved (or
    # finished animating) the scroller: the position the view must keep is where the
    # reader's scroll ended (a scroll that ends near the bottom is the page following it).
    list_.evaluate(
        """e => { window.__readerTop = null;
          const ended = () => { if (e.scrollHeight - e.scrollTop - e.clientHeight > 100) {
            window.__readerTop = e.scrollTop; e.removeEventListener('scrollend', ended); } };
          e.addEventListener('scrollend', ended); }"""
    )
    list_.hover()
    page.mouse.wheel(0, -400)
    expect(page.get_by_test_id("scroll-bottom")).to_be_visible()
    page.wait_for_function("() => window.__readerTop !== null")
    top = page.evaluate("() => window.__readerTop")
    assert abs(list_.evaluate("e => e.scrollTop") - top) <= 2
    if reply.get_attribute("data-status") == "streaming":
        page.wait_for_timeout(800)
    assert abs(list_.evaluate("e => e.scrollTop") - top) <= 2
    shot(page, "23-scrolled-up-while-streaming")
    page.get_by_test_id("scroll-bottom").click()
    expect(page.get_by_test_id("scroll-bottom")).to_have_count(0)
    wait_finished(reply)
    page.wait_for_timeout(200)
    assert list_.evaluate(gap) <= 40


def test_a_message_that_is_too_long_is_refused_in_words(page: Page) -> None:
    box = page.get_by_test_id("composer-input")
    box.fill("word " * 6500)  # 32,499 characters once trimmed: over CHAT_MAX_MESSAGE_CHARS
    box.press("Enter")
    error = page.get_by_test_id("chat-error")
    expect(error).to_have_attribute("data-code", "message_too_long")
    expect(error).to_contain_text("too long to send: 32,499 characters, and the limit is 32,000")
    shot(page, "41-too-long")
    expect(page.get_by_test_id("message")).to_have_count(0)
    assert len(box.input_value()) == 32_500  # kept, to be shortened
