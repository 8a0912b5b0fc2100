"""Site-wide routes outside the apps: liveness (and engine readiness), the favicon; the
error views Django calls itself."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponsePermanentRedirect,
    JsonResponse,
)
from django.templatetags.static import static
from django.views import csrf, defaults
from redis import Redis

from chatapp.errors import error_for_path
from chatapp.jobs.queue import broker_health
from inference.client import engine_health

log = logging.getLogger(__name__)

API_PREFIXES = ("/v1/", "/api/")
# A dependency that takes longer than this to answer the probe is down.
PROBE_TIMEOUT_S = 1.0


def healthz(request: HttpRequest) -> HttpResponse:
    """Readiness, asked afresh on every call: each dependency by name with its state
    ("ok", "off", "loading", "down"). 503 when chat cannot work now (the database, the
    channel layer or the engine down; with ?engine=1, also while the model loads); a
    broker or KV tier down degrades jobs or speed, not chat, and still answers 200."""
    checks = {
        "database": _probe(_database),
        "channel_layer": _probe(_channel_layer),
        "broker": _probe(broker_health),
        "engine": _probe(engine_health),
        "kv_tier": _probe(_kv_tier),
    }
    needed = {"database", "channel_layer", "engine"}
    down = {name for name, c in checks.items() if c["state"] == "down"}
    loading = request.GET.get("engine") and checks["engine"]["state"] == "loading"
    unavailable = bool(down & needed) or bool(loading)
    status = "unavailable" if unavailable else "degraded" if down else "ok"
    return JsonResponse({"status": status, "checks": checks}, status=503 if unavailable else 200)


def _probe(check: Callable[[], tuple[str, str]]) -> dict[str, Any]:
    try:
        state, detail = check()
    except Exception as exc:
        # The page is public: the reason goes to the log, not to whoever asks.
        log.warning("readiness: %s failed: %r", check.__name__, exc)
        state, detail = "down", f"did not answer ({type(exc).__name__})"
    return {"state": state, "detail": detail}


def _database() -> tuple[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return "ok", connection.vendor


def _redis_ping(url: str) -> None:
    client = Redis.from_url(
        url, socket_connect_timeout=PROBE_TIMEOUT_S, socket_timeout=PROBE_TIMEOUT_S
    )
    try:
        client.ping()
    finally:
        client.close()


def _channel_layer() -> tuple[str, str]:
    layer = settings.CHANNEL_LAYERS["default"]
    if "redis" not in layer["BACKEND"]:
        return "ok", "in memory (one process)"
    _redis_ping(layer["CONFIG"]["hosts"][0]["address"])
    return "ok", "redis"


def _kv_tier() -> tuple[str, str]:
    url = settings.ENGINE.get("KV_TIER_URL") or ""
    if not url:
        return "off", "ENGINE_KV_TIER_URL is empty"
    _redis_ping(url)
    return "ok", "redis"


def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico, which browsers ask for on pages that link no icon (the admin, the
    dashboard): a permanent redirect to the static icon. Resolved per request, not at
    import: with the manifest storage the static name exists only after collectstatic."""
    return HttpResponsePermanentRedirect(static("chatapp/favicon.svg"))


# Errors Django answers itself (no route, a CSRF refusal, an uncaught exception): JSON in
# the API's own shape under /v1/ and /api/ (chatapp/errors.py), Django's pages elsewhere.


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith(API_PREFIXES):
        return error_for_path(request.path, 404, "not_found", "Not found.")
    return defaults.page_not_found(request, exception or Http404())


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith(API_PREFIXES):
        return error_for_path(
            request.path, 500, "server_error", "The server failed on this request."
        )
    return defaults.server_error(request)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    if request.path.startswith(API_PREFIXES):
        return error_for_path(
            request.path,
            403,
            "csrf_failed",
            f"CSRF check failed ({reason}): send the X-CSRFToken header with the csrftoken "
            "cookie's value, from this site's own origin.",
        )
    return csrf.csrf_failure(request, reason)
