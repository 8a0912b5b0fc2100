"""Read-only links to a snapshot of a conversation (docs/http.md, "Shared links").

The owner shares a conversation: the branch on screen is copied into a SharedLink's
snapshot, reachable by anyone who has its unguessable token URL, without logging in. The
page shows the snapshot only, never the live conversation, so later messages appear when
the owner updates the link. Only the messages' roles and text are copied; the owner's
name and the conversation's settings only when the owner asks for them; never the reply
figures, ids or errors. Revoking deletes the link (a new share gets a new token).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from chatapp.chat import conversations as conv_logic
from chatapp.chat.api import api_view, read_json
from chatapp.chat.conversations import InvalidSettings, NotFound
from chatapp.chat.models import Conversation, Message, SharedLink
from chatapp.errors import error_response

# 32 random bytes: 256 bits, as long as a session key is to guess, in URL-safe base64.
TOKEN_BYTES = 32
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{43}")
OPTIONS = ("show_author", "show_settings")
MAX_LISTED = 500
# The page is for people holding the link: search engines must not keep it, and the token
# in its address must not travel to a site it links to.
PAGE_HEADERS = {"X-Robots-Tag": "noindex, nofollow, noarchive", "Referrer-Policy": "no-referrer"}


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def take_snapshot(conv: Conversation, show_author: bool, show_settings: bool) -> dict[str, Any]:
    """What the link shows: the active branch's finished user and assistant messages (a
    reply still being written is left out), and the title; the owner's username and the
    settings only when asked for."""
    messages = [
        {"role": m.role, "text": m.text}
        for m in conv_logic.active_branch(conv)
        if m.role in (Message.Role.USER, Message.Role.ASSISTANT)
        and m.status != Message.Status.STREAMING
        and m.text.strip()
    ]
    snapshot: dict[str, Any] = {"title": conv.title, "messages": messages}
    if show_author:
        snapshot["author"] = conv.owner.get_username()
    if show_settings:
        snapshot["settings"] = conv.settings_dict
    return snapshot


def publish(conv: Conversation, options: dict[str, bool]) -> tuple[SharedLink | None, bool]:
    """Share `conv` now, or take a new snapshot for its link (same token; options not
    given stay as they were). Returns (link, created); (None, False) when the branch has
    nothing to show yet. Concurrent calls for one conversation take turns on its row."""
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().filter(pk=conv.pk).first()
        if locked is None:
            raise NotFound("conversation")
        link = SharedLink.objects.filter(conversation=locked).first()
        created = link is None
        if link is None:
            link = SharedLink(conversation=locked, token=new_token())
        for name in OPTIONS:
            if name in options:
                setattr(link, name, options[name])
        snapshot = take_snapshot(locked, link.show_author, link.show_settings)
        if not snapshot["messages"]:
            return None, False
        link.snapshot, link.shared_at = snapshot, timezone.now()
        link.save()
    return link, created


def link_json(
    request: HttpRequest, link: SharedLink, changed: bool | None = None
) -> dict[str, Any]:
    path = reverse("shared-conversation", args=[link.token])
    data: dict[str, Any] = {
        "url": request.build_absolute_uri(path),
        "path": path,
        "conversation_id": link.conversation_id,
        "title": link.snapshot.get("title", ""),
        "created_at": link.created_at.isoformat(),
        "shared_at": link.shared_at.isoformat(),
        "message_count": len(link.snapshot.get("messages", [])),
        "show_author": link.show_author,
        "show_settings": link.show_settings,
    }
    if changed is not None:
        data["changed"] = changed
    return data


def _options(data: dict[str, Any]) -> dict[str, bool]:
    unknown = set(data) - set(OPTIONS)
    if unknown:
        raise InvalidSettings(f"unknown field(s): {', '.join(sorted(unknown))}")
    for name, value in data.items():
        if not isinstance(value, bool):
            raise InvalidSettings(f"{name} must be true or false")
    return data


# --- the owner's JSON API -----------------------------------------------------------


@api_view("GET", "POST", "DELETE")
def conversation_link(request: HttpRequest, pk: int) -> HttpResponse:
    conv = conv_logic.get_conversation(request.user, pk)
    if conv.temporary and request.method == "POST":
        return error_response(400, "temporary", "A temporary chat cannot be shared.")
    if request.method == "POST":
        link, created = publish(conv, _options(read_json(request)))
        if link is None:
            return error_response(
                400, "nothing_to_share", "There is nothing to share yet: no finished message."
            )
        return JsonResponse(
            {"share": link_json(request, link, changed=False)}, status=201 if created else 200
        )
    if request.method == "DELETE":
        if not SharedLink.objects.filter(conversation=conv).delete()[0]:
            raise NotFound("link")
        return HttpResponse(status=204)
    link = SharedLink.objects.filter(conversation=conv).first()
    if link is None:
        return JsonResponse({"share": None})
    # Whether the link still shows the conversation as it is (else the owner may update it).
    changed = take_snapshot(conv, link.show_author, link.show_settings) != link.snapshot
    return JsonResponse({"share": link_json(request, link, changed)})


@api_view("GET")
def links(request: HttpRequest) -> HttpResponse:
    mine = SharedLink.objects.filter(conversation__owner=request.user)[:MAX_LISTED]
    return JsonResponse({"shares": [link_json(request, link) for link in mine]})


# --- the page anyone with the link sees -----------------------------------------------


@never_cache
@require_GET
def shared_page(request: HttpRequest, token: str) -> HttpResponse:
    link = None
    if TOKEN_RE.fullmatch(token):
        link = SharedLink.objects.filter(token=token, conversation__owner__is_active=True).first()
    if link is None:
        response = render(request, "chat/shared_missing.html", status=404)
    else:
        snap = link.snapshot
        context = {
            "title": snap.get("title") or "A shared conversation",
            "messages": snap.get("messages", []),
            "author": snap.get("author"),
            "settings": snap.get("settings"),
            "shared_at": link.shared_at,
        }
        response = render(request, "chat/shared.html", context)
    for header, value in PAGE_HEADERS.items():
        response[header] = value
    return response
