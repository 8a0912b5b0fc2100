"""Turn a database that is briefly locked or away into a clear 503, not a bare 500."""

from __future__ import annotations

import logging

from django.db import DatabaseError, DataError
from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

from chatapp.errors import error_for_path

log = logging.getLogger(__name__)

MESSAGE = "The server cannot reach its database just now. Nothing was changed; try again."
REFUSED = "The database refused a value in this request. Nothing was changed."


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """Sync and async (MiddlewareMixin): one sync-only middleware would run every async
    view inside a thread, where Django cannot cancel it when its client goes away."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DatabaseError):
            return None
        if isinstance(exception, DataError):
            # A value the database cannot hold (input validation should have caught it):
            # the request is at fault, and retrying it would fail again, so not a 503.
            log.error("database refused a value on %s: %s", request.path, exception)
            return self.refused(request)
        log.error("database unavailable on %s: %s", request.path, exception)
        response = error_for_path(request.path, 503, "unavailable", MESSAGE)
        response["Retry-After"] = "2"
        return response

    @staticmethod
    def refused(request: HttpRequest) -> HttpResponse:
        code = "invalid_value" if request.path.startswith("/v1/") else "invalid"
        return error_for_path(request.path, 400, code, REFUSED)
