"""Conversations and accounts in the browser: sidebar, rename/delete/search, settings,
export, sign-up and privacy between users."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import DESKTOP, _watch, log_in, shot, sign_up
from tests.e2e.helpers import (
    api,
    current_id,
    new_chat,
    saved_messages,
    send,
    user_messages,
    wait_finished,
)

pytestmark = pytest.mark.slow  # a real browser and the real default model


def items(page: Page):
    return page.get_by_test_id("conversation-item")


def item(page: Page, cid: int):
    return page.locator(f"[data-testid=conversation-item][data-conversation-id='{cid}']")


def test_sidebar_lists_conversations_newest_first_and_switches_between_them(page: Page) -> None:
    new_chat(page, temperature=0, max_tokens=2)
    wait_finished(send(page, "What is the capital of France?"))
    first = current_id(page)
    new_chat(page, temperature=0, max_tokens=2)
    wait_finished(send(page, "What color is the sky on a clear day?"))
    second = current_id(page)

    expect(items(page)).to_have_count(2)
    assert items(page).nth(0).get_attribute("data-conversation-id") == str(second)
    assert items(page).nth(1).get_attribute("data-conversation-id") == str(first)
    expect(item(page, second)).to_have_attribute("data-active", "true")

    item(page, first).get_by_test_id("conversation-open").click()
    expect(item(page, first)).to_have_attribute("data-active", "true")
    expect(item(page, second)).to_have_attribute("data-active", "false")
    expect(user_messages(page)).to_have_count(1)
    expect(user_messages(page).first).to_contain_text("capital of France")
    title = item(page, first).get_by_test_id("conversation-open").inner_text()
    expect(page.get_by_test_id("conversation-title")).to_have_text(title)
    assert current_id(page) == first
    shot(page, "10-switched-conversation")

    item(page, second).get_by_test_id("conversation-open").click()
    expect(user_messages(page).first).to_contain_text("color is the sky")
    assert current_id(page) == second
    # The URL keeps the conversation: a refresh comes back to it.
    page.reload()
    expect(user_messages(page).first).to_contain_text("color is the sky")
    expect(item(page, second)).to_have_attribute("data-active", "true")


def test_rename_search_and_delete_a_conversation(page: Page) -> None:
    ids = {}
    for title in ("Trip to Lisbon", "Sourdough recipe", "Tax questions"):
        r = api(page, "POST", "/api/conversations/", {"title": title})
        assert r["status"] == 201, r
        ids[title] = r["data"]["id"] if "id" in r["data"] else r["data"]["conversation"]["id"]
    page.reload()
    expect(items(page)).to_have_count(3)

    # Rename (button, type, Enter): the sidebar and the server agree.
    row = item(page, ids["Sourdough recipe"])
    row.hover()  # the row's tools show on hover (and on keyboard focus)
    row.get_by_test_id("conversation-rename").click()
    row.get_by_test_id("conversation-rename-input").fill("Rye bread recipe")
    row.get_by_test_id("conversation-rename-input").press("Enter")
    expect(row.get_by_test_id("conversation-open")).to_have_text("Rye bread recipe")
    r = api(page, "GET", f"/api/conversations/{ids['Sourdough recipe']}/")
    assert r["data"]["conversation"]["title"] == "Rye bread recipe"
    # Esc cancels a rename.
    row.hover()
    row.get_by_test_id("conversation-rename").click()
    row.get_by_test_id("conversation-rename-input").fill("Something else")
    row.get_by_test_id("conversation-rename-input").press("Escape")
    expect(row.get_by_test_id("conversation-open")).to_have_text("Rye bread recipe")
    page.wait_for_timeout(300)
    r = api(page, "GET", f"/api/conversations/{ids['Sourdough recipe']}/")
    assert r["data"]["conversation"]["title"] == "Rye bread recipe"

    # Search narrows the list; nothing found says so; clearing brings all back.
    search = page.get_by_test_id("conversation-search")
    search.fill("bread")
    expect(items(page)).to_have_count(1)
    expect(items(page).first).to_have_attribute(
        "data-conversation-id", str(ids["Sourdough recipe"])
    )
    shot(page, "11-search")
    search.fill("zebra crossing")
    expect(page.get_by_test_id("conversation-empty")).to_contain_text("No conversation matches")
    search.fill("")
    expect(items(page)).to_have_count(3)

    # Delete asks first; Cancel keeps it, Delete removes it (also on the server).
    row = item(page, ids["Tax questions"])
    row.hover()
    row.get_by_test_id("conversation-delete").click()
    expect(row.get_by_test_id("conversation-delete-prompt")).to_contain_text("Tax questions")
    shot(page, "12-delete-confirmation")
    row.get_by_test_id("conversation-delete-cancel").click()
    expect(items(page)).to_have_count(3)
    row.hover()
    row.get_by_test_id("conversation-delete").click()
    row.get_by_test_id("conversation-delete-confirm").click()
    expect(items(page)).to_have_count(2)
    assert api(page, "GET", f"/api/conversations/{ids['Tax questions']}/")["status"] == 404
    page.reload()
    expect(items(page)).to_have_count(2)


def test_settings_dialog_changes_this_conversations_settings(page: Page) -> None:
    new_chat(page, temperature=0, max_tokens=2)
    wait_finished(send(page, "What is the capital of France?"))
    cid = current_id(page)

    page.get_by_test_id("settings-button").click()
    dialog = page.get_by_test_id("settings-dialog")
    expect(dialog.get_by_test_id("settings-temperature")).to_have_value("0")
    expect(dialog.get_by_test_id("settings-max-tokens")).to_have_value("2")
    # An out-of-range value is refused in words.
    dialog.get_by_test_id("settings-temperature").fill("5")
    dialog.get_by_test_id("settings-save").click()
    expect(dialog.get_by_test_id("settings-error")).to_contain_text("Temperature")
    dialog.get_by_test_id("settings-system-prompt").fill("You are a terse assistant.")
    dialog.get_by_test_id("settings-temperature").fill("0.3")
    dialog.get_by_test_id("settings-top-p").fill("0.9")
    dialog.get_by_test_id("settings-max-tokens").fill("3")
    shot(page, "13-settings-dialog")
    dialog.get_by_test_id("settings-save").click()
    expect(dialog).to_be_hidden()

    settings = api(page, "GET", f"/api/conversations/{cid}/")["data"]["conversation"]["settings"]
    assert settings == {
        "system_prompt": "You are a terse assistant.",
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 3,
        "json_mode": False,
    }
    # The next reply obeys them: at most 3 tokens, then the length note.
    reply = send(page, "Tell me a long story about the sea.")
    wait_finished(reply)
    expect(reply.get_by_test_id("message-note")).to_contain_text("length limit")
    assert saved_messages(page, cid)[-1]["figures"]["output_tokens"] == 3
    # Kept after a reload; Esc closes the dialog.
    page.reload()
    page.get_by_test_id("settings-button").click()
    expect(page.get_by_test_id("settings-system-prompt")).to_have_value(
        "You are a terse assistant."
    )
    expect(page.get_by_test_id("settings-max-tokens")).to_have_value("3")
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("settings-dialog")).to_be_hidden()


def test_export_links_download_markdown_and_json(page: Page) -> None:
    new_chat(page, temperature=0, max_tokens=4)
    reply = send(page, "What is the capital of France?")
    wait_finished(reply)
    answer = saved_messages(page, current_id(page))[-1]["text"]

    with page.expect_download() as d:
        page.get_by_test_id("export-md").click()
    md = d.value
    assert md.suggested_filename.endswith(".md")
    text = md.path().read_text(encoding="utf-8")
    assert "What is the capital of France?" in text and answer.strip()[:20] in text

    with page.expect_download() as d:
        page.get_by_test_id("export-json").click()
    js = d.value
    assert js.suggested_filename.endswith(".json")
    data = json.loads(js.path().read_text(encoding="utf-8"))
    dumped = json.dumps(data)
    assert "What is the capital of France?" in dumped and json.dumps(answer)[1:21] in dumped


def test_sign_up_works_and_users_only_see_their_own_conversations(browser: Browser, server) -> None:
    alice_ctx = browser.new_context(viewport=DESKTOP, base_url=server.url)
    bob_ctx = browser.new_context(viewport=DESKTOP, base_url=server.url)
    try:
        alice = alice_ctx.new_page()
        log_in(alice, "alice")
        r = api(alice, "POST", "/api/conversations/", {"title": "Alice's secret plans"})
        secret = r["data"]["id"] if "id" in r["data"] else r["data"]["conversation"]["id"]

        bob = bob_ctx.new_page()
        errors = _watch(bob)
        bob.goto("/accounts/login/")
        bob.get_by_role("link", name=re.compile("Create an account")).click()
        expect(bob).to_have_url(re.compile(r"/accounts/signup/$"))
        shot(bob, "14-signup")
        sign_up(bob, "bob")
        expect(bob.get_by_test_id("username")).to_have_text("bob")
        expect(bob.get_by_test_id("conversation-empty")).to_be_visible()
        bob.get_by_test_id("conversation-search").fill("secret")
        expect(bob.get_by_test_id("conversation-empty")).to_contain_text("No conversation matches")
        assert api(bob, "GET", f"/api/conversations/{secret}/")["status"] == 404
        # Opening Alice's conversation by URL shows nothing of it.
        bob.goto(f"/#/c/{secret}")
        bob.wait_for_timeout(1000)
        expect(bob.get_by_text("Alice's secret plans")).to_have_count(0)
        expect(bob.get_by_test_id("message")).to_have_count(0)
        # Log out returns to the login page.
        bob.get_by_test_id("logout-button").click()
        expect(bob).to_have_url(re.compile(r"/accounts/login/"))
        bob.goto("/")
        expect(bob).to_have_url(re.compile(r"/accounts/login/"))
        assert not errors, errors
    finally:
        alice_ctx.close()
        bob_ctx.close()
