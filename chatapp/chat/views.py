"""The chat page: a shell around the frontend bundle, which is the UI itself."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie


@login_required
@ensure_csrf_cookie
def index(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "chat/index.html",
        {"allow_signup": settings.CHAT_ALLOW_SIGNUP},
    )
