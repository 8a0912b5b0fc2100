"""API keys: make, list, revoke (a server-rendered page), and check a bearer token."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from chatapp.openai_api.models import ApiKey
from chatapp.text import InvalidText, clean_text

KEY_PREFIX = "sk-chat-"
NAME_MAX_CHARS = 100  # ApiKey.name's max_length


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def create_key(user: Any, name: str) -> tuple[ApiKey, str]:
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        owner=user,
        name=name.strip()[:NAME_MAX_CHARS] or "key",
        prefix=raw[:14],
        key_hash=hash_key(raw),
    )
    return key, raw


def key_for_token(raw: str) -> ApiKey | None:
    """The live key a bearer token names, with its owner, or None."""
    if not raw.startswith(KEY_PREFIX) or len(raw) > 200:
        return None
    key = (
        ApiKey.objects.select_related("owner")
        .filter(key_hash=hash_key(raw), revoked_at__isnull=True, owner__is_active=True)
        .first()
    )
    if key is not None:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    return key


# The page can show a new key in full: no browser or proxy may keep a copy (no-store).
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def keys_page(request: HttpRequest) -> HttpResponse:
    new_key, error, status = None, None, 200
    if request.method == "POST":
        try:
            name = clean_text(request.POST.get("name", ""), "The name", NAME_MAX_CHARS)
        except InvalidText as exc:
            error, status = exc.message, 400
        else:
            _, new_key = create_key(request.user, name)
    keys = ApiKey.objects.filter(owner=request.user, revoked_at__isnull=True)
    context = {"keys": keys, "new_key": new_key, "error": error}
    return render(request, "openai_api/keys.html", context, status=status)


@login_required
@require_http_methods(["POST"])
def revoke_key(request: HttpRequest, pk: int) -> HttpResponse:
    key = get_object_or_404(ApiKey, pk=pk, owner=request.user, revoked_at__isnull=True)
    key.revoked_at = timezone.now()
    key.save(update_fields=["revoked_at"])
    return redirect("api-keys")
