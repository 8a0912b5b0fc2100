"""Log-in throttling: failed log-ins are counted per account and per address
(django-ratelimit's counters in the Django cache, shared by every process when the cache
is Redis); past either limit the form refuses to check passwords at all until the window
ends, with a message that says so. Both the site's log-in page and the admin's use it."""

from __future__ import annotations

import math
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest

from chatapp.ratelimit import usage


def _counters(username: str) -> list[tuple[str, Any, int]]:
    account = username.strip().casefold()
    return [
        ("login-account", lambda _g, _r: account, settings.LOGIN_FAILURES_PER_ACCOUNT),
        ("login-address", "ip", settings.LOGIN_FAILURES_PER_ADDRESS),
    ]


def _usage(request: HttpRequest, username: str, increment: bool) -> list[dict[str, Any]]:
    """The counters' usage; none while the cache (Redis) is away: people can still log in
    then, uncounted, and a warning says so (chatapp/ratelimit.py)."""
    window = settings.LOGIN_FAILURE_WINDOW_S
    usages = []
    for group, key, limit in _counters(username):
        found = usage(request, group=group, key=key, rate=f"{limit}/{window}s", increment=increment)
        if found is None:
            return []
        usages.append(found)
    return usages


def seconds_refused(request: HttpRequest, username: str) -> int:
    """0 while this account and this address may still try; else how long until they can.
    The count is of failures so far, so the limit-th failure is the last one allowed."""
    waits = [
        u["time_left"]
        for u in _usage(request, username, increment=False)
        if u["count"] >= u["limit"]
    ]
    return max(waits, default=0)


def count_failure(request: HttpRequest, username: str) -> None:
    _usage(request, username, increment=True)


def refusal_message(seconds: int) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return (
        "Too many failed log-ins for this account or from this address. "
        f"Try again in {minutes} minute{'s' if minutes != 1 else ''}."
    )


class ThrottledLoginMixin:
    """For an AuthenticationForm: refuse before checking the password while throttled,
    and count each failure."""

    request: HttpRequest | None
    data: Any

    def clean(self) -> dict[str, Any]:
        request = self.request
        if request is None:  # a form built without a request cannot be throttled
            return super().clean()  # type: ignore[misc]
        username = str(self.data.get("username", ""))
        wait = seconds_refused(request, username)
        if wait:
            raise forms.ValidationError(refusal_message(wait), code="throttled")
        try:
            return super().clean()  # type: ignore[misc]
        except forms.ValidationError:
            count_failure(request, username)
            raise


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass
