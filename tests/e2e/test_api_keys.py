"""API keys (issue 17, item 6) in the browser: made, copied once, listed with their last
use and revoked (asked first) in the chat's account dialog, refused past the cap with the
reason; the server page redirects after making a key, so a reload makes no second one."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import _watch, shot, sign_up
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow  # a real browser and the real default model


def models_answer(server: LiveServer, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(server.url + "/v1/models", headers=headers, timeout=30).status_code


def test_keys_are_made_copied_once_listed_and_revoked_in_the_app(
    page: Page, server: LiveServer
) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.get_by_test_id("account-button").click()
    dialog = page.get_by_test_id("account-dialog")
    expect(dialog).to_be_focused()
    expect(dialog.get_by_test_id("keys-empty")).to_be_visible()
    expect(dialog.get_by_test_id("keys-count")).to_contain_text("0 of at most 20 keys")

    dialog.get_by_test_id("key-create").click()  # no name yet
    expect(dialog.get_by_test_id("key-error")).to_contain_text("Give the key a name")
    expect(dialog.get_by_test_id("key-name")).to_be_focused()
    dialog.get_by_test_id("key-name").fill("laptop script")
    dialog.get_by_test_id("key-name").press("Enter")
    secret = dialog.get_by_test_id("new-key-value").inner_text()
    assert re.fullmatch(r"sk-chat-[\w-]{43}", secret), secret
    expect(dialog.get_by_test_id("key-error")).to_be_hidden()
    dialog.get_by_test_id("new-key-copy").click()
    expect(dialog.get_by_test_id("new-key-copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    rows = dialog.get_by_test_id("key-row")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("laptop script")
    expect(rows.first).to_contain_text(secret[:14] + "…")
    expect(rows.first.get_by_test_id("key-last-used")).to_have_text("never")
    shot(page, "80-account-new-key")

    assert models_answer(server, secret) == 200
    # Closed and opened again: the key itself is gone from the page, its use is listed.
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(page.get_by_test_id("account-button")).to_be_focused()
    page.get_by_test_id("account-button").click()
    expect(rows).to_have_count(1)
    expect(dialog.get_by_test_id("new-key")).to_have_count(0)
    assert secret not in page.content()
    expect(rows.first.get_by_test_id("key-last-used")).not_to_have_text("never")
    shot(page, "81-account-keys")

    # Revoking asks first; Cancel keeps the key, Revoke ends it.
    rows.first.get_by_test_id("key-revoke").click()
    expect(rows.first.get_by_test_id("key-revoke-cancel")).to_be_focused()
    expect(rows.first.get_by_test_id("key-revoke-prompt")).to_contain_text("Programs using it")
    shot(page, "82-account-key-revoke-prompt")
    rows.first.get_by_test_id("key-revoke-cancel").click()
    expect(rows).to_have_count(1)
    assert models_answer(server, secret) == 200
    rows.first.get_by_test_id("key-revoke").click()
    rows.first.get_by_test_id("key-revoke-confirm").click()
    expect(dialog.get_by_test_id("keys-empty")).to_be_visible()
    expect(dialog.get_by_test_id("account-status")).to_have_text("Key “laptop script” revoked.")
    assert models_answer(server, secret) == 401


def test_past_the_cap_the_app_says_why_no_key_was_made(page: Page, server: LiveServer) -> None:
    username = page.get_by_test_id("username").inner_text()
    server.python(
        "from django.contrib.auth import get_user_model as g; "
        "from chatapp.openai_api.keys import create_key; "
        f"u = g().objects.get(username={username!r}); "
        "[create_key(u, f'key {i}') for i in range(20)]"
    )
    page.get_by_test_id("account-button").click()
    dialog = page.get_by_test_id("account-dialog")
    expect(dialog.get_by_test_id("key-row")).to_have_count(20)
    dialog.get_by_test_id("key-name").fill("one more")
    dialog.get_by_test_id("key-create").click()
    error = dialog.get_by_test_id("key-error")
    expect(error).to_contain_text("You already have 20 API keys")
    expect(error).to_contain_text("Revoke one you no longer use")
    expect(dialog.get_by_test_id("new-key")).to_have_count(0)
    expect(dialog.get_by_test_id("key-row")).to_have_count(20)
    shot(page, "83-account-key-cap")


def test_the_keys_page_shows_a_new_key_once_and_a_reload_makes_no_second(page: Page) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto("/settings/keys/")
    page.fill("#key-name", "cron job")
    page.get_by_test_id("create-key").click()
    expect(page.get_by_test_id("new-key")).to_be_visible()
    assert page.url.endswith("/settings/keys/")
    secret = page.get_by_test_id("new-key-value").inner_text()
    assert secret.startswith("sk-chat-")
    copy = page.get_by_test_id("copy-key")
    expect(copy).to_be_visible()
    copy.click()
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    shot(page, "84-keys-page-new-key")

    page.reload()  # the page after the redirect: a GET, nothing posted again
    expect(page.get_by_test_id("new-key")).to_have_count(0)
    expect(page.locator("table.keys tbody tr")).to_have_count(1)
    assert secret not in page.content()


def test_the_account_dialog_fits_a_phone_with_44px_targets(
    browser: Browser, server: LiveServer
) -> None:
    ctx = browser.new_context(
        viewport={"width": 390, "height": 844}, base_url=server.url, is_mobile=True, has_touch=True
    )
    try:
        page = ctx.new_page()
        errors = _watch(page)
        sign_up(page, "phonekeys")
        server.make_key("phonekeys")
        page.get_by_test_id("sidebar-toggle").click()
        page.get_by_test_id("account-button").click()
        dialog = page.get_by_test_id("account-dialog")
        expect(dialog.get_by_test_id("key-row")).to_have_count(1)
        dialog.get_by_test_id("key-name").fill("phone")
        dialog.get_by_test_id("key-create").click()
        expect(dialog.get_by_test_id("new-key")).to_be_visible()
        small = page.evaluate(
            """() => [...document.querySelectorAll(
                 '[data-testid=account-dialog] button, [data-testid=account-dialog] input')]
               .map(e => [e.dataset.testid || e.tagName, e.getBoundingClientRect()])
               .filter(([, r]) => r.width && Math.round(Math.min(r.width, r.height)) < 44)
               .map(([id, r]) => `${id} ${Math.round(r.width)}x${Math.round(r.height)}`)"""
        )
        assert small == []
        box = dialog.bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
        shot(page, "85-phone-account-dialog")
        assert not errors, errors
    finally:
        ctx.close()
