"""The JSON HTTP API the browser UI uses (docs/http.md). Session-authenticated."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestDataTooBig
from django.db.models import Q
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET, require_http_methods

from chatapp.chat import conversations as conv_logic
from chatapp.chat.conversations import InvalidSettings, NotFound, clean_title
from chatapp.chat.export import conversation_markdown, conversation_payload
from chatapp.chat.models import Conversation
from chatapp.errors import error_response
from chatapp.jobs import queue
from chatapp.jobs.files import file_response
from chatapp.jobs.models import Job
from chatapp.text import InvalidText, clean_text
from inference.client import engine_ready, get_engine_client, list_models
from inference.engine import EngineError

MAX_BODY_BYTES = 64 * 1024


class BodyTooLarge(Exception):
    pass


def api_view(*methods: str) -> Callable:
    """Login required (401 as JSON, not a redirect), method check, JSON errors."""

    def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @require_http_methods(list(methods))
        @wraps(view)
        def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return error_response(401, "unauthenticated", "Log in first.")
            try:
                return view(request, *args, **kwargs)
            except NotFound:
                return error_response(404, "not_found", "Not found.")
            except (InvalidSettings, InvalidText) as exc:
                return error_response(400, getattr(exc, "code", "invalid"), str(exc))
            except BodyTooLarge:
                return error_response(
                    413, "too_large", f"The request body is larger than {MAX_BODY_BYTES} bytes."
                )

        return inner

    return wrap


def declared_length(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


def read_json(request: HttpRequest) -> dict[str, Any]:
    # The declared length first: reading a body over DATA_UPLOAD_MAX_MEMORY_SIZE makes
    # Django answer with its own 400 page instead of this API's 413.
    if declared_length(request) > MAX_BODY_BYTES:
        raise BodyTooLarge
    try:
        body = request.body
    except RequestDataTooBig as exc:
        raise BodyTooLarge from exc
    if len(body) > MAX_BODY_BYTES:
        raise BodyTooLarge
    try:
        data = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidSettings("body must be JSON (and nested less deeply)") from exc
    if not isinstance(data, dict):
        raise InvalidSettings("body must be a JSON object")
    return data


@api_view("GET")
def me(request: HttpRequest) -> HttpResponse:
    return JsonResponse(
        {"username": request.user.get_username(), "is_staff": request.user.is_staff}
    )


@api_view("GET", "POST")
def conversations(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        data = read_json(request)
        unknown = set(data) - {"title", "settings", "model"}
        if unknown:
            raise InvalidSettings(f"unknown field(s): {', '.join(sorted(unknown))}")
        model = conv_logic.clean_model(data["model"]) if "model" in data else ""
        conv = conv_logic.create_conversation(
            request.user,
            clean_title(data.get("title", "")),
            conv_logic.clean_settings(data.get("settings")),
            model,
        )
        return JsonResponse(conv_logic.conversation_json(conv), status=201)
    qs = Conversation.objects.filter(owner=request.user)
    q = clean_text(request.GET.get("q", ""), "The search", settings.CHAT_MAX_MESSAGE_CHARS).strip()
    if q:
        qs = qs.filter(Q(title__icontains=q) | Q(messages__text__icontains=q)).distinct()
    items = [conv_logic.conversation_json(c) for c in qs.order_by("-updated_at", "-id")[:500]]
    return JsonResponse({"conversations": items})


@api_view("GET", "PATCH", "DELETE")
def conversation(request: HttpRequest, pk: int) -> HttpResponse:
    conv = conv_logic.get_conversation(request.user, pk)
    if request.method == "DELETE":
        conv_logic.delete_conversation(conv)
        return HttpResponse(status=204)
    if request.method == "PATCH":
        data = read_json(request)
        unknown = set(data) - {"title", "settings", "active_message", "model"}
        if unknown:
            raise InvalidSettings(f"unknown field(s): {', '.join(sorted(unknown))}")
        conv = conv_logic.update_conversation(conv, data)
    return JsonResponse(
        {
            "conversation": conv_logic.conversation_json(conv),
            "messages": conv_logic.branch_json(conv),
        }
    )


@api_view("GET")
def export(request: HttpRequest, pk: int, fmt: str) -> HttpResponse:
    conv = conv_logic.get_conversation(request.user, pk)
    slug = f"conversation-{conv.pk}"
    if fmt == "md":
        response = HttpResponse(
            conversation_markdown(conv), content_type="text/markdown; charset=utf-8"
        )
        response["Content-Disposition"] = f'attachment; filename="{slug}.md"'
        return response
    response = JsonResponse(conversation_payload(conv), json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="{slug}.json"'
    return response


@api_view("GET")
def engine_info(request: HttpRequest) -> HttpResponse:
    """The default model's engine (the models served: GET /api/models/)."""
    live = None
    max_model_len = None
    if engine_ready():
        client = get_engine_client()
        live, max_model_len = client.stats(), client.max_model_len
    return JsonResponse(
        {
            "model": conv_logic.served_default(),
            "ready": live is not None,
            "max_model_len": max_model_len,
            "stats": live,
            "speculative_modes": [],
            "defaults": {k: v for k, v in settings.CHAT_DEFAULTS.items() if k != "system_prompt"},
            "max_new_tokens": settings.CHAT_MAX_NEW_TOKENS,
            "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
        }
    )


@api_view("GET")
def models(request: HttpRequest) -> HttpResponse:
    """The models a conversation can use (the picker's list), the default first."""
    try:
        served = list_models()
    except EngineError as exc:
        return error_response(503, "engine_unavailable", str(exc))
    return JsonResponse(
        {
            "default": next((m.id for m in served if m.default), ""),
            "models": [
                {"id": m.id, "default": m.default, "context_tokens": m.context_tokens}
                for m in served
            ],
        }
    )


@api_view("GET")
def chat_limits(request: HttpRequest) -> HttpResponse:
    """Limits and defaults of the per-conversation settings and of a message, taken from
    the same constants and settings the server validates with."""
    context_tokens = get_engine_client().max_model_len if engine_ready() else None
    return JsonResponse(conv_logic.settings_limits(context_tokens))


# --- exports of all of a user's conversations (a job: chatapp/jobs) -----------------


def _job_json(job: Job) -> dict[str, Any]:
    return {
        "id": job.pk,
        "status": job.status,
        "format": job.params.get("format"),
        "created_at": job.created_at.isoformat(),
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "download": f"/api/exports/{job.pk}/download" if job.status == Job.Status.DONE else None,
    }


@login_required
@require_http_methods(["GET", "POST"])
def exports(request: HttpRequest) -> JsonResponse:
    if request.method == "POST":
        try:
            fmt = json.loads(request.body or b"{}").get("format", "md")
        except (ValueError, AttributeError):
            return error_response(400, "invalid", "expected a JSON object")
        if fmt not in ("md", "json"):
            return error_response(400, "invalid", "format must be 'md' or 'json'")
        job = queue.start(Job.Kind.EXPORT, user=request.user, params={"format": fmt})
        job.refresh_from_db()
        return JsonResponse(_job_json(job), status=202)
    done = Job.objects.filter(kind=Job.Kind.EXPORT, user=request.user)[:20]
    return JsonResponse({"exports": [_job_json(j) for j in done]})


@login_required
@require_GET
def export_download(request: HttpRequest, pk: int) -> FileResponse:
    job = get_object_or_404(Job, pk=pk, kind=Job.Kind.EXPORT, user=request.user)
    return file_response(job, attachment=True)
