"""Feedback on replies: the owner's thumbs up or down with an optional comment, stored on
the reply (Message.feedback_*), counted on the staff dashboard and exported as JSON Lines
for evaluation (docs/http.md, "Feedback")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.db.models import Count, Q
from django.utils import timezone

from chatapp.chat import conversations
from chatapp.chat.conversations import InvalidSettings
from chatapp.chat.models import Message
from chatapp.text import clean_text

COMMENT_MAX_CHARS = 2000
RATINGS = {"up": 1, "down": -1}
WORDS = {v: k for k, v in RATINGS.items()}
# The dashboard shows this many of the newest rated replies.
RECENT = 50


def feedback_json(m: Message) -> dict[str, Any] | None:
    return m.feedback_json()


def clean(data: dict[str, Any]) -> tuple[int | None, str]:
    """`{"rating": "up" | "down" | null, "comment"?: str}`; a null rating takes the
    feedback back (its comment with it)."""
    unknown = set(data) - {"rating", "comment"}
    if unknown:
        raise InvalidSettings(f"unknown field(s): {', '.join(sorted(unknown))}")
    if "rating" not in data:
        raise InvalidSettings("rating is required: 'up', 'down' or null")
    rating = data["rating"]
    if rating is not None and rating not in RATINGS:
        raise InvalidSettings("rating must be 'up', 'down' or null")
    comment = clean_text(data.get("comment", ""), "The comment", COMMENT_MAX_CHARS).strip()
    if rating is None:
        return None, ""
    return RATINGS[rating], comment


def give(message: Message, rating: int | None, comment: str) -> Message:
    """Store (or take back) the owner's feedback on a finished reply."""
    if message.role != Message.Role.ASSISTANT:
        raise InvalidSettings("feedback is for the assistant's replies")
    if message.status == Message.Status.STREAMING:
        raise InvalidSettings("the reply is still being written")
    message.feedback_rating = rating
    message.feedback_comment = comment
    message.feedback_at = timezone.now() if rating is not None else None
    # An UPDATE of these fields alone: the reply's text and figures are the generation's.
    Message.objects.filter(pk=message.pk).update(
        feedback_rating=rating, feedback_comment=comment, feedback_at=message.feedback_at
    )
    return message


def _rated() -> Any:
    return Message.objects.filter(
        feedback_at__isnull=False, role=Message.Role.ASSISTANT, conversation__temporary=False
    )


def summary() -> dict[str, Any]:
    """The dashboard's panel: counts per model and the newest rated replies."""
    per_model = (
        _rated()
        .values("model")
        .annotate(
            up=Count("id", filter=Q(feedback_rating=1)),
            down=Count("id", filter=Q(feedback_rating=-1)),
        )
        .order_by("model")
    )
    recent = _rated().select_related("conversation").order_by("-feedback_at", "-id")[:RECENT]
    return {
        "models": [
            {
                "model": row["model"] or conversations.served_default(),
                "up": row["up"],
                "down": row["down"],
            }
            for row in per_model
        ],
        "recent": [
            {
                "message_id": m.pk,
                "conversation_id": m.conversation_id,
                "model": m.model or None,
                "rating": WORDS[m.feedback_rating],
                "comment": m.feedback_comment,
                "reply": m.text[:300],
                "at": m.feedback_at.isoformat() if m.feedback_at else None,
            }
            for m in recent
        ],
    }


def export_lines() -> Iterator[str]:
    """Every rated reply as one JSON line: the conversation up to it (system prompt
    first), the reply, the rating and comment, the model. No user names: the file is for
    evaluating replies."""
    for m in _rated().select_related("conversation").order_by("feedback_at", "id").iterator():
        conv = m.conversation
        turns = []
        if conv.system_prompt.strip():
            turns.append({"role": "system", "text": conv.system_prompt})
        turns += [{"role": t.role, "text": t.text} for t in conversations.path_to(m.parent)]
        row = {
            "message_id": m.pk,
            "conversation_id": conv.pk,
            "model": m.model or conversations.served_default(),
            "rating": WORDS[m.feedback_rating],
            "comment": m.feedback_comment,
            "at": m.feedback_at.isoformat() if m.feedback_at else None,
            "prompt": turns,
            "reply": m.text,
            "finish_reason": m.finish_reason or None,
        }
        yield json.dumps(row, ensure_ascii=False) + "\n"
