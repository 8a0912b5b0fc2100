"""End-to-end tests of the browser chat UI (issue 6): Debian's headless Chromium driven
by Playwright against a real server (daphne + the real default model).

One server and one browser for this package (package scope: Playwright's sync API
keeps an event loop running in the main thread, which must be gone before the
asyncio tests elsewhere run); every test gets a fresh browser context
with a user of its own (signed up through the real sign-up form), so tests never see
each other's conversations. Screenshots of the main states go to
test-artifacts/screenshots/ (kept out of git).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

from tests.browser import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS, require_browser_and_bundle
from tests.servers import started
from tools.live_server import LiveServer

PASSWORD = "correct-horse-battery-9"
DESKTOP = {"width": 1280, "height": 800}

# A reply with markdown, a code block and HTML/script that must stay inert. It is stored
# as if the model had written it (a 135M model will not write it on demand).
XSS_USER = (
    'Look: <img src=x onerror="window.__xss=1;alert(1)"> '
    + "<script>window.__xss=2;alert(2)</script>"
)
CODE = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))"
MARKDOWN_REPLY = (
    "## A heading\n\nSome **bold** text, a list:\n\n- one\n- two\n\n"
    "| a | b |\n|---|---|\n| 1 | 2 |\n\n"
    f"```python\n{CODE}\n```\n\n"
    'Inline HTML: <img src=x onerror="window.__xss=3;alert(3)"> '
    "<script>window.__xss=4;alert(4)</script> "
    '<a href="javascript:alert(5)">a js link</a> [md link](javascript:alert(6)) '
    '<iframe src="javascript:alert(7)"></iframe>'
)
# One manage.py call (each costs seconds): the users, and the reader's stored conversation.
SETUP_CODE = (
    "from django.contrib.auth import get_user_model as g; "
    "from chatapp.chat.models import Conversation as C, Message as M; "
    # alice is staff: her replies show their figures by default (tests/e2e/test_chat.py).
    f"g().objects.create_user('alice', password={PASSWORD!r}, is_staff=True); "
    f"r = g().objects.create_user('reader', password={PASSWORD!r}); "
    "c = C.objects.create(owner=r, title='Markdown demo'); "
    f"u = M.objects.create(conversation=c, role='user', text={XSS_USER!r}); "
    f"a = M.objects.create(conversation=c, role='assistant', parent=u, text={MARKDOWN_REPLY!r}, "
    "finish_reason='stop', figures={'ttft_ms': 80.0, 'tokens_per_s': 40.0, 'output_tokens': 60, "
    "'prompt_tokens': 30, 'cached_tokens': 0}); "
    "c.active_leaf = a; c.save()"
)


@pytest.fixture(scope="package")
def server(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    require_browser_and_bundle("app.js", "app.css")
    srv = started(LiveServer(tmp_path_factory.mktemp("e2e-server"), real_model_dir), SETUP_CODE)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="package")
def seeded(server: LiveServer) -> dict:
    """The reader's stored conversation whose reply is MARKDOWN_REPLY (see SETUP_CODE)."""
    cid = server.python(
        "from chatapp.chat.models import Conversation as C; "
        "print(C.objects.get(owner__username='reader', title='Markdown demo').pk)"
    )
    return {"username": "reader", "conversation": int(cid.splitlines()[-1])}


@pytest.fixture(scope="package")
def playwright_instance() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="package")
def browser(playwright_instance: Playwright, server: LiveServer) -> Iterator[Browser]:
    b = playwright_instance.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield b
    b.close()


@pytest.fixture(scope="package", autouse=True)
def _screenshot_dir() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


@pytest.fixture
def context(browser: Browser, server: LiveServer) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport=DESKTOP, base_url=server.url, accept_downloads=True)
    ctx.set_default_timeout(20_000)
    yield ctx
    ctx.close()


def _watch(page: Page) -> list[str]:
    """Collects uncaught exceptions and dialogs (alert/confirm: must never fire)."""
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))

    def on_dialog(d) -> None:
        errors.append(f"dialog: {d.type} {d.message}")
        d.dismiss()

    page.on("dialog", on_dialog)
    return errors


def sign_up(page: Page, username: str) -> None:
    """Create an account through the sign-up form; it logs the new user in."""
    page.goto("/accounts/signup/")
    page.fill("#id_username", username)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.click("[data-testid=signup-submit]")
    wait_ready(page)


def log_in(page: Page, username: str, password: str = PASSWORD) -> None:
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("[data-testid=login-submit]")
    wait_ready(page)


def wait_ready(page: Page) -> None:
    page.wait_for_selector("[data-testid=composer-input]")
    page.wait_for_selector("[data-testid=connection-status][data-state=open]", state="attached")


@pytest.fixture
def page(context: BrowserContext, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page logged in as a fresh user of its own."""
    p = context.new_page()
    p.errors = _watch(p)  # type: ignore[attr-defined]
    name = re.sub(r"[^A-Za-z0-9]", "", request.node.name.removeprefix("test_"))[:24]
    sign_up(p, f"u{name}")
    yield p
    errors = p.errors  # type: ignore[attr-defined]
    assert not errors, errors


def shot(page: Page, name: str, full_page: bool = False) -> None:
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page)
