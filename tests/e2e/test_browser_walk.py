"""Rough edges a browser walk of the chat found (issue 45): the phone header, images in
replies, files dropped on the message list, and the settings' checkboxes on a phone."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Request, expect

from tests.e2e.conftest import _watch, log_in, shot, sign_up
from tests.e2e.helpers import api, seed_reply
from tests.e2e.test_accessibility import axe_problems
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow  # a real browser and the real default model

PHONE_WIDTHS = (320, 360, 390)
HEADER_CONTROLS = (
    "sidebar-toggle",
    "model-picker",
    "export-md",
    "export-json",
    "share-button",
    "settings-button",
)
LONG_TITLE = "Planning a week of vegetarian dinners for four"

# Where a control is, whether it is whole on screen, and whether it is what a tap there hits.
PLACE = """el => {
  const r = el.getBoundingClientRect();
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,
          width: r.width, height: r.height, hit: !!hit && (hit === el || el.contains(hit))};
}"""


def phone(browser: Browser, server: LiveServer, width: int) -> BrowserContext:
    return browser.new_context(
        viewport={"width": width, "height": 740},
        base_url=server.url,
        is_mobile=True,
        has_touch=True,
    )


def overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        min(a["right"], b["right"]) - max(a["left"], b["left"]) > 0.5
        and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 0.5
    )


def test_on_a_phone_every_header_control_is_whole_and_44px_and_the_title_shows(
    browser: Browser, server: LiveServer
) -> None:
    cid = None
    for width in PHONE_WIDTHS:
        ctx = phone(browser, server, width)
        try:
            page = ctx.new_page()
            errors = _watch(page)
            if cid is None:
                sign_up(page, "phoneheader")
                cid = seed_reply(server, "phoneheader", LONG_TITLE, "Plan dinners.", "Monday: dal.")
            else:
                log_in(page, "phoneheader")
            page.goto(f"/#/c/{cid}")
            expect(page.get_by_test_id("conversation-title")).to_have_text(LONG_TITLE)

            places = {}
            for testid in HEADER_CONTROLS:
                control = page.get_by_test_id(testid)
                expect(control).to_be_visible()
                places[testid] = p = control.evaluate(PLACE)
                where = (width, testid, p)
                assert p["left"] >= 0 and p["right"] <= width, where
                assert p["width"] >= 44 and p["height"] >= 44, where
                assert p["hit"], where  # nothing covers it
            for i, a in enumerate(HEADER_CONTROLS):
                for b in HEADER_CONTROLS[i + 1 :]:
                    assert not overlap(places[a], places[b]), (width, a, b)
            header = page.locator(".chat-head")
            assert header.evaluate("h => h.scrollWidth <= h.clientWidth"), width
            assert page.evaluate("document.documentElement.scrollWidth") <= width

            # The title has a row's room, not what the controls leave; cut, it says it whole.
            title = page.get_by_test_id("conversation-title")
            box = title.evaluate(PLACE)
            assert box["width"] >= 0.4 * width and box["right"] <= width, (width, box)
            expect(title).to_have_attribute("title", LONG_TITLE)
            shot(page, f"45-phone-header-{width}")

            # Settings, and the figures toggle inside it, are in reach.
            page.get_by_test_id("settings-button").click()
            dialog = page.get_by_test_id("settings-dialog")
            expect(dialog.get_by_test_id("settings-show-figures")).to_be_visible()
            dialog.get_by_test_id("settings-cancel").click()
            expect(dialog).to_be_hidden()
            assert errors == [], errors
        finally:
            ctx.close()


def test_the_settings_checkboxes_are_24px_with_a_44px_row_to_tap_on_a_phone(
    browser: Browser, server: LiveServer
) -> None:
    ctx = phone(browser, server, 360)
    try:
        page = ctx.new_page()
        errors = _watch(page)
        sign_up(page, "phonechecks")
        page.get_by_test_id("settings-button").click()
        box = page.get_by_test_id("settings-show-figures")
        before = box.is_checked()
        size = box.bounding_box()
        row = page.locator("label.check", has=box).bounding_box()
        assert size and size["width"] >= 24 and size["height"] >= 24, size
        assert row and row["height"] >= 44 and row["width"] >= 200, row
        # A tap on the row's words, away from the box, toggles it.
        page.touchscreen.tap(row["x"] + row["width"] - 20, row["y"] + row["height"] / 2)
        expect(box).to_be_checked(checked=not before)
        shot(page, "45-phone-settings-checkbox")
        assert errors == [], errors
    finally:
        ctx.close()


IMAGES_REPLY = (
    "A chart: ![chart](/x)\n\n"
    '<img src="/share/x"> and a dot <img src="data:image/gif;base64,'
    'R0lGODlhAQABAAAAACH5BAEKAAEALAAAAAABAAEAAAICTAEAOw==">'
)


def test_images_in_a_reply_load_nothing_here_or_shared_and_are_links(
    page: Page, browser: Browser, server: LiveServer
) -> None:
    asked: list[str] = []

    def on_request(request: Request) -> None:
        path = request.url.split("//", 1)[-1].partition("/")[2]
        if path in ("x", "share/x") or request.resource_type == "image":
            asked.append(request.url)

    username = page.get_by_test_id("username").inner_text()
    cid = seed_reply(server, username, "Pictures", "Show me a chart.", IMAGES_REPLY)
    page.on("request", on_request)
    page.goto(f"/#/c/{cid}")
    reply = page.locator("[data-testid=message][data-role=assistant]").get_by_test_id(
        "message-content"
    )
    links = reply.locator("a.remote-image")
    expect(links).to_have_count(2)
    expect(links).to_have_text(["[image: chart]", "[image]"])
    assert [links.nth(i).get_attribute("href") for i in (0, 1)] == ["/x", "/share/x"]
    expect(reply.locator(".image-removed")).to_have_text("[image]")
    expect(reply.locator("img")).to_have_count(0)
    page.wait_for_timeout(300)
    assert asked == []
    assert axe_problems(page) == []
    shot(page, "45-images-as-links")

    share = api(page, "POST", f"/api/conversations/{cid}/share/", {})
    assert share["status"] == 201, share
    visitor = browser.new_context(base_url=server.url)
    try:
        shared = visitor.new_page()
        shared.on("request", on_request)
        shared.goto(share["data"]["share"]["url"])
        expect(shared.locator("[data-testid=shared-page][data-ready=true]")).to_be_attached()
        expect(shared.locator("a.remote-image")).to_have_count(2)
        expect(shared.locator("[data-testid=shared-page] img")).to_have_count(0)
        shared.wait_for_timeout(300)
        assert asked == []
        assert axe_problems(shared) == []
    finally:
        visitor.close()


def test_a_file_dropped_on_the_message_list_is_attached_with_a_drop_zone_shown(
    page: Page,
) -> None:
    dt = page.evaluate_handle(
        """() => {
          const dt = new DataTransfer();
          dt.items.add(new File(['Alpha beta gamma.'], 'notes.txt', {type: 'text/plain'}));
          return dt;
        }"""
    )
    target = page.get_by_test_id("message-list")
    zone = page.get_by_test_id("drop-zone")
    expect(zone).to_have_count(0)
    target.dispatch_event("dragenter", {"dataTransfer": dt})
    target.dispatch_event("dragover", {"dataTransfer": dt})
    expect(zone).to_be_visible()
    expect(zone).to_contain_text("Drop files to attach them")
    shot(page, "45-drop-zone")
    target.dispatch_event("drop", {"dataTransfer": dt})
    expect(zone).to_have_count(0)
    chip = page.get_by_test_id("draft-attachment")
    expect(chip).to_have_count(1)
    expect(chip).to_have_attribute("data-name", "notes.txt")
    expect(chip).to_have_attribute("data-status", "ready")

    # Dragged away without a drop: the zone goes.
    page.get_by_test_id("conversation-title").dispatch_event("dragover", {"dataTransfer": dt})
    expect(zone).to_be_visible()
    page.get_by_test_id("composer-input").dispatch_event(
        "dragleave", {"dataTransfer": dt, "relatedTarget": None}
    )
    expect(zone).to_have_count(0)

    # A file dropped outside the chat (the sidebar) is not opened in place of the page.
    kept = page.evaluate(
        """dt => {
          const e = new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true});
          document.querySelector('[data-testid=sidebar]').dispatchEvent(e);
          return e.defaultPrevented;
        }""",
        dt,
    )
    assert kept
    expect(chip).to_have_count(1)
