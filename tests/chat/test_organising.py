"""Organising conversations: pin, archive and folders (PATCH /api/conversations/<id>/)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from chatapp.chat.models import Conversation

pytestmark = pytest.mark.django_db


def client_for(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def patch(c: Client, pk: int, body: dict) -> Any:
    return c.patch(f"/api/conversations/{pk}/", body, "application/json")


def listed(c: Client, query: str = "") -> list[dict]:
    return c.get(f"/api/conversations/{query}").json()["conversations"]


def test_pin_archive_and_folder_are_saved_and_listed(plain_user) -> None:
    c = client_for(plain_user)
    a = Conversation.objects.create(owner=plain_user, title="Trip to Lisbon")
    b = Conversation.objects.create(owner=plain_user, title="Trip to Lisbon")
    before = {x["id"]: x["updated_at"] for x in listed(c)}
    assert patch(c, a.pk, {"pinned": True, "folder": "  Travel   plans "}).status_code == 200
    rows = {x["id"]: x for x in listed(c)}
    assert rows[a.pk]["pinned"] is True and rows[a.pk]["folder"] == "Travel plans"
    assert rows[b.pk]["pinned"] is False and rows[b.pk]["folder"] == ""
    # Filing is no change to the conversation: its date, and so its place, stay.
    assert rows[a.pk]["updated_at"] == before[a.pk]

    assert patch(c, b.pk, {"archived": True}).json()["conversation"]["archived"] is True
    assert [x["id"] for x in listed(c)] == [a.pk]
    assert [x["id"] for x in listed(c, "?archived=1")] == [b.pk]
    patch(c, b.pk, {"archived": False})
    assert {x["id"] for x in listed(c)} == {a.pk, b.pk}


def test_bad_organising_values_are_refused(plain_user) -> None:
    c = client_for(plain_user)
    a = Conversation.objects.create(owner=plain_user, title="x")
    assert patch(c, a.pk, {"pinned": "yes"}).status_code == 400
    assert patch(c, a.pk, {"folder": "f" * 61}).status_code == 400
    assert patch(c, a.pk, {}).status_code == 200
