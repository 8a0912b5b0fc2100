"""Saved prompts: text a user keeps to reuse, named by the command typed after `/` in the
composer (docs/http.md, "Saved prompts")."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from chatapp.chat.conversations import InvalidSettings, NotFound
from chatapp.chat.models import SavedPrompt
from chatapp.text import clean_text

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
# Enough for anyone's library, and a bound on what the composer's list reads.
MAX_PER_USER = 200


def prompt_json(p: SavedPrompt) -> dict[str, Any]:
    return {
        "id": p.pk,
        "name": p.name,
        "text": p.text,
        "created_at": p.created_at.isoformat(),
        "updated_at": p.updated_at.isoformat(),
    }


def clean(data: dict[str, Any], partial: bool = False) -> dict[str, str]:
    unknown = set(data) - {"name", "text"}
    if unknown:
        raise InvalidSettings(f"unknown field(s): {', '.join(sorted(unknown))}")
    out: dict[str, str] = {}
    if "name" in data or not partial:
        name = data.get("name")
        if not isinstance(name, str):
            raise InvalidSettings("name is required")
        name = name.strip().lstrip("/").lower()
        if not NAME_RE.fullmatch(name):
            raise InvalidSettings(
                "name must be 1 to 40 lowercase letters, digits or dashes, starting with a "
                "letter or digit"
            )
        out["name"] = name
    if "text" in data or not partial:
        out["text"] = clean_text(
            data.get("text", ""), "The prompt", settings.CHAT_MAX_MESSAGE_CHARS, allow_empty=False
        )
    return out


def get(user: Any, pk: int) -> SavedPrompt:
    found = SavedPrompt.objects.filter(owner=user, pk=pk).first()
    if found is None:
        raise NotFound("prompt")
    return found


def save(user: Any, values: dict[str, str], prompt: SavedPrompt | None = None) -> SavedPrompt:
    """Create (prompt None) or change one; a name already used is refused."""
    if prompt is None:
        if SavedPrompt.objects.filter(owner=user).count() >= MAX_PER_USER:
            raise InvalidSettings(f"at most {MAX_PER_USER} saved prompts")
        prompt = SavedPrompt(owner=user)
    for field, value in values.items():
        setattr(prompt, field, value)
    try:
        with transaction.atomic():
            prompt.save()
    except IntegrityError as exc:
        raise InvalidSettings(f"there is already a prompt named /{prompt.name}") from exc
    return prompt
