"""/metrics for Prometheus, the staff latency dashboard, and the job endpoints."""

from __future__ import annotations

import hmac
import json
from pathlib import Path

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    JsonResponse,
)
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from inference import dashboard, jobs, metrics, sampler
from inference.models import Job


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
    # A scrape sees the engine as it is now, not as of the last sample.
    stats = sampler.live_stats()
    if stats is not None:
        sampler.update_prometheus(stats)
    body, content_type = metrics.exposition()
    return HttpResponse(body, content_type=content_type)


@staff_member_required
@require_GET
def dashboard_page(request: HttpRequest) -> HttpResponse:
    sampler.ensure_started()
    return render(
        request,
        "inference/dashboard.html",
        {"title": "Latency dashboard", "windows": list(dashboard.WINDOWS)},
    )


@staff_member_required
@require_GET
def dashboard_data(request: HttpRequest) -> JsonResponse:
    window = request.GET.get("window", "1h")
    if window not in dashboard.WINDOWS:
        return JsonResponse(
            {"error": f"window must be one of {list(dashboard.WINDOWS)}"}, status=400
        )
    return JsonResponse(dashboard.data(window))


@staff_member_required
@require_POST
def start_benchmark(request: HttpRequest) -> JsonResponse:
    job = jobs.start(Job.Kind.BENCHMARK, user=request.user)
    return JsonResponse({"id": job.pk, "status": job.status}, status=202)


def _job_file(job: Job, attachment: bool) -> FileResponse:
    if not job.file:
        raise Http404("no file")
    path = (Path(settings.VAR_DIR) / job.file).resolve()
    if not path.is_file() or Path(settings.VAR_DIR).resolve() not in path.parents:
        raise Http404("no file")
    return FileResponse(path.open("rb"), as_attachment=attachment, filename=path.name)


@staff_member_required
@require_GET
def job_file(request: HttpRequest, pk: int) -> FileResponse:
    return _job_file(get_object_or_404(Job, pk=pk, kind=Job.Kind.BENCHMARK), attachment=False)


@staff_member_required
@require_POST
def start_tuning(request: HttpRequest) -> JsonResponse:
    try:
        params = json.loads(request.body or b"{}")
    except ValueError:
        return JsonResponse({"error": "expected a JSON object"}, status=400)
    if not isinstance(params, dict):
        return JsonResponse({"error": "expected a JSON object"}, status=400)
    job = jobs.start(
        Job.Kind.TUNING,
        user=request.user,
        params={k: v for k, v in params.items() if k in jobs.TUNING_PARAMS},
    )
    return JsonResponse({"id": job.pk, "status": job.status}, status=202)


@staff_member_required
@require_POST
def apply_tuning(request: HttpRequest, pk: int) -> JsonResponse:
    from inference import tuning

    job = get_object_or_404(Job, pk=pk, kind=Job.Kind.TUNING, status=Job.Status.DONE)
    best = (job.result or {}).get("best")
    try:
        tuning.apply(best)
    except RuntimeError as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    return JsonResponse({"applied": best, "env": job.result.get("env", "")})


# --- conversation export (any signed-in user, their own conversations) ---------------


def _job_json(job: Job) -> dict:
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
            return HttpResponseBadRequest("expected a JSON object")
        if fmt not in ("md", "json"):
            return JsonResponse({"error": "format must be 'md' or 'json'"}, status=400)
        job = jobs.start(Job.Kind.EXPORT, user=request.user, params={"format": fmt})
        job.refresh_from_db()
        return JsonResponse(_job_json(job), status=202)
    done = Job.objects.filter(kind=Job.Kind.EXPORT, user=request.user)[:20]
    return JsonResponse({"exports": [_job_json(j) for j in done]})


@login_required
@require_GET
def export_download(request: HttpRequest, pk: int) -> FileResponse:
    job = get_object_or_404(Job, pk=pk, kind=Job.Kind.EXPORT, user=request.user)
    return _job_file(job, attachment=True)
