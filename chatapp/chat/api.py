"""The JSON HTTP API the browser UI uses (docs/http.md). Session-authenticated."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import wraps
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db.models import Q
from django.http import (
    FileResponse,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_http_methods

from chatapp import ratelimit
from chatapp.chat import attachments, feedback, imports, instructions, prompts
from chatapp.chat import conversations as conv_logic
from chatapp.chat.attachments import AttachmentRefused, AttachmentsInvalid
from chatapp.chat.conversations import InvalidSettings, NotFound, clean_title
from chatapp.chat.export import (
    FORMATS,
    conversation_markdown,
    conversation_payload,
    conversation_text,
)
from chatapp.chat.imports import ImportRefused
from chatapp.chat.models import Conversation
from chatapp.errors import error_response
from chatapp.jobs import queue
from chatapp.jobs.files import file_response
from chatapp.jobs.models import Job
from chatapp.text import InvalidText, clean_text
from inference.client import (
    default_model,
    engine_ready,
    get_engine_client,
    list_models,
    loaded_clients,
    prefix_cache_salt,
)
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
            except (InvalidSettings, InvalidText, AttachmentsInvalid) as exc:
                return error_response(400, getattr(exc, "code", "invalid"), str(exc))
            except AttachmentRefused as exc:
                return error_response(exc.status, exc.code, exc.message)
            except ImportRefused as exc:
                return error_response(exc.status, exc.code, exc.message)
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
            instructions.with_instructions(
                request.user, conv_logic.clean_settings(data.get("settings"))
            ),
            model,
        )
        return JsonResponse(conv_logic.conversation_json(conv), status=201)
    # Archived conversations are out of the list; `?archived=1` lists them alone.
    archived = request.GET.get("archived") in ("1", "true")
    # Temporary chats are never listed nor found (chatapp/chat/temporary.py).
    qs = Conversation.objects.filter(owner=request.user, archived=archived, temporary=False)
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
        unknown = (
            set(data)
            - {"title", "settings", "active_message", "model"}
            - set(conv_logic.ORGANISING)
        )
        if unknown:
            raise InvalidSettings(f"unknown field(s): {', '.join(sorted(unknown))}")
        conv = conv_logic.update_conversation(conv, data)
    messages, older = conv_logic.branch_json(conv, *page_of(request))
    return JsonResponse(
        {"conversation": conv_logic.conversation_json(conv), "messages": messages, "older": older}
    )


def page_of(request: HttpRequest) -> tuple[int | None, int]:
    """`?before=<message id>&limit=<n>`: which page of the branch to answer."""
    try:
        before = int(request.GET["before"]) if "before" in request.GET else None
        limit = int(request.GET.get("limit", conv_logic.MESSAGES_PAGE))
    except ValueError as exc:
        raise InvalidSettings("before and limit must be whole numbers") from exc
    if not 1 <= limit <= conv_logic.MESSAGES_PAGE_MAX:
        raise InvalidSettings(f"limit must be between 1 and {conv_logic.MESSAGES_PAGE_MAX}")
    return before, limit


@api_view("GET")
def export(request: HttpRequest, pk: int, fmt: str) -> HttpResponse:
    conv = conv_logic.get_conversation(request.user, pk)
    slug = f"conversation-{conv.pk}"
    if fmt in ("md", "txt"):
        text, kind = (
            (conversation_markdown(conv), "text/markdown")
            if fmt == "md"
            else (conversation_text(conv), "text/plain")
        )
        response = HttpResponse(text, content_type=f"{kind}; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{slug}.{fmt}"'
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
                {
                    "id": m.id,
                    "default": m.default,
                    "context_tokens": m.context_tokens,
                    "architecture": m.architecture,
                    "weight_format": m.weight_format,
                }
                for m in served
            ],
        }
    )


@api_view("GET")
def chat_limits(request: HttpRequest) -> HttpResponse:
    """Limits and defaults of the per-conversation settings and of a message, taken from
    the same constants and settings the server validates with."""
    context_tokens = get_engine_client().max_model_len if engine_ready() else None
    limits = conv_logic.settings_limits(context_tokens)
    # A new chat's system prompt is the user's custom instructions, where they wrote any
    # (instructions.with_instructions); otherwise the deployment's default stands.
    prompt = instructions.prompt_of(request.user)
    if prompt:
        limits["system_prompt"]["default"] = prompt
    return JsonResponse(limits)


@api_view("GET", "PUT")
def custom_instructions(request: HttpRequest) -> HttpResponse:
    """The user's custom instructions, which each new chat of theirs starts with."""
    if request.method == "PUT":
        values = instructions.save(request.user, read_json(request))
    else:
        values = instructions.of(request.user)
    return JsonResponse(instructions.as_json(values))


# --- documents attached to messages (chatapp/chat/attachments.py) -------------------

# Room for the multipart framing around the file.
MULTIPART_OVERHEAD = 64 * 1024


@require_http_methods(["POST"])
async def upload_attachment(request: HttpRequest) -> HttpResponse:
    """A file for the message being written (multipart field `file`): its text read, kept
    until that message is sent. Async, so that a PDF's reader process is killed when the
    client goes away (Django cancels the view)."""
    user = await request.auser()
    if not user.is_authenticated:
        return error_response(401, "unauthenticated", "Log in first.")
    try:
        return await _upload_attachment(request, user)
    except (InvalidSettings, AttachmentRefused) as exc:
        return error_response(*_refusal(exc))


def _refusal(exc: InvalidSettings | AttachmentRefused) -> tuple[int, str, str]:
    if isinstance(exc, AttachmentRefused):
        return exc.status, exc.code, exc.message
    return 400, "invalid", str(exc)


async def _upload_attachment(request: HttpRequest, user: Any) -> HttpResponse:
    limit = settings.CHAT_ATTACHMENT_MAX_BYTES
    if declared_length(request) > limit + MULTIPART_OVERHEAD:
        raise AttachmentRefused(
            "too_large",
            f"The file is larger than {attachments.human_size(limit)}, the most that can be "
            "attached.",
            413,
        )
    upload = await sync_to_async(request.FILES.get)("file")
    if upload is None:
        raise InvalidSettings("send the file as the multipart field 'file'")
    name = attachments.clean_name(upload.name)
    if upload.size is not None and upload.size > limit:
        raise attachments.too_large(name, upload.size)
    data = await sync_to_async(upload.read)()
    kind, text = await attachments.extract_async(name, data)
    client = get_engine_client() if engine_ready() else None
    attachment = await sync_to_async(attachments.keep_pending)(
        user, name, kind, text, len(data), client
    )
    return JsonResponse(attachments.attachment_json(attachment), status=201)


@api_view("GET", "DELETE")
def attachment(request: HttpRequest, pk: int) -> HttpResponse:
    """One of this user's documents with its text; DELETE removes one not sent yet."""
    found = conv_logic.get_attachment(request.user, pk)
    if request.method == "DELETE":
        if found.message_id is not None:
            raise InvalidSettings("a document that was sent stays with its message")
        found.delete()
        return HttpResponse(status=204)
    return JsonResponse(attachments.attachment_json(found, with_text=True))


@api_view("POST")
def prompt_size(request: HttpRequest) -> HttpResponse:
    """The tokens a send would put before the model (the conversation so far, the
    documents, the words), and whether that fits its context window: the composer shows
    it before sending, in the words a send past the window is refused with."""
    # Counted before any work: a count tokenizes on the cores every reply shares.
    per_minute = settings.CHAT_PROMPT_SIZE_PER_MINUTE
    counted = ratelimit.usage(
        request, group="prompt-size", key="user", rate=f"{per_minute}/m", increment=True
    )
    if counted and counted["should_limit"]:
        refused = error_response(
            429, "rate_limited", f"At most {per_minute} prompt-size counts a minute."
        )
        # time_left is whole seconds to the window's edge, whose last second still counts.
        refused["Retry-After"] = str(max(1, math.ceil(counted.get("time_left", 60)) + 1))
        return refused
    data = read_json(request)
    unknown = set(data) - {"conversation_id", "text", "attachments", "settings", "model"}
    if unknown:
        raise InvalidSettings(f"unknown field(s): {', '.join(sorted(unknown))}")
    text = clean_text(data.get("text", ""), "The message", settings.CHAT_MAX_MESSAGE_CHARS)
    documents = attachments.usable(request.user, attachments.clean_ids(data.get("attachments")))
    conv_id = data.get("conversation_id")
    if conv_id is None:
        conv_settings = conv_logic.clean_settings(data.get("settings"))
        conv = conv_logic.new_conversation(
            request.user, "", instructions.with_instructions(request.user, conv_settings)
        )
        branch: list = []
    else:
        conv = conv_logic.get_conversation(request.user, conv_id)
    # The model the send would go to (the picker's, else the conversation's); counted only
    # on an engine already up here: a count never loads a model.
    named = data.get("model")
    model = conv_logic.model_field(named) if named is not None else conv.model
    try:
        default = default_model()
    except EngineError:
        default = ""
    client = loaded_clients().get(model or default)
    if client is None:
        return JsonResponse(
            {
                "prompt_tokens": None,
                "context_tokens": None,
                "fits": True,
                "message": None,
                "attachments": [{"id": a.pk, "tokens": a.tokens} for a in documents],
            }
        )
    if conv.pk is not None:
        # Past the window by its messages' stored counts: refused before its history is
        # read or tokenized (a 100,000-message import took 7-17 s to say so).
        past = conv_logic.too_long_by_count(client, conv, conv.active_leaf_id)
        if past:
            return JsonResponse(
                {
                    "prompt_tokens": None,
                    "context_tokens": client.max_model_len,
                    "fits": False,
                    "message": past,
                    "attachments": [{"id": a.pk, "tokens": a.tokens} for a in documents],
                }
            )
        branch = conv_logic.active_branch(conv)
    salt = prefix_cache_salt(request.user.pk)
    legacy = client.model_name == default
    prompt, chosen = conv_logic.prompt_with_documents(
        client, conv, branch, text, documents, salt, legacy=legacy
    )
    too_long = conv_logic.too_long_words(client, prompt)
    return JsonResponse(
        {
            "prompt_tokens": prompt.length,
            "context_tokens": client.max_model_len,
            "fits": too_long is None,
            "message": too_long,
            # The documents do not fit whole: this many passages of them would be sent.
            "passages": len(chosen),
            "attachments": [
                {"id": a.pk, "tokens": attachments.count_tokens(client, a.name, a.text)}
                for a in documents
            ],
        }
    )


@api_view("POST")
def import_conversations(request: HttpRequest) -> HttpResponse:
    """Conversations from a ChatGPT export or this app's JSON export, sent as the request
    body (the file as it is: JSON or zip). All of the file, or nothing."""
    limit = settings.CHAT_IMPORT_MAX_BYTES
    if declared_length(request) > limit:
        raise imports.too_large(limit)
    with imports.spool(request, limit) as upload:
        created = imports.import_file(request.user, upload)
    return JsonResponse(
        {
            "imported": len(created),
            "conversations": [conv_logic.conversation_json(c) for c in created],
        },
        status=201,
    )


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


@api_view("GET", "POST")
def exports(request: HttpRequest) -> JsonResponse:
    if request.method == "POST":
        try:
            fmt = json.loads(request.body or b"{}").get("format", "md")
        except (ValueError, AttributeError):
            return error_response(400, "invalid", "expected a JSON object")
        if fmt not in FORMATS:
            return error_response(400, "invalid", "format must be 'md', 'json' or 'txt'")
        try:
            job = queue.start(Job.Kind.EXPORT, user=request.user, params={"format": fmt})
        except queue.JobNotQueued as exc:  # the broker is away: failed now, not queued forever
            return JsonResponse(_job_json(exc.job), status=503)
        job.refresh_from_db()
        return JsonResponse(_job_json(job), status=202)
    done = Job.objects.filter(kind=Job.Kind.EXPORT, user=request.user)[:20]
    return JsonResponse({"exports": [_job_json(j) for j in done]})


@api_view("GET")
def export_download(request: HttpRequest, pk: int) -> FileResponse:
    job = get_object_or_404(Job, pk=pk, kind=Job.Kind.EXPORT, user=request.user)
    return file_response(job, attachment=True)


# --- feedback on replies (chatapp/chat/feedback.py) ----------------------------------


@api_view("PUT")
def message_feedback(request: HttpRequest, pk: int) -> HttpResponse:
    """The owner's thumbs up or down on a reply, with an optional comment; a null rating
    takes it back."""
    rating, comment = feedback.clean(read_json(request))
    message = feedback.give(conv_logic.get_message(request.user, pk), rating, comment)
    return JsonResponse({"message_id": message.pk, "feedback": feedback.feedback_json(message)})


def _staff_only(request: HttpRequest) -> HttpResponse | None:
    if not request.user.is_staff:
        return error_response(403, "forbidden", "Only staff can read the feedback.")
    return None


@api_view("GET")
def feedback_summary(request: HttpRequest) -> HttpResponse:
    """The staff dashboard's feedback panel: counts per model, the newest rated replies."""
    return _staff_only(request) or JsonResponse(feedback.summary())


@api_view("GET")
def feedback_export(request: HttpRequest) -> HttpResponse:
    """Every rated reply with its conversation up to it, as JSON Lines (for evaluation)."""
    refused = _staff_only(request)
    if refused:
        return refused
    response = StreamingHttpResponse(
        feedback.export_lines(), content_type="application/x-ndjson; charset=utf-8"
    )
    response["Content-Disposition"] = 'attachment; filename="feedback.jsonl"'
    return response


# --- saved prompts (chatapp/chat/prompts.py) -----------------------------------------


@api_view("GET", "POST")
def saved_prompts(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        created = prompts.save(request.user, prompts.clean(read_json(request)))
        return JsonResponse(prompts.prompt_json(created), status=201)
    mine = request.user.saved_prompts.all()[: prompts.MAX_PER_USER]
    return JsonResponse({"prompts": [prompts.prompt_json(p) for p in mine]})


@api_view("PATCH", "DELETE")
def saved_prompt(request: HttpRequest, pk: int) -> HttpResponse:
    found = prompts.get(request.user, pk)
    if request.method == "DELETE":
        found.delete()
        return HttpResponse(status=204)
    changed = prompts.save(request.user, prompts.clean(read_json(request), partial=True), found)
    return JsonResponse(prompts.prompt_json(changed))
