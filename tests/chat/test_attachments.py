"""Documents attached to a message (docs/http.md, "Attachments"): what is read from each
kind of file and what is refused, the upload and its limits, whose documents are whose,
the prompt count before sending, and the exports."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from chatapp.chat import attachments
from chatapp.chat.attachments import AttachmentRefused, extract
from chatapp.chat.conversations import add_exchange, create_conversation
from chatapp.chat.models import Attachment, Message
from tests.chat.documents import (
    JPEG,
    PNG,
    pdf_of_shared_empty_operators,
    pdf_with_password,
    pdf_with_text,
    pdf_without_text,
)

# --- what is read from a file ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "text"),
    [
        ("notes.txt", b"Buy milk.\nCall Bob.", "Buy milk.\nCall Bob."),
        ("README.md", b"# Title\r\n\r\nBody", "# Title\n\nBody"),
        ("main.py", b"def f():\n    return 1\n", "def f():\n    return 1\n"),
        ("table.csv", "\ufeffcity,pop\r\nLisbon,545000".encode(), "city,pop\nLisbon,545000"),
        ("data.json", b'{"a": [1, 2]}', '{"a": [1, 2]}'),
        ("Makefile", b"all:\n\techo hi", "all:\n\techo hi"),
        ("utf16.txt", "Grüße aus Köln".encode("utf-16"), "Grüße aus Köln"),
        ("no-extension", b"plain words", "plain words"),
    ],
)
def test_text_and_code_files_are_read_as_utf8_text(name: str, data: bytes, text: str) -> None:
    assert extract(name, data) == ("text", text)


def test_a_pdf_gives_the_text_of_its_pages_apart_by_form_feeds() -> None:
    kind, text = extract("report.pdf", pdf_with_text("The tide is high.", "Page two says hello."))
    assert kind == "pdf"
    # The form feed tells a passage its page (retrieval.py).
    assert text == "The tide is high.\n\f\nPage two says hello."


@pytest.mark.parametrize(
    ("name", "data", "code", "status", "words"),
    [
        ("scan.pdf", pdf_without_text(), "no_text_layer", 422, "has no text layer"),
        ("locked.pdf", pdf_with_password("hidden"), "unreadable_pdf", 422, "password"),
        ("broken.pdf", b"%PDF-1.7\nnot really a pdf", "unreadable_pdf", 422, "damaged"),
        ("photo.png", PNG, "image_unsupported", 415, "reads text only"),
        ("photo.jpg", JPEG, "image_unsupported", 415, "reads text only"),
        ("renamed.txt", PNG, "image_unsupported", 415, "is an image"),
        ("drawing.svg", b"<svg/>", "image_unsupported", 415, "is an image"),
        ("latin1.txt", "café".encode("latin-1"), "undecodable", 422, "not UTF-8 text"),
        ("program.txt", b"MZ\x90\x00\x03\x00", "undecodable", 422, "binary"),
        ("letter.docx", b"PK\x03\x04...", "unsupported_type", 415, ".docx files cannot"),
        ("empty.md", b"  \n\n", "empty", 422, "no text"),
    ],
)
def test_files_that_cannot_be_read_are_refused_saying_why(
    name: str, data: bytes, code: str, status: int, words: str
) -> None:
    with pytest.raises(AttachmentRefused) as refused:
        extract(name, data)
    assert (refused.value.code, refused.value.status) == (code, status)
    assert name in refused.value.message and words in refused.value.message


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(settings: Any) -> None:
    settings.CHAT_ATTACHMENT_MAX_BYTES = 1000
    with pytest.raises(AttachmentRefused) as refused:
        extract("big.txt", b"a" * 1001)
    assert refused.value.code == "too_large" and refused.value.status == 413
    assert "1.0 KB" in refused.value.message


def test_a_file_with_more_text_than_allowed_is_refused(settings: Any) -> None:
    settings.CHAT_ATTACHMENT_MAX_CHARS = 100
    with pytest.raises(AttachmentRefused) as refused:
        extract("long.txt", b"word " * 50)
    assert refused.value.code == "too_large" and "at most 100" in refused.value.message
    # A PDF stops being read at the page that passes the limit.
    with pytest.raises(AttachmentRefused) as refused:
        extract("long.pdf", pdf_with_text("a" * 80, "b" * 80, "c" * 80))
    read = int(re.search(r"more than ([\d,]+) characters", refused.value.message)[1])  # type: ignore[index]
    assert 160 <= read < 240, "page 3 was never read"


def test_a_pdf_with_more_pages_than_allowed_is_refused_before_any_is_read(settings: Any) -> None:
    settings.CHAT_PDF_MAX_PAGES = 2
    with pytest.raises(AttachmentRefused) as refused:
        extract("long.pdf", pdf_with_text("one", "two", "three"))
    assert (refused.value.code, refused.value.status) == ("too_large", 413)
    assert "has 3 pages" in refused.value.message and "at most 2" in refused.value.message


def test_a_shared_content_stream_counts_once_per_page_against_the_content_limit(
    settings: Any,
) -> None:
    # Each page alone is under the limit; the pages together pass it before the parse
    # that would cost seconds a page.
    settings.CHAT_PDF_MAX_CONTENT_BYTES = 3_000_000
    started = time.monotonic()
    with pytest.raises(AttachmentRefused) as refused:
        extract("trap.pdf", pdf_of_shared_empty_operators(pages=6))
    assert (refused.value.code, refused.value.status) == ("too_large", 413)
    assert "page content" in refused.value.message
    assert time.monotonic() - started < 15  # one page parsed, not six


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("C:\\Users\\me\\notes.txt", "notes.txt"),
        ('../../etc/"passwd"', "passwd"),
        ("a\x00b\nc.md", "abc.md"),
        ("", "document"),
        ("x" * 300 + ".txt", "x" * 255),
    ],
)
def test_file_names_are_cleaned_for_the_screen_and_the_prompt(raw: str, clean: str) -> None:
    assert attachments.clean_name(raw) == clean


def test_each_document_is_wrapped_the_same_way_before_the_words() -> None:
    docs = [
        Attachment(name="a.md", text="\nAlpha\n"),
        Attachment(name="b.csv", text="x,y"),
    ]
    assert attachments.prompt_text("Compare them.", docs) == (
        '<document name="a.md">\nAlpha\n</document>\n\n'
        '<document name="b.csv">\nx,y\n</document>\n\n'
        "Compare them."
    )


# --- the upload, and whose documents are whose ---------------------------------------


@pytest.fixture
def alice(make_user: Any) -> Any:
    return make_user("alice")


def client_for(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def upload(c: Client, name: str, data: bytes) -> Any:
    return c.post("/api/attachments/", {"file": SimpleUploadedFile(name, data)})


@pytest.mark.django_db
def test_an_upload_answers_its_size_and_tokens_and_keeps_its_text(
    alice: Any, tiny_engine: Any
) -> None:
    c = client_for(alice)
    answer = upload(c, "notes.md", b"# Plan\n\nShip it on Friday.")
    assert answer.status_code == 201, answer.content
    data = answer.json()
    block = attachments.document_block("notes.md", "# Plan\n\nShip it on Friday.")
    assert data["name"] == "notes.md" and data["kind"] == "text" and data["size"] == 26
    assert data["tokens"] == tiny_engine.count_tokens(block) > 5
    assert data["message_id"] is None and "text" not in data
    shown = c.get(f"/api/attachments/{data['id']}/").json()
    assert shown["text"] == "# Plan\n\nShip it on Friday."


@pytest.mark.django_db
def test_an_upload_refused_says_why_as_json_and_keeps_nothing(alice: Any) -> None:
    c = client_for(alice)
    answer = upload(c, "scan.pdf", pdf_without_text())
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "no_text_layer"
    answer = upload(c, "cat.png", PNG)
    assert answer.status_code == 415 and "text only" in answer.json()["error"]["message"]
    assert c.post("/api/attachments/", {}).status_code == 400
    assert not Attachment.objects.exists()


@pytest.mark.django_db
def test_an_upload_declared_too_large_is_refused_without_reading_it(
    alice: Any, settings: Any
) -> None:
    settings.CHAT_ATTACHMENT_MAX_BYTES = 1000
    c = client_for(alice)
    answer = c.post(
        "/api/attachments/",
        data=b"x" * 10,
        content_type="multipart/form-data; boundary=zz",
        CONTENT_LENGTH=str(10 * 1024 * 1024),
    )
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "too_large"
    answer = upload(c, "big.txt", b"a" * 2000)
    assert answer.status_code == 413 and "big.txt is 2.0 KB" in answer.json()["error"]["message"]


@pytest.mark.django_db
def test_another_users_document_is_not_found_anywhere(alice: Any, make_user: Any) -> None:
    doc = upload(client_for(alice), "secret.txt", b"the launch code").json()
    bob = client_for(make_user("bob"))
    assert bob.get(f"/api/attachments/{doc['id']}/").status_code == 404
    assert bob.delete(f"/api/attachments/{doc['id']}/").status_code == 404
    counted = bob.post(
        "/api/chat/prompt-size/",
        data=json.dumps({"conversation_id": None, "text": "hi", "attachments": [doc["id"]]}),
        content_type="application/json",
    )
    assert (
        counted.status_code == 400 and "no longer available" in counted.json()["error"]["message"]
    )
    assert Attachment.objects.filter(pk=doc["id"]).exists()


@pytest.mark.django_db
def test_a_document_not_yet_sent_can_be_removed_but_a_sent_one_stays(alice: Any) -> None:
    c = client_for(alice)
    waiting = upload(c, "a.txt", b"alpha").json()
    assert c.delete(f"/api/attachments/{waiting['id']}/").status_code == 204
    sent = Attachment.objects.get(pk=upload(c, "b.txt", b"beta").json()["id"])
    conv = create_conversation(alice)
    user_msg, _ = add_exchange(conv, None, "Read it", [], documents=[sent])
    assert c.delete(f"/api/attachments/{sent.pk}/").status_code == 400
    assert list(user_msg.attachments.all()) == [sent]


@pytest.mark.django_db
def test_uploads_never_sent_are_dropped_after_a_day(alice: Any, settings: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    c = client_for(alice)
    old = upload(c, "old.txt", b"old").json()["id"]
    Attachment.objects.filter(pk=old).update(created_at=timezone.now() - timedelta(hours=25))
    upload(c, "new.txt", b"new")
    assert not Attachment.objects.filter(pk=old).exists()
    assert Attachment.objects.filter(owner=alice).count() == 1


# --- the count before sending ---------------------------------------------------------


def prompt_size(c: Client, **body: Any) -> Any:
    return c.post("/api/chat/prompt-size/", data=json.dumps(body), content_type="application/json")


@pytest.mark.django_db
def test_the_prompt_count_covers_the_conversation_the_documents_and_the_words(
    alice: Any, tiny_engine: Any
) -> None:
    c = client_for(alice)
    doc = upload(c, "notes.txt", b"Alpha beta gamma delta. " * 20).json()
    alone = prompt_size(c, conversation_id=None, text="Summarise.").json()
    both = prompt_size(c, conversation_id=None, text="Summarise.", attachments=[doc["id"]]).json()
    assert both["fits"] is True and both["message"] is None
    assert both["context_tokens"] == tiny_engine.max_model_len
    assert both["attachments"] == [{"id": doc["id"], "tokens": doc["tokens"]}]
    # The document's block, give or take the one token where it meets the words.
    assert abs(both["prompt_tokens"] - alone["prompt_tokens"] - doc["tokens"]) <= 1
    conv = create_conversation(alice)
    _, reply = add_exchange(conv, None, "Earlier question", [])
    Message.objects.filter(pk=reply.pk).update(text="Earlier answer", status="complete")
    later = prompt_size(c, conversation_id=conv.pk, text="Summarise.").json()
    assert later["prompt_tokens"] > alone["prompt_tokens"]


@pytest.mark.django_db
def test_past_the_context_window_the_count_says_so_in_the_words_a_send_gets(
    alice: Any, tiny_engine: Any, settings: Any
) -> None:
    settings.CHAT_ATTACHMENT_MAX_CHARS = 10**6
    c = client_for(alice)
    words = " ".join(f"w{i}" for i in range(tiny_engine.max_model_len))
    doc = upload(c, "huge.txt", words.encode()).json()
    # A document past the window fits as its passages: the count says how many go.
    answer = prompt_size(c, conversation_id=None, text="Summarise.", attachments=[doc["id"]])
    data = answer.json()
    assert data["fits"] is True and data["passages"] > 0
    assert data["prompt_tokens"] < tiny_engine.max_model_len
    # Words past the window do not.
    answer = prompt_size(c, conversation_id=None, text=words, attachments=[doc["id"]])
    data = answer.json()
    assert data["fits"] is False and data["prompt_tokens"] > tiny_engine.max_model_len
    assert data["message"] == (
        f"This message needs {data['prompt_tokens']:,} tokens with the conversation so far, "
        f"and the model reads at most {tiny_engine.max_model_len:,} tokens, its reply "
        "included. Remove an attachment, shorten the message or start a new chat."
    )


@pytest.mark.django_db
def test_the_prompt_count_refuses_what_a_send_would_refuse(alice: Any, tiny_engine: Any) -> None:
    c = client_for(alice)
    assert prompt_size(c, conversation_id=None, text=5).status_code == 400
    assert prompt_size(c, conversation_id=None, text="x", attachments="1").status_code == 400
    assert prompt_size(c, conversation_id=None, text="x", attachments=[1, 1]).status_code == 400
    assert prompt_size(c, conversation_id=987654, text="x").status_code == 404
    assert prompt_size(c, conversation_id=None, text="x", extra=1).status_code == 400


# --- the exports ----------------------------------------------------------------------


@pytest.mark.django_db
def test_exports_carry_each_document_with_its_message(alice: Any) -> None:
    c = client_for(alice)
    code = "print('```')\n"
    doc = Attachment.objects.get(pk=upload(c, "fence.py", code.encode()).json()["id"])
    conv = create_conversation(alice, "Code review")
    user_msg, reply = add_exchange(conv, None, "What does it print?", [], documents=[doc])
    Message.objects.filter(pk=reply.pk).update(text="Three backticks.", status="complete")
    data = c.get(f"/api/conversations/{conv.pk}/export.json").json()
    assert data["format"] == "chatapp.conversation/3"
    first = data["messages"][0]
    assert first["attachments"] == [
        {
            "id": doc.pk,
            "name": "fence.py",
            "kind": "text",
            "size": len(code),
            "tokens": doc.tokens,
            "message_id": user_msg.pk,
            "text": code,
        }
    ]
    md = c.get(f"/api/conversations/{conv.pk}/export.md").content.decode()
    assert "Attached: **fence.py** (13 bytes" in md
    # The fence is longer than any backtick run inside, so the code stays one block.
    assert "````\nprint('```')\n````" in md
    assert md.index("fence.py") < md.index("What does it print?") < md.index("Three backticks.")


@pytest.mark.django_db
def test_the_limits_name_the_attachment_limits(alice: Any, settings: Any) -> None:
    settings.CHAT_ATTACHMENT_MAX_BYTES = 12345
    settings.CHAT_ATTACHMENTS_PER_MESSAGE = 3
    limits = client_for(alice).get("/api/chat/limits/").json()
    assert limits["attachments"] == {"max_bytes": 12345, "per_message": 3}
