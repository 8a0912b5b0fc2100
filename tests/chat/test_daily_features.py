"""Temporary chats, feedback on replies, saved prompts and the plain-text export, through
the HTTP API (docs/http.md); the socket's side of a temporary chat is in
test_temporary_socket.py."""

from __future__ import annotations

import io
import json
import zipfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from chatapp.chat import export, temporary
from chatapp.chat.models import Conversation, Message
from chatapp.jobs.models import Job

pytestmark = pytest.mark.django_db


def client_for(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def exchange(owner: Any, title: str, temporary: bool = False) -> tuple[Conversation, Message]:
    conv = Conversation.objects.create(owner=owner, title=title, temporary=temporary)
    q = Message.objects.create(conversation=conv, role="user", text=f"question of {title}")
    a = Message.objects.create(
        conversation=conv, parent=q, role="assistant", text=f"answer {title}"
    )
    conv.active_leaf = a
    conv.save()
    return conv, a


# --- temporary chats ---------------------------------------------------------------


def test_a_temporary_chat_is_never_listed_found_exported_or_shared(plain_user) -> None:
    c = client_for(plain_user)
    kept, _ = exchange(plain_user, "kept lisbon")
    temp, _ = exchange(plain_user, "secret lisbon", temporary=True)
    assert [x["id"] for x in c.get("/api/conversations/").json()["conversations"]] == [kept.pk]
    found = c.get("/api/conversations/?q=lisbon").json()["conversations"]
    assert [x["id"] for x in found] == [kept.pk]
    # Its owner still reads it (the page that holds it reloads it after a reconnect).
    got = c.get(f"/api/conversations/{temp.pk}/").json()
    assert got["conversation"]["temporary"] is True
    refused = c.post(f"/api/conversations/{temp.pk}/share/", {}, "application/json")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "temporary"

    job = Job.objects.create(kind=Job.Kind.EXPORT, user=plain_user, params={"format": "json"})
    assert export.export_all(job) == {"conversations": 1}
    job.refresh_from_db()
    with zipfile.ZipFile(io.BytesIO((job_file(job)).read_bytes())) as zf:
        data = json.loads(zf.read("conversations.json"))
    assert [d["conversation"]["id"] for d in data] == [kept.pk]


def job_file(job: Job) -> Path:
    return Path(settings.VAR_DIR) / job.file


def test_ending_a_socket_deletes_its_temporary_chats_and_stale_ones_only(
    plain_user, staff_user
) -> None:
    mine, _ = exchange(plain_user, "this tab", temporary=True)
    other_tab, _ = exchange(plain_user, "another tab", temporary=True)
    stale, _ = exchange(plain_user, "server stopped", temporary=True)
    Conversation.objects.filter(pk=stale.pk).update(
        updated_at=timezone.now() - timedelta(seconds=temporary.STALE_S + 60)
    )
    kept, _ = exchange(plain_user, "saved")
    someone_elses, _ = exchange(staff_user, "theirs", temporary=True)
    assert temporary.end(plain_user, {mine.pk, someone_elses.pk}) == 2
    left = set(Conversation.objects.values_list("pk", flat=True))
    assert left == {other_tab.pk, kept.pk, someone_elses.pk}
    assert not Message.objects.filter(conversation_id__in=[mine.pk, stale.pk]).exists()


# --- feedback -----------------------------------------------------------------------


def put_feedback(c: Client, message_id: int, body: dict) -> Any:
    return c.put(f"/api/messages/{message_id}/feedback/", body, "application/json")


def test_feedback_is_stored_shown_counted_and_exported(plain_user, staff_user) -> None:
    c = client_for(plain_user)
    conv, reply = exchange(plain_user, "tides")
    conv.system_prompt = "Be brief."
    conv.save()
    r = put_feedback(c, reply.pk, {"rating": "down", "comment": "  Wrong about the moon.  "})
    assert r.status_code == 200
    assert r.json()["feedback"]["rating"] == "down"
    assert r.json()["feedback"]["comment"] == "Wrong about the moon."
    shown = c.get(f"/api/conversations/{conv.pk}/").json()["messages"]
    assert "feedback" not in shown[0]
    assert shown[1]["feedback"]["rating"] == "down"
    assert shown[1]["feedback"]["comment"] == "Wrong about the moon."

    _, liked = exchange(plain_user, "bread")
    put_feedback(c, liked.pk, {"rating": "up"})
    _temp, on_temporary = exchange(plain_user, "gone soon", temporary=True)
    put_feedback(c, on_temporary.pk, {"rating": "up"})

    # Only staff read it; a temporary chat's feedback is not counted (it is about to go).
    assert c.get("/api/feedback/").status_code == 403
    assert c.get("/api/feedback/export.jsonl").status_code == 403
    staff = client_for(staff_user)
    summary = staff.get("/api/feedback/").json()
    assert sum(m["up"] for m in summary["models"]) == 1
    assert sum(m["down"] for m in summary["models"]) == 1
    assert [x["message_id"] for x in summary["recent"]] == [liked.pk, reply.pk]
    assert summary["recent"][1]["comment"] == "Wrong about the moon."

    body = b"".join(staff.get("/api/feedback/export.jsonl").streaming_content)
    rows = [json.loads(line) for line in body.decode().splitlines()]
    assert [r["message_id"] for r in rows] == [reply.pk, liked.pk]
    assert rows[0]["prompt"] == [
        {"role": "system", "text": "Be brief."},
        {"role": "user", "text": "question of tides"},
    ]
    assert rows[0]["reply"] == "answer tides" and rows[0]["rating"] == "down"
    assert "username" not in rows[0] and "owner" not in rows[0]

    # A null rating takes it back, comment and all.
    assert put_feedback(c, reply.pk, {"rating": None}).json()["feedback"] is None
    reply.refresh_from_db()
    assert reply.feedback_rating is None and reply.feedback_comment == ""
    assert reply.feedback_at is None


def test_bad_feedback_is_refused(plain_user, staff_user) -> None:
    c = client_for(plain_user)
    _conv, reply = exchange(plain_user, "x")
    question = reply.parent
    assert put_feedback(c, reply.pk, {"rating": "meh"}).status_code == 400
    assert put_feedback(c, reply.pk, {}).status_code == 400
    assert put_feedback(c, reply.pk, {"rating": "up", "comment": "x" * 2001}).status_code == 400
    assert put_feedback(c, reply.pk, {"rating": "up", "extra": 1}).status_code == 400
    assert put_feedback(c, question.pk, {"rating": "up"}).status_code == 400
    Message.objects.filter(pk=reply.pk).update(status=Message.Status.STREAMING)
    assert put_feedback(c, reply.pk, {"rating": "up"}).status_code == 400
    # Another user's reply is not found, and is left alone.
    _, theirs = exchange(staff_user, "theirs")
    assert put_feedback(c, theirs.pk, {"rating": "down"}).status_code == 404
    theirs.refresh_from_db()
    assert theirs.feedback_rating is None


# --- saved prompts ------------------------------------------------------------------


def test_saved_prompts_are_kept_per_user(plain_user, staff_user) -> None:
    c = client_for(plain_user)
    r = c.post(
        "/api/prompts/", {"name": "/Summarize", "text": "Summarize this:\n"}, "application/json"
    )
    assert r.status_code == 201, r.content
    created = r.json()
    assert created["name"] == "summarize" and created["text"] == "Summarize this:\n"
    c.post("/api/prompts/", {"name": "eli5", "text": "Explain like I'm five."}, "application/json")
    assert [p["name"] for p in c.get("/api/prompts/").json()["prompts"]] == ["eli5", "summarize"]

    dup = c.post("/api/prompts/", {"name": "eli5", "text": "again"}, "application/json")
    assert dup.status_code == 400 and "already" in dup.json()["error"]["message"]
    for bad in ({"name": "has space", "text": "x"}, {"name": "ok"}, {"name": "ok", "text": " "}):
        assert c.post("/api/prompts/", bad, "application/json").status_code == 400

    changed = c.patch(f"/api/prompts/{created['id']}/", {"text": "TL;DR:"}, "application/json")
    assert changed.status_code == 200 and changed.json()["text"] == "TL;DR:"
    assert changed.json()["name"] == "summarize"

    other = client_for(staff_user)
    assert other.get("/api/prompts/").json()["prompts"] == []
    assert other.delete(f"/api/prompts/{created['id']}/").status_code == 404
    assert c.delete(f"/api/prompts/{created['id']}/").status_code == 204
    assert [p["name"] for p in c.get("/api/prompts/").json()["prompts"]] == ["eli5"]


# --- plain-text export --------------------------------------------------------------


def test_a_conversation_exports_as_plain_text(plain_user) -> None:
    c = client_for(plain_user)
    conv, _ = exchange(plain_user, "tides")
    r = c.get(f"/api/conversations/{conv.pk}/export.txt")
    assert r.status_code == 200 and r["Content-Type"].startswith("text/plain")
    assert r.content.decode() == ("tides\n\nYou:\nquestion of tides\n\nAssistant:\nanswer tides\n")
    bad = c.post("/api/exports/", {"format": "pdf"}, "application/json")
    assert bad.status_code == 400
    job = Job.objects.create(kind=Job.Kind.EXPORT, user=plain_user, params={"format": "txt"})
    export.export_all(job)
    job.refresh_from_db()
    with zipfile.ZipFile(io.BytesIO(job_file(job).read_bytes())) as zf:
        assert zf.namelist() == [f"{conv.pk:05d}-tides.txt"]
