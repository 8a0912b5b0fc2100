"""JSON mode in a conversation's settings, and the tool calls of an imported ChatGPT
conversation shown as collapsed blocks (issue 44, point 7)."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import shot
from tests.e2e.helpers import api, content, current_id, send, wait_finished

pytestmark = pytest.mark.slow  # a real browser and the real default model


def test_a_chat_in_json_mode_answers_a_json_object_and_keeps_the_setting(page: Page) -> None:
    page.keyboard.press("Control+Shift+O")
    page.get_by_test_id("settings-button").click()
    dialog = page.get_by_test_id("settings-dialog")
    dialog.get_by_test_id("settings-temperature").fill("0")
    dialog.get_by_test_id("settings-max-tokens").fill("200")
    dialog.get_by_test_id("settings-json-mode").check()
    dialog.get_by_test_id("settings-save").click()
    expect(dialog).to_be_hidden()

    reply = send(page, "Give the name and colour of one fruit, as JSON.")
    assert wait_finished(reply) == "complete"
    assert isinstance(json.loads(content(reply)), dict)
    saved = api(page, "GET", f"/api/conversations/{current_id(page)}/")["data"]
    assert saved["conversation"]["settings"]["json_mode"] is True
    assert saved["messages"][-1]["finish_reason"] == "stop"

    page.reload()
    page.get_by_test_id("settings-button").click()
    expect(page.get_by_test_id("settings-json-mode")).to_be_checked()


def chatgpt_with_a_tool_call() -> dict:
    def node(key: str, parent: str | None, message: dict) -> dict:
        return {"id": key, "parent": parent, "children": [], "message": {"id": key, **message}}

    nodes = [
        node("u", None, {"author": {"role": "user"},
                         "content": {"content_type": "text", "parts": ["Weather in Paris?"]}}),
        node("c", "u", {"author": {"role": "assistant"}, "recipient": "weather.get_forecast",
                        "content": {"content_type": "code", "text": '{"city":"Paris"}'}}),
        node("r", "c", {"author": {"role": "tool", "name": "weather.get_forecast"},
                        "content": {"content_type": "text", "parts": ['{"sky":"clear"}']}}),
        node("a", "r", {"author": {"role": "assistant"},
                        "content": {"content_type": "text", "parts": ["It is clear."]}}),
    ]  # fmt: skip
    return {"title": "Tool trip", "mapping": {n["id"]: n for n in nodes}, "current_node": "a"}


def test_an_imported_tool_call_shows_as_a_collapsed_block(page: Page) -> None:
    answer = api(page, "POST", "/api/conversations/import/", chatgpt_with_a_tool_call())
    assert answer["status"] == 201, answer
    page.reload()
    page.get_by_test_id("conversation-open").filter(has_text="Tool trip").click()
    reply = page.locator("[data-testid=message][data-role=assistant]").last
    call = reply.get_by_test_id("tool-call")
    expect(call.locator("summary")).to_have_text("Called tool weather.get_forecast")
    expect(call.locator("pre")).to_be_hidden()  # collapsed until opened
    expect(reply.get_by_test_id("tool-result").locator("summary")).to_have_text(
        "Result from weather.get_forecast"
    )
    expect(reply.get_by_test_id("message-content")).to_contain_text("It is clear.")
    assert "```" not in content(reply)
    call.locator("summary").click()
    expect(call.locator("pre")).to_have_text('{\n  "city": "Paris"\n}')
    shot(page, "44-imported-tool-call")
