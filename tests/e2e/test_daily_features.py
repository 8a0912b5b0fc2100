"""Temporary chats, feedback on replies, export all, saved prompts with the Ctrl+K
palette, and read aloud (issue 45, items 11-14 and 16), each walked whole in Chromium."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import PASSWORD, shot
from tests.e2e.helpers import api, new_chat, replies, seed_reply, send, wait_finished
from tests.e2e.test_accessibility import axe_problems
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow  # a real browser and the real default model

PHONE = {"width": 390, "height": 844}


def to_phone(page: Page) -> None:
    """A phone's viewport, once the sidebar has slid away (a drawer there)."""
    page.set_viewport_size(PHONE)
    expect(page.get_by_test_id("sidebar")).to_be_hidden()


def username(page: Page) -> str:
    return page.get_by_test_id("username").inner_text()


def open_conversation(page: Page, cid: int) -> None:
    page.locator(
        f"[data-testid=conversation-item][data-conversation-id='{cid}'] "
        "[data-testid=conversation-open]"
    ).click()


def test_a_temporary_chat_is_not_kept(page: Page) -> None:
    new_chat(page, temperature=0, max_tokens=8)
    toggle = page.get_by_test_id("temporary-toggle")
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    banner = page.get_by_test_id("temporary-banner")
    expect(banner).to_contain_text("Not saved in your history")
    wait_finished(send(page, "Say hello."))
    expect(page.get_by_test_id("conversation-title")).to_have_text("Temporary chat")
    expect(banner).to_be_visible()
    temp_id = page.evaluate("window.__chat.conversations.currentId.value")
    assert isinstance(temp_id, int)
    # Not in the list, the URL, nor shareable or exportable from the header.
    expect(page.get_by_test_id("conversation-item")).to_have_count(0)
    assert "#/c/" not in page.url
    expect(page.get_by_test_id("share-button")).to_have_count(0)
    expect(page.get_by_test_id("export-md")).to_have_count(0)
    assert api(page, "GET", "/api/conversations/")["data"]["conversations"] == []
    assert not axe_problems(page)
    shot(page, "temporary-chat-desktop")
    to_phone(page)
    expect(banner).to_be_visible()
    shot(page, "temporary-chat-phone")

    # Reloading the tab ends it: the server deletes it when its socket closes.
    page.reload()
    page.wait_for_selector("[data-testid=connection-status][data-state=open]", state="attached")
    expect(page.get_by_test_id("conversation-title")).to_have_text("New chat")
    expect(replies(page)).to_have_count(0)
    for _ in range(50):
        if api(page, "GET", f"/api/conversations/{temp_id}/")["status"] == 404:
            break
        page.wait_for_timeout(100)
    assert api(page, "GET", f"/api/conversations/{temp_id}/")["status"] == 404


def test_feedback_on_a_reply_reaches_the_dashboard(page: Page, server: LiveServer) -> None:
    user = username(page)
    cid = seed_reply(server, user, "Tides", "Why are there tides?", "Because of the **Moon**.")
    page.reload()
    open_conversation(page, cid)
    reply = replies(page).last
    reply.get_by_test_id("feedback-down").click()
    expect(reply.get_by_test_id("feedback-down")).to_have_attribute("aria-pressed", "true")
    form = reply.get_by_test_id("feedback-form")
    expect(form).to_be_visible()
    expect(reply.get_by_test_id("feedback-comment")).to_be_focused()
    assert not axe_problems(page)
    shot(page, "feedback-desktop")
    reply.get_by_test_id("feedback-comment").fill("The Sun matters too.")
    reply.get_by_test_id("feedback-send").click()
    expect(reply.get_by_test_id("feedback-thanks")).to_be_visible()
    to_phone(page)
    shot(page, "feedback-phone")
    page.set_viewport_size({"width": 1280, "height": 800})

    # Kept: after a reload the thumb is still down.
    page.reload()
    open_conversation(page, cid)
    down = replies(page).last.get_by_test_id("feedback-down")
    expect(down).to_have_attribute("aria-pressed", "true")

    # The staff dashboard shows it with its comment; the user alone may not read it.
    assert api(page, "GET", "/api/feedback/")["status"] == 403
    server.python(
        "from django.contrib.auth import get_user_model as g; "
        f"g().objects.filter(username={user!r}).update(is_staff=True)"
    )
    page.goto("/admin/latency/")
    if "/login/" in page.url:
        page.fill("#id_username", user)
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
    row = page.locator("#ld-feedback [data-testid=feedback-recent] tr[data-rating=down]")
    expect(row.first).to_contain_text("The Sun matters too.")
    assert not axe_problems(page)
    export = api(page, "GET", "/api/feedback/export.jsonl")
    assert export["status"] == 200 and "The Sun matters too." in export["text"]


def test_export_all_and_plain_text(page: Page, server: LiveServer) -> None:
    user = username(page)
    cid = seed_reply(server, user, "Bread", "How do I bake bread?", "Flour, water, salt.")
    page.reload()
    open_conversation(page, cid)
    txt = page.get_by_test_id("export-txt")
    with page.expect_download() as one:
        txt.click()
    body = Path(one.value.path()).read_text(encoding="utf-8")
    assert body.startswith("Bread\n") and "Assistant:\nFlour, water, salt." in body

    page.get_by_test_id("account-button").click()
    section = page.get_by_test_id("export-section")
    section.get_by_test_id("export-format").select_option("txt")
    section.get_by_test_id("export-all").click()
    link = section.get_by_test_id("export-download")
    expect(link).to_be_visible(timeout=30_000)
    assert not axe_problems(page)
    shot(page, "export-all-desktop")
    with page.expect_download() as all_of_them:
        link.click()
    with zipfile.ZipFile(io.BytesIO(Path(all_of_them.value.path()).read_bytes())) as zf:
        names = zf.namelist()
        assert names == [f"{cid:05d}-bread.txt"]
        assert "Flour, water, salt." in zf.read(names[0]).decode()


def test_saved_prompts_the_palette_and_shortcuts(page: Page, server: LiveServer) -> None:
    user = username(page)
    lisbon = seed_reply(server, user, "Trip to Lisbon", "Plan a trip.", "Day one: Alfama.")
    page.reload()

    # A prompt saved in the account dialog...
    page.get_by_test_id("account-button").click()
    prompts = page.get_by_test_id("prompts-section")
    prompts.get_by_test_id("prompt-name").fill("tldr")
    prompts.get_by_test_id("prompt-text").fill("Summarize the text below in one line:")
    prompts.get_by_test_id("prompt-save").click()
    expect(prompts.get_by_test_id("prompt-row")).to_have_count(1)
    prompts.get_by_test_id("prompt-name").fill("has space")
    prompts.get_by_test_id("prompt-text").fill("x")
    prompts.get_by_test_id("prompt-save").click()
    expect(prompts.get_by_test_id("prompt-error")).to_contain_text("lowercase letters")
    page.get_by_test_id("account-close").click()

    # ... is offered for `/` in the composer, and Enter puts its text in the box.
    box = page.get_by_test_id("composer-input")
    box.fill("/tl")
    menu = page.get_by_test_id("prompt-menu")
    expect(menu.get_by_test_id("prompt-option")).to_have_count(1)
    assert not axe_problems(page)
    shot(page, "saved-prompt-menu")
    box.press("Enter")
    expect(box).to_have_value("Summarize the text below in one line:")
    expect(menu).to_have_count(0)
    expect(replies(page)).to_have_count(0)  # Enter picked the prompt, it did not send
    box.fill("")

    # Ctrl+K: find a conversation by its title and open it.
    page.keyboard.press("Control+k")
    palette = page.get_by_test_id("palette")
    expect(palette).to_be_visible()
    expect(page.get_by_test_id("palette-input")).to_be_focused()
    page.keyboard.type("lisbon")
    expect(palette.locator(f"[data-command='conv:{lisbon}']")).to_be_visible()
    assert not axe_problems(page)
    shot(page, "palette-desktop")
    page.keyboard.press("Enter")
    expect(palette).to_have_count(0)
    expect(page.get_by_test_id("conversation-title")).to_have_text("Trip to Lisbon")
    # Its messages loaded before the next command: the insert below is not to race the
    # conversation's load.
    expect(page.get_by_text("Day one: Alfama.")).to_be_visible()

    # ... a saved prompt, and a new temporary chat.
    page.keyboard.press("Control+k")
    page.keyboard.type("tldr")
    page.keyboard.press("Enter")
    expect(box).to_have_value("Summarize the text below in one line:")
    box.fill("")
    to_phone(page)
    page.keyboard.press("Control+k")
    page.keyboard.type("temporary")
    shot(page, "palette-phone")
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("temporary-banner")).to_be_visible()
    page.set_viewport_size({"width": 1280, "height": 800})

    # `?` outside a text box shows the shortcuts; typed in the box it is a character.
    box.fill("?")
    expect(page.get_by_test_id("shortcuts-dialog")).to_have_count(0)
    box.fill("")
    page.get_by_test_id("conversation-title").click()
    page.keyboard.press("?")
    dialog = page.get_by_test_id("shortcuts-dialog")
    expect(dialog).to_contain_text("Ctrl+K")
    assert not axe_problems(page)
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)


def test_read_aloud_speaks_the_reply_words(page: Page, server: LiveServer) -> None:
    # The browser's own speechSynthesis, watched: each utterance's text is recorded and
    # passed on to the real speak().
    page.add_init_script(
        """(() => {
          if (!window.speechSynthesis) return;
          window.__spoken = [];
          const speak = window.speechSynthesis.speak.bind(window.speechSynthesis);
          window.speechSynthesis.speak = (u) => { window.__spoken.push(u.text); speak(u); };
        })()"""
    )
    user = username(page)
    cid = seed_reply(
        server,
        user,
        "Sky",
        "Why is the sky blue?",
        "Because of **Rayleigh** scattering.\n\n```python\nprint('blue')\n```",
    )
    page.reload()
    if not page.evaluate("'speechSynthesis' in window"):
        pytest.skip("this Chromium has no speech synthesis")
    open_conversation(page, cid)
    button = replies(page).last.get_by_test_id("message-read-aloud")
    button.click()
    spoken = page.evaluate("window.__spoken")
    assert spoken == ["Because of Rayleigh scattering. (code block)"], spoken
    assert re.search(r"\*|```", spoken[0]) is None
