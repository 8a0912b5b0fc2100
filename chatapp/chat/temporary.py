"""Temporary chats (docs/http.md, "Temporary chats"): a conversation kept only while the
socket that started it is open. It is stored meanwhile, as every turn's prompt is built
from the stored turns, but it is never listed, searched, exported, shared or titled, and
it is deleted when that socket closes (the tab closed or reloaded, the connection lost)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from chatapp.chat.models import Conversation

# A temporary chat whose socket never closed cleanly (the server stopped) is deleted when
# its owner's next socket closes, once it has been untouched this long.
STALE_S = 24 * 3600


def end(user: Any, ids: set[int]) -> int:
    """Delete the temporary chats a socket started (it closed), and any of the user's
    left over from a socket that closed without saying so; how many went."""
    stale = timezone.now() - timedelta(seconds=STALE_S)
    _, by_model = (
        Conversation.objects.filter(owner=user, temporary=True)
        .filter(Q(pk__in=ids) | Q(updated_at__lt=stale))
        .delete()
    )
    return by_model.get(Conversation._meta.label, 0)
