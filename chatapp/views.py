"""Site-wide routes outside the apps: liveness (and engine readiness), the favicon."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.templatetags.static import static

from inference.client import engine_ready


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
