"""Issue 17's rough edges in the browser: the settings dialog takes the server's limits
(item 5), Send while offline (item 7), and no page asks for a file that is not there (the
favicon, item 11)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Response, expect

from tests.e2e.conftest import DESKTOP, PASSWORD, _watch, shot
from tests.e2e.helpers import api, replies, wait_finished
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow  # a real browser and the real default model


def test_the_settings_dialog_takes_the_server_limits_and_sends_nothing_out_of_range(
    page: Page,
) -> None:
    limits = api(page, "GET", "/api/chat/limits/")
    assert limits["status"] == 200
    top = limits["data"]["max_tokens"]["max"]
    assert top == 2048  # CHAT_MAX_NEW_TOKENS: the limit a send of 4000 ran into
    page.keyboard.press("Control+Shift+O")
    page.get_by_test_id("settings-button").click()
    dialog = page.get_by_test_id("settings-dialog")
    field = dialog.get_by_test_id("settings-max-tokens")
    expect(dialog.get_by_test_id("settings-max-tokens-range")).to_have_text("(1\u20132,048)")
    expect(field).to_have_attribute("max", str(top))
    expect(field).to_have_value(str(limits["data"]["max_tokens"]["default"]))

    field.fill("4000")
    words = "Max tokens must be between 1 and 2,048."
    expect(dialog.get_by_test_id("settings-max-tokens-error")).to_have_text(words)
    expect(field).to_have_attribute("aria-invalid", "true")
    shot(page, "rough-edges-max-tokens")
    dialog.get_by_test_id("settings-save").click()
    # Not saved: the dialog stays, saying why.
    expect(dialog.get_by_test_id("settings-error")).to_contain_text(words)
    expect(dialog).to_be_visible()
    assert page.evaluate("window.__chat.conversations.draftSettings.value.max_tokens") is None
    field.fill(str(top))
    expect(dialog.get_by_test_id("settings-max-tokens-error")).to_be_hidden()
    dialog.get_by_test_id("settings-save").click()
    expect(dialog).to_be_hidden()
    assert page.evaluate("window.__chat.conversations.draftSettings.value.max_tokens") == top

    # A value the dialog would refuse, set behind its back (a draft from before the
    # limits were known), is left out of the send rather than failing it.
    sent: list[dict[str, Any]] = []
    page.on(
        "websocket",
        lambda ws: ws.on("framesent", lambda f: sent.append(json.loads(f)) if f else None),
    )
    page.reload()
    page.wait_for_selector("[data-testid=connection-status][data-state=open]", state="attached")
    page.evaluate(
        "window.__chat.conversations"
        ".saveSettings(null, {max_tokens: 4000, temperature: 0, top_p: 0})"
    )
    box = page.get_by_test_id("composer-input")
    box.fill("Say hi.")
    box.press("Enter")
    expect(replies(page)).to_have_count(1)
    page.get_by_test_id("stop-button").click()
    wait_finished(replies(page).last)
    expect(page.get_by_test_id("chat-error")).to_have_count(0)
    frame = next(f for f in sent if f.get("type") == "send")
    assert frame["settings"] == {"temperature": 0}


def test_send_is_off_while_offline_and_the_notice_goes_on_reconnect(page: Page) -> None:
    box = page.get_by_test_id("composer-input")
    send_button = page.get_by_test_id("send-button")
    box.fill("Are you there?")
    expect(send_button).to_be_enabled()

    page.context.set_offline(True)
    status = page.get_by_test_id("connection-status")
    expect(status).not_to_have_attribute("data-state", "open", timeout=15_000)
    expect(send_button).to_be_disabled()
    expect(send_button).to_have_attribute("title", re.compile(r"^You are offline: "))
    expect(send_button).to_have_attribute("aria-describedby", "composer-offline")
    box.press("Enter")  # still refused in words, the text kept
    expect(page.get_by_test_id("chat-error")).to_contain_text("You are offline")
    expect(box).to_have_value("Are you there?")
    shot(page, "rough-edges-offline")

    page.context.set_offline(False)
    expect(status).to_have_attribute("data-state", "open", timeout=30_000)
    expect(page.get_by_test_id("chat-error")).to_have_count(0)
    expect(page.get_by_test_id("composer-offline")).to_be_hidden()
    expect(send_button).to_be_enabled()
    expect(box).to_have_value("Are you there?")


def _failures(page: Page) -> list[str]:
    bad: list[str] = []

    def on_response(r: Response) -> None:
        if r.status >= 400:
            bad.append(f"{r.status} {r.url}")

    page.on("response", on_response)
    page.on("requestfailed", lambda r: bad.append(f"failed {r.url}"))
    return bad


def _icon_is_served(page: Page, server: LiveServer) -> None:
    for url in ("/favicon.ico", page.locator("link[rel=icon]").get_attribute("href") or ""):
        r = page.request.get(server.url + url)
        assert r.status == 200, (url, r.status)
        assert r.headers["content-type"].startswith("image/svg+xml"), r.headers
        assert r.body().startswith(b"<svg")


def test_no_page_asks_for_a_missing_file(page: Page, browser: Browser, server: LiveServer) -> None:
    bad = _failures(page)
    for path in ("/", "/settings/keys/"):
        page.goto(path)
        page.wait_for_load_state("networkidle")
    _icon_is_served(page, server)
    assert not bad, bad

    # The latency dashboard (an admin page, which links no icon: /favicon.ico answers).
    server.make_user("roughops", PASSWORD, staff=True)
    ctx = browser.new_context(viewport=DESKTOP, base_url=server.url)
    try:
        staff = ctx.new_page()
        errors = _watch(staff)
        bad = _failures(staff)
        staff.goto("/admin/login/?next=/admin/latency/")
        staff.fill("#id_username", "roughops")
        staff.fill("#id_password", PASSWORD)
        staff.click("input[type=submit]")
        expect(staff.locator("#latency-dashboard[data-ready='1']")).to_be_attached(timeout=20_000)
        staff.wait_for_load_state("networkidle")
        r = staff.request.get(server.url + "/favicon.ico")
        assert r.status == 200 and r.body().startswith(b"<svg")
        shot(staff, "rough-edges-dashboard", full_page=True)
        assert not bad, bad
        assert not errors, errors
    finally:
        ctx.close()
