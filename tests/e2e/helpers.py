"""Small steps a person takes in the chat UI, shared by the end-to-end tests."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import Locator, Page, expect

from tools.live_server import LiveServer

FINISHED = re.compile(r"^(complete|stopped|error)$")


def api(page: Page, method: str, path: str, body: Any = None) -> dict[str, Any]:
    """Call the HTTP API from inside the page (its session cookie and CSRF token)."""
    return page.evaluate(
        """async ([method, path, body]) => {
          const m = document.cookie.match(/csrftoken=([^;]+)/);
          const r = await fetch(path, {
            method, credentials: 'same-origin',
            headers: {'Content-Type': 'application/json', 'X-CSRFToken': m ? m[1] : ''},
            body: body == null ? undefined : JSON.stringify(body),
          });
          const text = await r.text();
          let data = null;
          try { data = JSON.parse(text); } catch (e) {}
          return {status: r.status, data, text};
        }""",
        [method, path, body],
    )


def new_chat(
    page: Page,
    *,
    temperature: float | None = 0,
    max_tokens: int | None = None,
    system: str | None = None,
) -> None:
    """Start a new chat (Ctrl+Shift+O) and set its settings in the settings dialog."""
    page.keyboard.press("Control+Shift+O")
    expect(page.get_by_test_id("conversation-title")).to_have_text("New chat")
    if temperature is None and max_tokens is None and system is None:
        return
    page.get_by_test_id("settings-button").click()
    dialog = page.get_by_test_id("settings-dialog")
    expect(dialog).to_be_visible()
    if system is not None:
        dialog.get_by_test_id("settings-system-prompt").fill(system)
    if temperature is not None:
        dialog.get_by_test_id("settings-temperature").fill(str(temperature))
    if max_tokens is not None:
        dialog.get_by_test_id("settings-max-tokens").fill(str(max_tokens))
    dialog.get_by_test_id("settings-save").click()
    expect(dialog).to_be_hidden()


def replies(page: Page) -> Locator:
    return page.locator("[data-testid=message][data-role=assistant]")


def user_messages(page: Page) -> Locator:
    return page.locator("[data-testid=message][data-role=user]")


def send(page: Page, text: str) -> Locator:
    """Type a message and press Enter; returns the (last) reply."""
    before = replies(page).count()
    box = page.get_by_test_id("composer-input")
    box.fill(text)
    box.press("Enter")
    expect(replies(page)).to_have_count(before + 1)
    return replies(page).last


def wait_finished(reply: Locator, timeout: float = 90_000) -> str:
    expect(reply).to_have_attribute("data-status", FINISHED, timeout=timeout)
    return reply.get_attribute("data-status") or ""


def content(reply: Locator) -> str:
    return reply.get_by_test_id("message-content").inner_text()


def current_id(page: Page) -> int:
    m = re.search(r"#/c/(\d+)$", page.url)
    assert m, page.url
    return int(m.group(1))


def saved_messages(page: Page, conversation_id: int) -> list[dict[str, Any]]:
    r = api(page, "GET", f"/api/conversations/{conversation_id}/")
    assert r["status"] == 200, r
    return r["data"]["messages"]


def seed_reply(server: LiveServer, username: str, title: str, question: str, reply: str) -> int:
    """A conversation of `username` whose reply is `reply`, stored as if the model had
    written it (a 135M model will not write markdown, math or hostile input on demand)."""
    out = server.python(
        "from django.contrib.auth import get_user_model as g; "
        "from chatapp.chat.models import Conversation as C, Message as M; "
        f"c = C.objects.create(owner=g().objects.get(username={username!r}), title={title!r}); "
        f"u = M.objects.create(conversation=c, role='user', text={question!r}); "
        f"a = M.objects.create(conversation=c, role='assistant', parent=u, text={reply!r}, "
        "finish_reason='stop', figures={'ttft_ms': 80.0, 'tokens_per_s': 40.0, "
        "'output_tokens': 60, 'prompt_tokens': 30, 'cached_tokens': 12}); "
        "c.active_leaf = a; c.save(); print(c.pk)"
    )
    return int(out.splitlines()[-1])
