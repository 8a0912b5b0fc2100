"""The JSON error shapes, in one place (a declared shared module, as chatapp/events.py).

The app's own HTTP API (docs/http.md: /api/..., the dashboard's endpoints) answers
`{"error": {"code": ..., "message": ...}}`; the OpenAI-compatible API (docs/api.md: /v1)
answers OpenAI's `{"error": {"message", "type", "param", "code"}}`. `error_for_path`
picks the shape a path's clients expect (the database middleware answers every path).
"""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse


def error_response(status: int, code: str, message: str) -> JsonResponse:
    """An error of the app's own API."""
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def openai_error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> dict[str, dict[str, str | None]]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def openai_error_response(
    status: int, message: str, type_: str, code: str | None = None, param: str | None = None
) -> JsonResponse:
    """An error of the OpenAI-compatible API."""
    return JsonResponse(openai_error_body(message, type_, code, param), status=status)


def error_for_path(path: str, status: int, code: str, message: str) -> HttpResponse:
    """The error in the shape the path's clients read: OpenAI's under /v1/, the app's own
    under /api/, plain text for pages."""
    if path.startswith("/v1/"):
        type_ = "server_error" if status >= 500 else "invalid_request_error"
        return openai_error_response(status, message, type_, code)
    if path.startswith("/api/"):
        return error_response(status, code, message)
    return HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")
