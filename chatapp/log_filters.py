"""Filters for the settings' LOGGING. Imported while logging is configured, before the
apps load: nothing here may import Django models or the engine."""

from __future__ import annotations

import logging


def not_a_loading_probe(record: logging.LogRecord) -> bool:
    """django.request's filter: drops the 503 that the readiness probe (/healthz?engine=1,
    chatapp/views.py) answers while the model loads, the only 503 that path gives. Django
    logs every 5xx at ERROR, and a deployment polling the probe (compose health checks,
    scripts waiting for the engine) filled each start's log with them. Every other 5xx
    still logs."""
    request = getattr(record, "request", None)
    return not (
        getattr(record, "status_code", None) == 503 and getattr(request, "path", None) == "/healthz"
    )
