"""What a reply shows (issue 17, items 8 and 9): the developer figures behind a remembered
setting, math typeset by KaTeX with its own fonts and no inline style (the page's CSP
allows none), task-list checkboxes, and links whose unsafe address was removed shown as
plain text; hostile input inside math stays inert."""

from __future__ import annotations

import pytest
from playwright.sync_api import ConsoleMessage, Page, Response, expect

from tests.e2e.conftest import shot
from tests.e2e.helpers import new_chat, replies, seed_reply, send, wait_finished
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow  # a real browser and the real default model

MATH_REPLY = r"""## Math, tasks and links

Euler's identity is $e^{i\pi} + 1 = 0$, while the pen costs $5 and the book $10.

$$
\int_0^1 x^2\,dx = \frac{1}{3}
$$

- [x] write the proof
- [ ] check it

A [removed link](javascript:alert(1)) and a [good link](https://example.com/).

Hostile: $\href{javascript:alert(2)}{click me}$, $\htmlStyle{background:url(/x)}{y}$,
$\text{<img src=x onerror="window.__xss=3">}$ and
<span data-math-style="position:fixed;inset:0;background:red">a cover</span>.
"""


def test_figures_are_off_for_a_new_user_until_turned_on_and_stay_on(page: Page) -> None:
    new_chat(page, temperature=0, max_tokens=4)
    reply = send(page, "What is the capital of France?")
    wait_finished(reply)
    expect(reply.get_by_test_id("message-content")).not_to_be_empty()
    expect(reply.get_by_test_id("message-figures")).to_have_count(0)

    page.get_by_test_id("settings-button").click()
    dialog = page.get_by_test_id("settings-dialog")
    toggle = dialog.get_by_test_id("settings-show-figures")
    expect(toggle).not_to_be_checked()
    toggle.check()
    shot(page, "50-figures-setting")
    dialog.get_by_test_id("settings-save").click()
    expect(dialog).to_be_hidden()
    figures = reply.get_by_test_id("message-figures")
    expect(figures).to_have_attribute("data-ready", "true")
    for figure in ("ttft", "rate", "tokens", "cached"):
        expect(figures.locator(f"[data-figure={figure}]")).to_be_visible()
    shot(page, "51-figures-on")

    # Remembered in this browser: still on after a reload, and the box says so.
    page.reload()
    expect(replies(page).last.get_by_test_id("message-figures")).to_have_attribute(
        "data-ready", "true"
    )
    assert page.evaluate("localStorage.getItem('chat.figures')") == "on"
    page.get_by_test_id("settings-button").click()
    expect(page.get_by_test_id("settings-show-figures")).to_be_checked()
    page.get_by_test_id("settings-show-figures").uncheck()
    page.get_by_test_id("settings-save").click()
    expect(replies(page).last.get_by_test_id("message-figures")).to_have_count(0)


def test_math_tasks_and_removed_links_render_and_hostile_math_stays_inert(
    page: Page, server: LiveServer
) -> None:
    csp: list[str] = []
    fonts: list[Response] = []

    def on_console(m: ConsoleMessage) -> None:
        if "Content Security Policy" in m.text or "Content-Security-Policy" in m.text:
            csp.append(m.text)

    page.on("console", on_console)
    page.on("response", lambda r: fonts.append(r) if "/KaTeX_" in r.url else None)
    username = page.get_by_test_id("username").inner_text()
    cid = seed_reply(server, username, "Math demo", "Show me some math.", MATH_REPLY)
    page.goto(f"/#/c/{cid}")
    page.reload()
    md = replies(page).last.get_by_test_id("message-content")

    # Math: inline and display, typeset with KaTeX's own fonts from this server.
    expect(md.locator(".katex").first).to_be_visible()
    tex = md.locator("annotation").evaluate_all("els => els.map(e => e.textContent)")
    assert tex[:2] == ["e^{i\\pi} + 1 = 0", "\\int_0^1 x^2\\,dx = \\frac{1}{3}"], tex
    expect(md.locator(".math-display .katex-display")).to_have_count(1)
    page.evaluate("document.fonts.ready")
    assert page.evaluate("document.fonts.check('16px KaTeX_Main')")
    assert fonts, "no KaTeX font was loaded"
    assert all(r.status == 200 and r.url.startswith(server.url + "/static/") for r in fonts)
    # Laid out (KaTeX's boxes get their sizes through the CSSOM, not style attributes):
    # the fraction stands taller than a line of text.
    display_height = md.locator(".math-display").bounding_box()["height"]
    line_height = md.locator("p").first.evaluate("e => parseFloat(getComputedStyle(e).lineHeight)")
    assert display_height > 1.5 * line_height, (display_height, line_height)
    # Prices stay text.
    expect(md.locator("p").first).to_contain_text("costs $5 and the book $10")

    # Task list: checkboxes shown, ticked as written, never editable.
    boxes = md.locator("input[type=checkbox]")
    expect(boxes).to_have_count(2)
    expect(boxes.nth(0)).to_be_checked()
    expect(boxes.nth(1)).not_to_be_checked()
    for i in range(2):
        expect(boxes.nth(i)).to_be_disabled()
    boxes.nth(1).click(force=True)
    expect(boxes.nth(1)).not_to_be_checked()

    # A link stripped of its javascript: address is plain text; a good one stays a link.
    removed = md.locator(".link-removed", has_text="removed link")
    expect(removed).to_have_count(1)
    assert removed.evaluate("e => e.closest('a')") is None
    colour = "e => getComputedStyle(e).color"
    assert removed.evaluate(colour) == md.locator("p").nth(1).evaluate(colour)
    assert removed.evaluate("e => getComputedStyle(e).cursor") != "pointer"
    expect(md.locator("a", has_text="good link")).to_have_attribute("href", "https://example.com/")

    # Hostile input inside math: refused, shown in place, nothing runs or loads or covers.
    expect(md.locator(".katex-error, [mathcolor]").first).to_be_attached()
    found = md.evaluate(
        """e => ({
          links: [...e.querySelectorAll('a')].map(a => a.getAttribute('href')),
          images: e.querySelectorAll('img, image').length,
          handlers: [...e.querySelectorAll('*')].filter(n =>
            [...n.attributes].some(a => a.name.startsWith('on'))).length,
          fixed: [...e.querySelectorAll('*')].filter(n =>
            getComputedStyle(n).position === 'fixed').length,
          xss: window.__xss ?? null,
        })"""
    )
    assert found == {
        "links": ["https://example.com/"],
        "images": 0,
        "handlers": 0,
        "fixed": 0,
        "xss": None,
    }, found
    assert not csp, "\n".join(csp)
    shot(page, "52-math-tasks-links", full_page=True)
