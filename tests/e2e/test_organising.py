"""Organising conversations (issue 45, item 10): pin, folders and archive from the
sidebar, so two chats titled alike are told apart by where they sit."""

from __future__ import annotations

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.e2e.conftest import shot
from tests.e2e.helpers import seed_reply
from tests.e2e.test_accessibility import axe_problems
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow  # a real browser and the real default model


def item(page: Page, cid: int) -> Locator:
    return page.locator(f"[data-testid=conversation-item][data-conversation-id='{cid}']").first


LIST = "[data-testid=conversation-list] > section:not([data-testid=archived-list])"


def in_group(page: Page, label: str) -> Locator:
    """The items of the sidebar group headed `label`."""
    head = page.locator("h3.conv-group", has_text=label)
    return page.locator(LIST).filter(has=head).get_by_test_id("conversation-item")


def ids(items: Locator) -> list[str]:
    return [items.nth(i).get_attribute("data-conversation-id") or "" for i in range(items.count())]


def organise(page: Page, cid: int) -> Locator:
    item(page, cid).hover()
    item(page, cid).get_by_test_id("conversation-more").click()
    return item(page, cid).get_by_test_id("conversation-organise")


def test_pin_folder_and_archive_from_the_sidebar(page: Page, server: LiveServer) -> None:
    user = page.get_by_test_id("username").inner_text()
    first, second, third = (
        seed_reply(server, user, "Trip plan", "Plan a trip.", "Day one.") for _ in range(3)
    )
    page.reload()
    expect(page.get_by_test_id("conversation-item")).to_have_count(3)

    organise(page, first).get_by_test_id("conversation-pin").click()
    expect(in_group(page, "Pinned")).to_have_count(1)
    expect(item(page, first).get_by_test_id("conversation-open")).to_contain_text("Pinned")

    panel = organise(page, second)
    panel.get_by_test_id("conversation-folder").click()
    panel.get_by_test_id("conversation-folder-input").fill("Travel")
    panel.get_by_test_id("conversation-folder-input").press("Enter")
    expect(in_group(page, "Folder: Travel")).to_have_count(1)
    assert ids(in_group(page, "Pinned")) == [str(first)]
    assert ids(in_group(page, "Folder: Travel")) == [str(second)]
    assert ids(in_group(page, "Today")) == [str(third)]
    shot(page, "45-organised-sidebar")
    assert axe_problems(page) == []

    organise(page, third).get_by_test_id("conversation-archive").click()
    expect(in_group(page, "Today")).to_have_count(0)
    page.get_by_test_id("show-archived").click()
    archived = page.get_by_test_id("archived-list").get_by_test_id("conversation-item")
    expect(archived).to_have_count(1)
    assert ids(archived) == [str(third)]

    # All of it is kept: after a reload, the same places.
    page.reload()
    expect(in_group(page, "Folder: Travel")).to_have_count(1)
    assert ids(in_group(page, "Pinned")) == [str(first)]
    page.get_by_test_id("show-archived").click()
    organise(page, third).get_by_test_id("conversation-archive").click()  # unarchive
    expect(in_group(page, "Today")).to_have_count(1)
    assert ids(in_group(page, "Today")) == [str(third)]
