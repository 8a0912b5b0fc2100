"""The dashboard's pages and endpoints: staff only, figures from stored rows."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.utils import timezone

from chatapp.jobs.models import Job
from chatapp.observability import rollups
from tests.records import seed

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:  # type: ignore[no-untyped-def]
    c = Client()
    c.force_login(user)
    return c


def test_dashboard_is_for_staff_only(plain_user) -> None:
    for url in ("/admin/latency/", "/admin/latency/data?window=5m"):
        r = Client().get(url)
        assert r.status_code == 302 and "/admin/login/" in r["Location"]
        r = logged_in(plain_user).get(url)
        assert r.status_code == 302 and "/admin/login/" in r["Location"]


def test_admin_front_page_links_to_the_dashboard(staff_user) -> None:
    staff_user.is_superuser = True
    staff_user.save()
    page = logged_in(staff_user).get("/admin/").content.decode()
    assert 'href="/admin/latency/"' in page


def test_dashboard_page_loads_the_bundle(staff_user) -> None:
    page = logged_in(staff_user).get("/admin/latency/").content.decode()
    assert "/static/dashboard.js" in page and "/static/dashboard.css" in page
    assert 'id="latency-dashboard"' in page


def test_data_endpoint_serves_every_chart_from_the_stored_figures(staff_user) -> None:
    now = timezone.now()
    rows = seed(now, minutes=3)
    rollups.rollup_since(now=now)
    c = logged_in(staff_user)
    for window in ("5m", "1h", "24h", "7d"):
        data = c.get(f"/admin/latency/data?window={window}").json()
        s = data["series"]
        for key in (
            "ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "itl_p99", "tpot_p50", "tpot_p99",
            "e2e_p50", "e2e_p99", "queue_p50", "queue_p99", "out_tok_s", "running", "waiting",
            "batch_size", "kv_usage", "prefix_hit_rate", "redis_hit_rate", "spec_accept",
            "errors", "refused",
        ):  # fmt: skip
            assert len(s[key]) == len(s["t"]), (window, key)
        assert sum(v or 0 for v in s["requests"]) == len(rows), window
        assert data["summary"]["errors"] == {"busy": sum(1 for r in rows if r.error_code)}
    assert c.get("/admin/latency/data?window=2y").status_code == 400


def test_data_endpoint_shows_the_latest_kv_tier_upkeep(staff_user) -> None:
    c = logged_in(staff_user)
    assert c.get("/admin/latency/data?window=5m").json()["kv_tier"] is None
    now = timezone.now()
    for entries in (3, 7):
        Job.objects.create(
            kind=Job.Kind.KV_TIER,
            status=Job.Status.DONE,
            finished_at=now,
            result={"enabled": True, "entries": entries, "bytes": entries * 1024},
        )
    Job.objects.create(kind=Job.Kind.KV_TIER)  # still queued: not shown
    tier = c.get("/admin/latency/data?window=5m").json()["kv_tier"]
    assert tier["entries"] == 7 and tier["bytes"] == 7 * 1024 and tier["status"] == "done"


def test_benchmark_started_from_the_dashboard_records_a_failed_run(staff_user, settings) -> None:
    settings.BENCH_COMMAND = "{python} -c 'import sys; print(\"boom\"); sys.exit(3)'"
    c = logged_in(staff_user)
    r = c.post("/admin/latency/benchmarks")
    assert r.status_code == 202
    job = Job.objects.get(pk=r.json()["id"])
    assert job.status == Job.Status.FAILED and "boom" in job.log
    runs = c.get("/admin/latency/data?window=5m").json()["benchmarks"]
    assert runs[0]["id"] == job.pk and "boom" in runs[0]["log_tail"]


def test_export_api_runs_the_job_and_serves_only_the_owner(plain_user, staff_user) -> None:
    from chatapp.chat.models import Conversation

    Conversation.objects.create(owner=plain_user, title="Mine")
    c = logged_in(plain_user)
    r = c.post("/api/exports/", json.dumps({"format": "json"}), content_type="application/json")
    assert r.status_code == 202
    job = r.json()
    assert job["status"] == "done" and job["download"]
    archive = c.get(job["download"])
    assert archive.status_code == 200 and archive["Content-Disposition"].startswith("attachment")
    assert logged_in(staff_user).get(job["download"]).status_code == 404
    assert c.get("/api/exports/").json()["exports"][0]["id"] == job["id"]
