"""Custom instructions (issue 45, item 8): said once in the account dialog, then every new
chat starts with them as its system prompt, as ChatGPT does."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import shot
from tests.e2e.helpers import api, current_id, send, wait_finished
from tests.e2e.test_accessibility import axe_problems

pytestmark = pytest.mark.slow  # a real browser and the real default model

ABOUT = "I am a baker in Lyon."
STYLE = "Answer in one short sentence."
PROMPT = f"About the user:\n{ABOUT}\n\nHow to answer:\n{STYLE}"


def test_custom_instructions_are_the_system_prompt_of_each_new_chat(page: Page) -> None:
    page.get_by_test_id("account-button").click()
    dialog = page.get_by_test_id("account-dialog")
    section = dialog.get_by_test_id("instructions-section")
    expect(section.get_by_test_id("instructions-about")).to_be_enabled()
    section.get_by_test_id("instructions-about").fill(ABOUT)
    section.get_by_test_id("instructions-style").fill(STYLE)
    section.get_by_test_id("instructions-save").click()
    expect(section.get_by_test_id("instructions-saved")).to_be_visible()
    expect(dialog.get_by_test_id("account-status")).to_contain_text("instructions saved")
    assert axe_problems(page) == []
    shot(page, "45-custom-instructions")
    dialog.get_by_test_id("account-close").click()

    # A new chat's settings show them, and a send without opening them still uses them.
    page.keyboard.press("Control+Shift+O")
    page.get_by_test_id("settings-button").click()
    settings = page.get_by_test_id("settings-dialog")
    expect(settings.get_by_test_id("settings-system-prompt")).to_have_value(PROMPT)
    settings.get_by_test_id("settings-cancel").click()
    wait_finished(send(page, "Hello!"))
    saved = api(page, "GET", f"/api/conversations/{current_id(page)}/")
    assert saved["data"]["conversation"]["settings"]["system_prompt"] == PROMPT

    # Still there after a reload, in the dialog.
    page.reload()
    page.get_by_test_id("account-button").click()
    expect(page.get_by_test_id("instructions-about")).to_have_value(ABOUT)
    expect(page.get_by_test_id("instructions-style")).to_have_value(STYLE)
