"""API keys: make, list, revoke (a server-rendered page and the JSON API the chat UI's
account dialog uses, docs/http.md), and check a bearer token."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from chatapp.errors import error_response
from chatapp.openai_api.models import ApiKey
from chatapp.text import InvalidText, clean_text

KEY_PREFIX = "sk-chat-"
NAME_MAX_CHARS = 100  # ApiKey.name's max_length
# The page shows a key made by the POST before its redirect once: from the session, which
# forgets it as it is read.
NEW_KEY_SESSION = "openai_api.new_key"
MAX_BODY_BYTES = 4096


class TooManyKeys(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"You already have {limit} API keys, the most one account may hold. "
            "Revoke one you no longer use, then create the new one."
        )
        self.limit = limit


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


def live_keys(user: Any) -> Any:
    return ApiKey.objects.filter(owner=user, revoked_at__isnull=True)


def clean_key_name(value: Any) -> str:
    return clean_text(value, "The name", NAME_MAX_CHARS, allow_empty=False).strip()


def create_own_key(user: Any, name: str) -> tuple[ApiKey, str]:
    """A key a person makes for themselves, within OPENAI_MAX_KEYS_PER_USER live keys.
    The user's row is locked meanwhile, so two requests at once cannot both take the last
    place."""
    limit = settings.OPENAI_MAX_KEYS_PER_USER
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        if live_keys(user).count() >= limit:
            raise TooManyKeys(limit)
        return create_key(user, name)


def revoke(key: ApiKey) -> None:
    key.revoked_at = timezone.now()
    key.save(update_fields=["revoked_at"])


# last_used_at is shown to the minute: written at most this often, not on every request (a
# burst of 64 requests with one key made 64 writes of one row, each waiting on the last).
LAST_USED_EVERY = timedelta(minutes=1)


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
        now = timezone.now()
        if key.last_used_at is None or now - key.last_used_at >= LAST_USED_EVERY:
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key


# --- the page (/settings/keys/) -------------------------------------------------------


# The page can show a new key in full: no browser or proxy may keep a copy (no-store).
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def keys_page(request: HttpRequest) -> HttpResponse:
    error, status = None, 200
    if request.method == "POST":
        try:
            _, raw = create_own_key(request.user, clean_key_name(request.POST.get("name", "")))
        except InvalidText as exc:
            error, status = exc.message, 400
        except TooManyKeys as exc:
            error, status = str(exc), 409
        else:
            # POST-redirect-GET: reloading the page that shows the key makes no second one.
            request.session[NEW_KEY_SESSION] = raw
            return HttpResponseRedirect(reverse("api-keys"), status=303)
    new_key = request.session.pop(NEW_KEY_SESSION, None) if request.method == "GET" else None
    context = {
        "keys": live_keys(request.user),
        "new_key": new_key,
        "error": error,
        "max_keys": settings.OPENAI_MAX_KEYS_PER_USER,
    }
    return render(request, "openai_api/keys.html", context, status=status)


@login_required
@require_http_methods(["POST"])
def revoke_key(request: HttpRequest, pk: int) -> HttpResponse:
    revoke(get_object_or_404(ApiKey, pk=pk, owner=request.user, revoked_at__isnull=True))
    return redirect("api-keys")


# --- the JSON API (/api/keys/) --------------------------------------------------------


def key_json(key: ApiKey) -> dict[str, Any]:
    return {
        "id": key.pk,
        "name": key.name,
        "prefix": key.prefix,
        "created_at": key.created_at.isoformat(),
        "last_used_at": key.last_used_at.isoformat() if key.last_used_at else None,
    }


def json_view(*methods: str) -> Callable:
    """Login required (401 as JSON), method check, never cached (an answer may hold a key)."""

    def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @never_cache
        @require_http_methods(list(methods))
        @wraps(view)
        def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return error_response(401, "unauthenticated", "Log in first.")
            return view(request, *args, **kwargs)

        return inner

    return wrap


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > MAX_BODY_BYTES or len(request.body) > MAX_BODY_BYTES:
        raise InvalidText("too_large", f"The request body is larger than {MAX_BODY_BYTES} bytes.")
    try:
        data = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidText("invalid", "The body must be JSON.") from exc
    if not isinstance(data, dict):
        raise InvalidText("invalid", "The body must be a JSON object.")
    unknown = set(data) - {"name"}
    if unknown:
        raise InvalidText("invalid", f"Unknown field(s): {', '.join(sorted(unknown))}.")
    return data


@json_view("GET", "POST")
def keys_api(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        try:
            key, raw = create_own_key(request.user, clean_key_name(_body(request).get("name", "")))
        except InvalidText as exc:
            return error_response(413 if exc.code == "too_large" else 400, exc.code, exc.message)
        except TooManyKeys as exc:
            return error_response(409, "too_many_keys", str(exc))
        return JsonResponse({"key": key_json(key), "secret": raw}, status=201)
    return JsonResponse(
        {
            "keys": [key_json(k) for k in live_keys(request.user)],
            "max_keys": settings.OPENAI_MAX_KEYS_PER_USER,
        }
    )


@json_view("DELETE")
def key_api(request: HttpRequest, pk: int) -> HttpResponse:
    key = live_keys(request.user).filter(pk=pk).first()
    if key is None:
        return error_response(404, "not_found", "Not found.")
    revoke(key)
    return HttpResponse(status=204)
