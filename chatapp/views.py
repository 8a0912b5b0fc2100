"""Server-rendered pages: the chat shell (the UI itself is the frontend bundle) and
sign-up. Login and logout are Django's own views."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import UserCreationForm
from django.http import Http404, HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.csrf import ensure_csrf_cookie


@login_required
@ensure_csrf_cookie
def index(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "chatapp/index.html",
        {"allow_signup": settings.CHAT_ALLOW_SIGNUP},
    )


def signup(request: HttpRequest) -> HttpResponse:
    if not settings.CHAT_ALLOW_SIGNUP:
        raise Http404("sign-up is turned off")
    if request.method == "POST":
        form = UserCreationForm(request.POST)
        if form.is_valid():
            user = form.save()
            login(request, user)
            return redirect("/")
    else:
        form = UserCreationForm()
    return render(request, "registration/signup.html", {"form": form})


def healthz(request: HttpRequest) -> HttpResponse:
    """Liveness; with ?engine=1, readiness too: 503 until the model is loaded."""
    if request.GET.get("engine"):
        from inference.client import engine_ready

        if not engine_ready():
            return HttpResponse("engine loading", status=503, content_type="text/plain")
    return HttpResponse("ok", content_type="text/plain")


def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico, which browsers ask for on pages that link no icon (the admin, the
    dashboard): a permanent redirect to the static icon. Resolved per request, not at
    import: with the manifest storage the static name exists only after collectstatic."""
    return HttpResponsePermanentRedirect(static("chatapp/favicon.svg"))
