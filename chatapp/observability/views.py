"""/metrics for Prometheus, the staff latency dashboard, and its benchmark and tuning jobs."""

from __future__ import annotations

import hmac
import json
from typing import Any

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_POST

from chatapp.errors import error_response
from chatapp.jobs import queue
from chatapp.jobs.files import file_response
from chatapp.jobs.models import Job
from chatapp.observability import dashboard, engine_samples, tuning
from inference import metrics


def _bearer_ok(request: HttpRequest) -> bool:
    token = settings.METRICS_BEARER_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), token)


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _bearer_ok(request):
        user = request.user
        if not user.is_authenticated:
            response = HttpResponse("authentication required\n", status=401)
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        if not user.is_staff:
            return HttpResponse("staff only\n", status=403)
    # A scrape sees the engines as they are now, not as of the last sample.
    engine_samples.refresh_prometheus()
    body, content_type = metrics.exposition(settings.METRICS_REPLICA)
    return HttpResponse(body, content_type=content_type)


@staff_member_required
@require_GET
def dashboard_page(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "observability/dashboard.html",
        {"title": "Latency dashboard", "windows": list(dashboard.WINDOWS)},
    )


@staff_member_required
@require_GET
def dashboard_data(request: HttpRequest) -> JsonResponse:
    window = request.GET.get("window", "1h")
    if window not in dashboard.WINDOWS:
        return error_response(400, "invalid", f"window must be one of {list(dashboard.WINDOWS)}")
    return JsonResponse(dashboard.data(window))


@staff_member_required
@require_POST
def start_benchmark(request: HttpRequest) -> JsonResponse:
    return _started(Job.Kind.BENCHMARK, user=request.user)


@staff_member_required
@require_GET
def job_file(request: HttpRequest, pk: int) -> FileResponse:
    return file_response(get_object_or_404(Job, pk=pk, kind=Job.Kind.BENCHMARK), attachment=False)


def _started(kind: str, **fields: Any) -> JsonResponse:
    """202 with the queued job, or 503 when the broker did not take it (its row failed)."""
    try:
        job = queue.start(kind, **fields)
    except queue.JobNotQueued as exc:
        return JsonResponse({"id": exc.job.pk, "status": exc.job.status}, status=503)
    return JsonResponse({"id": job.pk, "status": job.status}, status=202)


@staff_member_required
@require_POST
def cancel_job(request: HttpRequest, pk: int) -> JsonResponse:
    """The dashboard's Cancel button: a queued or running benchmark or tuning run."""
    job = get_object_or_404(Job, pk=pk, kind__in=(Job.Kind.BENCHMARK, Job.Kind.TUNING))
    if not queue.cancel(job, request.user.get_username()):
        return error_response(409, "conflict", f"job {pk} has ended already ({job.status})")
    return JsonResponse({"id": job.pk, "status": Job.Status.CANCELLED})


@staff_member_required
@require_POST
def start_tuning(request: HttpRequest) -> JsonResponse:
    try:
        params = json.loads(request.body or b"{}")
    except ValueError:
        return error_response(400, "invalid", "expected a JSON object")
    if not isinstance(params, dict):
        return error_response(400, "invalid", "expected a JSON object")
    return _started(
        Job.Kind.TUNING,
        user=request.user,
        params={k: v for k, v in params.items() if k in tuning.PARAMS},
    )


@staff_member_required
@require_POST
def apply_tuning(request: HttpRequest, pk: int) -> JsonResponse:
    job = get_object_or_404(Job, pk=pk, kind=Job.Kind.TUNING, status=Job.Status.DONE)
    best = (job.result or {}).get("best")
    try:
        tuning.apply(best)
    except RuntimeError as exc:
        return error_response(409, "conflict", str(exc))
    return JsonResponse({"applied": best, "env": job.result.get("env", "")})
