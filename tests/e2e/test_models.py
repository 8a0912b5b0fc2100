"""The model picker in the browser (issue 17, item 2): a server serving two models (the
real default model and the tests' tiny one, CHATAPP_MODELS), a picker per conversation in
the chat header, remembered on the conversation, sent with each turn, and the model named
on each reply. A server of its own (the package's serves one model)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, expect

from inference.model_files import MODEL_NAME
from tests.browser import CHROMIUM, CHROMIUM_ARGS, require_browser_and_bundle
from tests.e2e.conftest import DESKTOP, _watch, shot, sign_up, wait_ready
from tests.e2e.helpers import (
    api,
    current_id,
    new_chat,
    replies,
    saved_messages,
    send,
    wait_finished,
)
from tests.e2e.test_accessibility import axe_problems
from tools.live_server import LiveServer

pytestmark = pytest.mark.slow  # a real browser and the real default model

TINY = "tiny"


@pytest.fixture(scope="module")
def two_models(
    tmp_path_factory: pytest.TempPathFactory, real_model_dir: Path, tiny_model_dir: Path
) -> Iterator[LiveServer]:
    require_browser_and_bundle("app.js", "app.css")
    srv = LiveServer(
        tmp_path_factory.mktemp("e2e-two-models"),
        real_model_dir,
        CHATAPP_MODELS=f"{TINY}={tiny_model_dir}",
        ENGINE_KV_CACHE_MEMORY_MB="64",
    ).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def own_browser(playwright_instance: Playwright, two_models: LiveServer) -> Iterator[Browser]:
    b = playwright_instance.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield b
    b.close()


@pytest.fixture
def page(
    own_browser: Browser, two_models: LiveServer, request: pytest.FixtureRequest
) -> Iterator[Page]:
    ctx = own_browser.new_context(viewport=DESKTOP, base_url=two_models.url)
    ctx.set_default_timeout(20_000)
    p = ctx.new_page()
    errors = _watch(p)
    sign_up(p, "m" + re.sub(r"[^A-Za-z0-9]", "", request.node.name)[-20:])
    yield p
    ctx.close()
    assert not errors, errors


def saved_model(page: Page, conversation: int, awaited: str, within_s: float = 10) -> str:
    """The conversation's model as the server has it, once it is `awaited` (or time is up)."""
    deadline = time.monotonic() + within_s
    while True:
        model = api(page, "GET", f"/api/conversations/{conversation}/")["data"]["conversation"]
        if model["model"] == awaited or time.monotonic() > deadline:
            return str(model["model"])
        page.wait_for_timeout(100)


def model_of(reply: object) -> str:
    return reply.get_by_test_id("message-model").inner_text()  # type: ignore[attr-defined]


def test_the_picker_chooses_remembers_and_names_the_model_of_each_reply(page: Page) -> None:
    picker = page.get_by_test_id("model-picker")
    expect(picker).to_have_value(MODEL_NAME)
    assert picker.locator("option").all_inner_texts() == [MODEL_NAME, TINY]
    new_chat(page, temperature=0, max_tokens=8)
    first = send(page, "Hi! Name a color.")
    assert wait_finished(first) == "complete"
    expect(first.get_by_test_id("message-model")).to_have_text(MODEL_NAME)
    conversation = current_id(page)
    picker.select_option(TINY)
    # Remembered on the conversation as soon as it is picked, before any turn.
    assert saved_model(page, conversation, TINY) == TINY
    second = send(page, "And another one?")
    assert wait_finished(second) == "complete"
    expect(second.get_by_test_id("message-model")).to_have_text(TINY)
    assert [m["model"] for m in saved_messages(page, conversation)] == [
        MODEL_NAME, MODEL_NAME, TINY, TINY
    ]  # fmt: skip
    shot(page, "model-picker-two-models")
    assert axe_problems(page) == []

    page.reload()
    wait_ready(page)
    expect(page.get_by_test_id("model-picker")).to_have_value(TINY)
    expect(replies(page)).to_have_count(2)
    assert [model_of(replies(page).nth(i)) for i in range(2)] == [MODEL_NAME, TINY]

    # A new chat starts on the default model; a pick made before its first message is its.
    page.keyboard.press("Control+Shift+O")
    expect(page.get_by_test_id("model-picker")).to_have_value(MODEL_NAME)
    page.get_by_test_id("model-picker").select_option(TINY)
    third = send(page, "Hello")
    assert wait_finished(third) == "complete"
    expect(third.get_by_test_id("message-model")).to_have_text(TINY)
    fresh = current_id(page)
    assert fresh != conversation
    assert saved_model(page, fresh, TINY) == TINY
    page.get_by_test_id("settings-button").click()
    expect(page.get_by_test_id("settings-model")).to_contain_text(f"Model: {TINY}")


def test_on_a_phone_the_picker_fits_the_header_and_is_a_44px_target(page: Page) -> None:
    page.set_viewport_size({"width": 390, "height": 800})
    page.reload()  # laid out for a phone from the start (no drawer sliding away)
    wait_ready(page)
    picker = page.get_by_test_id("model-picker")
    expect(picker).to_be_visible()
    box = picker.bounding_box()
    assert box is not None and box["height"] >= 44 and box["x"] + box["width"] <= 390
    header = page.locator(".chat-head")
    assert header.evaluate("h => h.scrollWidth <= h.clientWidth")
    for testid in ("sidebar-toggle", "settings-button"):
        control = page.get_by_test_id(testid).bounding_box()
        assert control is not None and control["x"] + control["width"] <= 390, testid
    shot(page, "model-picker-phone")


def test_compare_answers_one_message_with_both_models_and_keeps_the_one_picked(
    page: Page,
) -> None:
    """Issue 45, item 15: the compare picker names a second model; the next message is
    answered by both, side by side, and the answer kept is the one the thread goes on from
    (the other stays its alternative)."""
    new_chat(page, temperature=0, max_tokens=8)
    first = send(page, "Hi! Name a color.")
    assert wait_finished(first) == "complete"
    conversation = current_id(page)
    compare = page.get_by_test_id("compare-picker")
    assert compare.locator("option").all_inner_texts() == ["Compare: off", f"Compare with {TINY}"]
    compare.select_option(TINY)
    box = page.get_by_test_id("composer-input")
    box.fill("Another color?")
    box.press("Enter")
    block = page.get_by_test_id("compare")
    columns = block.get_by_test_id("compare-col")
    expect(columns).to_have_count(2)
    expect(columns.nth(0)).to_have_attribute("data-model", MODEL_NAME)
    expect(columns.nth(1)).to_have_attribute("data-model", TINY)
    for i in range(2):
        assert wait_finished(columns.nth(i).get_by_test_id("message")) in ("complete", "stopped")
    expect(compare).to_have_value("")  # a comparison is for one message
    keep = block.get_by_test_id("compare-keep")
    expect(keep.nth(1)).to_be_enabled()
    shot(page, "compare-two-models")
    assert axe_problems(page) == []
    page.set_viewport_size({"width": 390, "height": 844})
    expect(page.get_by_test_id("sidebar")).to_be_hidden()  # the drawer has slid away
    columns.nth(1).scroll_into_view_if_needed()
    shot(page, "compare-two-models-phone")
    page.set_viewport_size(DESKTOP)

    keep.nth(1).click()
    expect(block).to_have_count(0)
    expect(replies(page)).to_have_count(2)
    kept = replies(page).last
    expect(kept.get_by_test_id("message-model")).to_have_text(TINY)
    expect(kept.get_by_test_id("alt-counter")).to_have_text("2/2")
    assert [m["model"] for m in saved_messages(page, conversation)][-1] == TINY
    # The next turn follows the kept answer.
    third = send(page, "And then?")
    assert wait_finished(third) == "complete"
    branch = saved_messages(page, conversation)
    assert [m["role"] for m in branch] == ["user", "assistant"] * 3
    assert branch[3]["model"] == TINY and branch[4]["parent_id"] == branch[3]["id"]
