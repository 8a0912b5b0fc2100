"""The WebSocket's answer to cross-site requests: a socket is accepted only from the page's
own origin (scheme, host and port, as the browser sends it in `Origin`) or from one listed
in CSRF_TRUSTED_ORIGINS, the rule Django's CSRF check applies to HTTP. Channels' own
AllowedHostsOriginValidator compares host names alone, so another port or scheme of the
same host (a dev server on :3000, plain http beside https) could open a logged-in socket."""

from __future__ import annotations

from typing import Any
from urllib.parse import ParseResult, urlparse

from channels.security.websocket import OriginValidator, WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin1")
    return None


def _is_secure(scope: dict[str, Any]) -> bool:
    """As HttpRequest.is_secure(): the ASGI scheme, or the proxy's header when
    SECURE_PROXY_SSL_HEADER names one (the proxy terminates TLS)."""
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        header, secure_value = proxy
        name = header.removeprefix("HTTP_").replace("_", "-").lower().encode("latin1")
        value = _header(scope, name)
        if value is not None:
            return value.split(",")[0].strip() == secure_value
    return scope.get("scheme") == "wss"


def _allowed_hosts() -> list[str]:
    hosts = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not hosts:
        hosts = [".localhost", "127.0.0.1", "[::1]"]  # Django's own DEBUG default
    return hosts


class SameOriginValidator(OriginValidator):
    def __init__(self, application: Any) -> None:
        super().__init__(application, [])

    def allowed_origins_for(self, scope: dict[str, Any]) -> list[str]:
        origins = []
        host = _header(scope, b"host")
        if host:
            domain, _port = split_domain_port(host)
            if domain and validate_host(domain, _allowed_hosts()):
                scheme = "https" if _is_secure(scope) else "http"
                origins.append(f"{scheme}://{host.lower()}")
        # Django writes a wildcard as https://*.example.com, Channels as https://.example.com.
        origins.extend(o.replace("://*.", "://.") for o in settings.CSRF_TRUSTED_ORIGINS)
        return origins

    def origin_allowed(self, scope: dict[str, Any], origin: ParseResult | None) -> bool:
        if origin is None:
            return False
        return any(self.match_allowed_origin(origin, p) for p in self.allowed_origins_for(scope))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator guards WebSocket connections only")
        raw = _header(scope, b"origin")
        origin = urlparse(raw.lower()) if raw else None
        if self.origin_allowed(scope, origin):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
