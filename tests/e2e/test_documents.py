"""Documents in the conversation and imports, in the browser (issue 17, items 1 and 4):
attach by the button, by dropping and by pasting; the token count before sending and the
warning past the context window; the chip on the sent message and its text; importing a
ChatGPT export, and a broken file refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.chat.documents import PNG, pdf_with_text
from tests.e2e.conftest import shot
from tests.e2e.helpers import api, new_chat, replies, user_messages, wait_finished

pytestmark = pytest.mark.slow  # a real browser and the real default model

NOTES = "# Launch plan\n\nThe launch moves to Friday.\nBob owns the slides.\n"


def chips(page: Page) -> Any:
    return page.get_by_test_id("draft-attachment")


def drop_or_paste(page: Page, kind: str, name: str, text: str) -> None:
    """Drop a file onto the composer, or paste it into the message box, as a browser does."""
    dt = page.evaluate_handle(
        """([name, text]) => {
          const dt = new DataTransfer();
          dt.items.add(new File([text], name, {type: 'text/plain'}));
          return dt;
        }""",
        [name, text],
    )
    if kind == "drop":
        composer = page.get_by_test_id("composer")
        composer.dispatch_event("dragenter", {"dataTransfer": dt})
        composer.dispatch_event("dragover", {"dataTransfer": dt})
        expect(composer).to_have_attribute("data-dragging", "true")
        composer.dispatch_event("drop", {"dataTransfer": dt})
    else:
        page.get_by_test_id("composer-input").evaluate(
            "(el, dt) => el.dispatchEvent(new ClipboardEvent('paste', "
            "{clipboardData: dt, bubbles: true, cancelable: true}))",
            dt,
        )


def test_a_document_attached_by_the_button_is_counted_sent_and_shown_as_a_chip(
    page: Page, tmp_path: Path
) -> None:
    new_chat(page, max_tokens=16)
    notes = tmp_path / "plan.md"
    notes.write_text(NOTES)
    report = tmp_path / "report.pdf"
    report.write_bytes(pdf_with_text("Quarterly report. Revenue grew by nine percent."))
    page.get_by_test_id("attach-input").set_input_files([str(notes), str(report)])
    expect(chips(page)).to_have_count(2)
    expect(chips(page).nth(0)).to_have_attribute("data-status", "ready")
    expect(chips(page).nth(1)).to_have_attribute("data-status", "ready")
    expect(chips(page).nth(0)).to_contain_text("plan.md")
    expect(chips(page).nth(0).get_by_test_id("draft-attachment-facts")).to_contain_text(
        f"{len(NOTES)} bytes"
    )
    expect(chips(page).nth(0).get_by_test_id("draft-attachment-facts")).to_contain_text("tokens")

    box = page.get_by_test_id("composer-input")
    box.fill("When is the launch?")
    count = page.get_by_test_id("prompt-count")
    expect(count).to_have_attribute("data-pending", "false")
    expect(count).to_have_attribute("data-fits", "true")
    tokens = int(page.get_by_test_id("prompt-tokens").get_attribute("data-tokens") or 0)
    asked = api(
        page,
        "POST",
        "/api/chat/prompt-size/",
        {
            "conversation_id": None,
            "text": "When is the launch?",
            "attachments": page.evaluate("window.__chat.attachments.ready('new').map((a) => a.id)"),
        },
    )
    assert tokens == asked["data"]["prompt_tokens"] > 40
    expect(page.get_by_test_id("prompt-tokens")).to_contain_text("(the model reads at most 8,192)")
    shot(page, "documents-composer-with-attachments")

    box.press("Enter")
    expect(replies(page)).to_have_count(1)
    wait_finished(replies(page).last)
    expect(chips(page)).to_have_count(0)
    expect(page.get_by_test_id("prompt-count")).to_have_count(0)
    sent = user_messages(page).last
    expect(sent.get_by_test_id("attachment-chip")).to_have_count(2)
    chip = sent.get_by_test_id("attachment-chip").first
    expect(chip).to_contain_text("plan.md")
    expect(chip).to_contain_text("tokens")
    chip.click()
    expect(sent.get_by_test_id("attachment-text")).to_contain_text("Bob owns the slides.")
    sent.get_by_test_id("attachment-chip").nth(1).click()
    expect(sent.get_by_test_id("attachment-text")).to_contain_text("Revenue grew by nine percent.")
    shot(page, "documents-message-chip-opened")

    # The chips come back with the conversation after a reload.
    page.reload()
    expect(user_messages(page).last.get_by_test_id("attachment-chip")).to_have_count(2)


def test_a_dropped_file_is_attached(page: Page) -> None:
    attached_and_sent_alone(page, "drop")


def test_a_pasted_file_is_attached(page: Page) -> None:
    attached_and_sent_alone(page, "paste")


def attached_and_sent_alone(page: Page, kind: str) -> None:
    new_chat(page, max_tokens=8)
    drop_or_paste(page, kind, f"{kind}.txt", "Alpha beta gamma.")
    expect(chips(page)).to_have_count(1)
    expect(chips(page).first).to_have_attribute("data-status", "ready")
    expect(chips(page).first).to_have_attribute("data-name", f"{kind}.txt")
    expect(page.get_by_test_id("composer")).to_have_attribute("data-dragging", "false")
    if kind == "drop":
        shot(page, "documents-dropped")
    # Sent with no words of its own: the document is the message.
    page.get_by_test_id("send-button").click()
    expect(replies(page)).to_have_count(1)
    expect(user_messages(page).last.get_by_test_id("attachment-chip")).to_contain_text(
        f"{kind}.txt"
    )
    expect(page.get_by_test_id("conversation-title")).to_have_text(f"{kind}.txt")
    wait_finished(replies(page).last)


def test_files_that_cannot_be_read_are_refused_on_their_chip(page: Page, tmp_path: Path) -> None:
    new_chat(page)
    image = tmp_path / "photo.png"
    image.write_bytes(PNG)
    odd = tmp_path / "letter.docx"
    odd.write_bytes(b"PK\x03\x04not really")
    page.get_by_test_id("attach-input").set_input_files([str(image), str(odd)])
    errors = page.get_by_test_id("draft-attachment-error")
    expect(errors).to_have_count(2)
    expect(errors.nth(0)).to_have_text(
        "photo.png is an image. The model served here reads text only, so images cannot be "
        "attached."
    )
    expect(errors.nth(1)).to_contain_text(".docx files cannot be attached")
    shot(page, "documents-refused")
    # Nothing to send: refused files never go with a message.
    expect(page.get_by_test_id("send-button")).to_be_disabled()
    chips(page).first.get_by_test_id("draft-attachment-remove").click()
    expect(chips(page)).to_have_count(1)


def test_a_200_page_pdf_is_sent_as_its_passages_and_the_one_from_page_150_is_shown(
    page: Page, tmp_path: Path
) -> None:
    """Past the context window a document is not refused: the passages most relevant to
    the question go instead (BM25), and the message lists them, each opening its text."""
    book = tmp_path / "lighthouse.pdf"
    book.write_bytes(pdf_with_text(*(book_page(n) for n in range(1, 201))))
    new_chat(page, max_tokens=16)
    page.get_by_test_id("attach-input").set_input_files(str(book))
    expect(chips(page).first).to_have_attribute("data-status", "ready", timeout=60_000)
    question = "Who repaints the copper lantern of the lighthouse?"
    page.get_by_test_id("composer-input").fill(question)
    expect(page.get_by_test_id("prompt-count")).to_have_attribute("data-fits", "true")
    expect(page.get_by_test_id("passages-note")).to_contain_text("most relevant to your message")
    expect(page.get_by_test_id("context-warning")).to_have_count(0)
    shot(page, "45-documents-passages-composer")
    page.get_by_test_id("send-button").click()
    wait_finished(replies(page).last)
    # Greedy, the default model answers from that passage.
    expect(replies(page).last.get_by_test_id("message-content")).to_contain_text("Marguerite")
    sources = user_messages(page).last.get_by_test_id("message-sources")
    item = sources.locator("[data-testid=source-item][data-page='150']")
    expect(item).to_have_count(1)
    item.click()
    expect(sources.get_by_test_id("source-text")).to_contain_text(FACT)
    shot(page, "45-documents-passages-sent")


FACT = "The lighthouse keeper Marguerite repaints the copper lantern every October."


def book_page(n: int) -> str:
    """A page of a long, dull book; page 150 holds the one fact asked about."""
    words = ["harvest", "river", "stone", "market", "bridge", "winter", "candle", "orchard"]
    body = " ".join(words[(n + i) % len(words)] for i in range(120))
    return f"Page {n}. {body}" + (f" {FACT}" if n == 150 else "")


def test_words_past_the_context_window_are_refused_in_the_composers_words(page: Page) -> None:
    new_chat(page)
    words = " ".join(f"w{i}" for i in range(5000))  # under 32,000 chars, past 8,192 tokens
    page.get_by_test_id("composer-input").fill(words)
    warning = page.get_by_test_id("context-warning")
    expect(warning).to_contain_text("the model reads at most 8,192 tokens, its reply included")
    expect(page.get_by_test_id("prompt-count")).to_have_attribute("data-fits", "false")
    expect(page.get_by_test_id("send-button")).to_be_disabled()
    shot(page, "documents-over-the-window")
    said = warning.inner_text()
    # Sent anyway (around the disabled button): the server refuses it in the same words.
    page.evaluate("w => window.__chat.protocol.sendMessage(w, [])", words)
    notice = page.get_by_test_id("chat-error")
    expect(notice).to_have_attribute("data-code", "too_long")
    expect(notice).to_contain_text(said)
    expect(replies(page)).to_have_count(0)
    assert api(page, "GET", "/api/conversations/")["data"]["conversations"] == []


def chatgpt_export() -> list[dict[str, Any]]:
    def node(key: str, parent: str | None, role: str | None, text: str = "") -> dict[str, Any]:
        message = None
        if role:
            message = {
                "author": {"role": role},
                "content": {"content_type": "text", "parts": [text]},
                "recipient": "all",
            }
        return {"id": key, "parent": parent, "children": [], "message": message}

    nodes = [
        node("root", None, None),
        node("u1", "root", "user", "Name a good book about the sea."),
        node("a1", "u1", "assistant", "*Moby-Dick*, by Herman Melville."),
    ]
    return [
        {
            "title": "Books about the sea",
            "create_time": 1700000000,
            "update_time": 1700000100,
            "mapping": {n["id"]: n for n in nodes},
            "current_node": "a1",
        }
    ]


def test_a_chatgpt_export_is_imported_and_opens(page: Page, tmp_path: Path) -> None:
    export = tmp_path / "conversations.json"
    export.write_text(json.dumps(chatgpt_export()))
    page.get_by_test_id("import-input").set_input_files(str(export))
    result = page.get_by_test_id("import-result")
    expect(result).to_have_text("Imported 1 conversation from conversations.json.")
    expect(result).to_have_attribute("data-ok", "true")
    expect(page.get_by_test_id("conversation-title")).to_have_text("Books about the sea")
    expect(page.get_by_test_id("conversation-item")).to_have_count(1)
    expect(replies(page).last.get_by_test_id("message-content")).to_contain_text("Moby-Dick")
    shot(page, "import-chatgpt")
    # The imported conversation goes on (its history has no token ids: the server reads it).
    page.get_by_test_id("composer-input").fill("Who wrote it?")
    page.get_by_test_id("composer-input").press("Enter")
    expect(replies(page)).to_have_count(2)
    assert wait_finished(replies(page).last) == "complete"


def test_a_broken_import_says_why_and_imports_nothing(page: Page, tmp_path: Path) -> None:
    broken = tmp_path / "conversations.json"
    data = chatgpt_export()
    data[0]["mapping"]["u1"]["parent"] = "missing"
    broken.write_text(json.dumps(data))
    page.get_by_test_id("import-input").set_input_files(str(broken))
    result = page.get_by_test_id("import-result")
    expect(result).to_have_attribute("data-ok", "false")
    expect(result).to_contain_text(
        "Nothing was imported: conversation 1 (\"Books about the sea\"): node 'u1' has a "
        "parent that is not in the file."
    )
    shot(page, "import-refused")
    expect(page.get_by_test_id("conversation-item")).to_have_count(0)
