"""Log-in throttling: failed log-ins are counted per account and per address in the Django
cache (shared by every process when the cache is Redis); past either limit the form refuses
to check passwords at all until the window ends, with a message that says so. Both the
site's log-in page and the admin's use it.

The window opens at the first failure and lasts LOGIN_FAILURE_WINDOW_S. django-ratelimit's
windows (which the chat socket's and API keys' rate limits use) are buckets fixed to the
clock instead: failures that straddle a bucket's edge start again from zero, so a guesser
timed to the edge got twice the limit, and a lock could end seconds after it began."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import time
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache
from django.http import HttpRequest
from django.utils.module_loading import import_string

log = logging.getLogger(__name__)


def client_address(request: HttpRequest) -> str:
    """The client's address as django-ratelimit reads it: `RATELIMIT_IP_META_KEY` (a META
    key such as a proxy's header, a function of the request, or its dotted path) else
    REMOTE_ADDR, masked by `RATELIMIT_IPV4_MASK` (32) or `RATELIMIT_IPV6_MASK` (64: one
    client usually holds a whole /64). "" when there is none (a Unix socket)."""
    source = getattr(settings, "RATELIMIT_IP_META_KEY", None) or "REMOTE_ADDR"
    if isinstance(source, str) and "." in source:
        source = import_string(source)
    raw = source(request) if callable(source) else request.META.get(source, "")
    address = str(raw or "").strip()
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    default_mask = 32 if parsed.version == 4 else 64
    mask = getattr(settings, f"RATELIMIT_IPV{parsed.version}_MASK", default_mask)
    return str(ipaddress.ip_network(f"{parsed}/{mask}", strict=False).network_address)


def _counters(request: HttpRequest, username: str) -> list[tuple[str, int]]:
    """(cache key, limit) for the account and, where the request has one, the address;
    hashed, so any username makes a valid key."""
    pairs = [("account", username.strip().casefold(), settings.LOGIN_FAILURES_PER_ACCOUNT)]
    address = client_address(request)
    if address:
        pairs.append(("address", address, settings.LOGIN_FAILURES_PER_ADDRESS))
    return [
        (f"login-failures:{kind}:{hashlib.sha256(value.encode()).hexdigest()[:32]}", limit)
        for kind, value, limit in pairs
    ]


def claim_attempt(request: HttpRequest, username: str) -> int:
    """Count this attempt before its password is checked, and return 0 if it may go on;
    else the whole seconds until this account and address can try again (at least 1),
    with the claim given back. A counter holds failures plus attempts in flight, and the
    cache's increment is atomic: of attempts sent at the same instant, no more than the
    limit are checked. While the cache (Redis) is away: 0, and a warning."""
    window = settings.LOGIN_FAILURE_WINDOW_S
    now = time.time()
    claimed: list[str] = []
    waits = [0]
    try:
        for key, limit in _counters(request, username):
            cache.add(key, 0, timeout=window)
            try:
                count = cache.incr(key)
            except ValueError:  # expired between the add and the incr
                cache.add(key, 1, timeout=window)
                count = 1
            claimed.append(key)
            if count > limit:
                since = float(cache.get(key + ":since") or now)
                waits.append(max(1, math.ceil(since + window - now)))
    except Exception as exc:
        log.warning("log-in failure counters unavailable (%s); not limiting", exc)
        return 0
    if max(waits) > 0:
        _give_back(claimed)
    return max(waits)


def settle_attempt(request: HttpRequest, username: str, failed: bool) -> None:
    """A failure keeps its claim (and opens the window at the first one); a success gives
    it back: right passwords never count."""
    keys = [key for key, _limit in _counters(request, username)]
    if not failed:
        _give_back(keys)
        return
    try:
        window = settings.LOGIN_FAILURE_WINDOW_S
        for key in keys:
            if cache.add(key + ":since", time.time(), timeout=window):
                cache.touch(key, window)  # the first failure opens the count's window too
    except Exception as exc:
        log.warning("log-in failure counters unavailable (%s); not counting", exc)


def _give_back(keys: list[str]) -> None:
    for key in keys:
        try:
            cache.decr(key)
        except ValueError:  # expired meanwhile: nothing to give back
            pass
        except Exception as exc:
            log.warning("log-in failure counters unavailable (%s)", exc)
            return


def refusal_message(seconds: int) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return (
        "Too many failed log-ins for this account or from this address. "
        f"Try again in {minutes} minute{'s' if minutes != 1 else ''}."
    )


class ThrottledLoginMixin:
    """For an AuthenticationForm: claim the attempt before checking the password (refused
    past the limit), keep the claim of each failure."""

    request: HttpRequest | None
    data: Any

    def clean(self) -> dict[str, Any]:
        request = self.request
        if request is None:  # a form built without a request cannot be throttled
            return super().clean()  # type: ignore[misc]
        username = str(self.data.get("username", ""))
        wait = claim_attempt(request, username)
        if wait > 0:
            raise forms.ValidationError(refusal_message(wait), code="throttled")
        try:
            cleaned = super().clean()  # type: ignore[misc]
        except forms.ValidationError:
            settle_attempt(request, username, failed=True)
            raise
        except BaseException:
            settle_attempt(request, username, failed=False)
            raise
        settle_attempt(request, username, failed=False)
        return cleaned


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass
