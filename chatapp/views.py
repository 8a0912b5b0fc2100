"""Site-wide routes outside the apps: liveness (and engine readiness), the favicon; the
error views Django calls itself."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.views import csrf, defaults

from chatapp.errors import error_for_path
from inference.client import engine_ready

API_PREFIXES = ("/v1/", "/api/")


def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness; with ?engine=1, readiness too: 503 until the model is loaded."""
    if request.GET.get("engine") and not engine_ready():
        return HttpResponse("engine loading", status=503, content_type="text/plain")
    return HttpResponse("ok", content_type="text/plain")


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
