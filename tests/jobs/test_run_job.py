"""`manage.py run_job`: each offline job started from the command line, run in this
process (the test settings have no broker; test_job_queues.py queues them to real Celery
workers), and the pruning of finished Job rows."""

from __future__ import annotations

import json
import os
import sys
import zipfile
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from chatapp.chat.models import Conversation, Message
from chatapp.jobs.models import Job
from chatapp.observability import rollups
from chatapp.observability.models import MinuteRollup, RequestRecord
from inference.bench import kv_tier
from tests.records import seed

pytestmark = pytest.mark.django_db
FAKE_BENCH = Path(__file__).with_name("fake_bench.py")


def run_job(*args: str) -> tuple[str, dict]:
    """The command's output, and the JSON it ends with."""
    out = StringIO()
    call_command("run_job", *args, stdout=out)
    text = out.getvalue()
    return text, json.loads(text.strip().splitlines()[-1])


def test_rollup_and_prune_from_the_command_line() -> None:
    now = timezone.now()
    seed(now - timedelta(days=3), minutes=1, seed=3)
    seed(now, minutes=2)
    text, out = run_job("rollup")
    assert "inference.rollup running in this process" in text
    assert out["result"] >= 3 and MinuteRollup.objects.count() == 3
    _, out = run_job("prune")
    assert out["result"]["records"] == 40 and out["result"]["jobs"] == 0
    assert RequestRecord.objects.count() == 80


def test_export_runs_and_stores_its_archive(settings) -> None:  # type: ignore[no-untyped-def]
    user = get_user_model().objects.create_user("exporter")
    for i in range(2):
        Conversation.objects.create(owner=user, title=f"Chat {i}")
    text, out = run_job("export", "--user", "exporter", "--format", "json")
    job = Job.objects.get(pk=out["id"])
    assert f"job {job.pk} (export) running in this process" in text
    assert (job.kind, job.status, job.user) == ("export", "done", user)
    assert out["result"] == {"conversations": 2} and job.params == {"format": "json"}
    with zipfile.ZipFile(Path(settings.VAR_DIR) / job.file) as zf:
        data = json.loads(zf.read("conversations.json"))
    assert [c["conversation"]["title"] for c in data] == ["Chat 0", "Chat 1"]


def test_bad_command_lines_are_refused_clearly() -> None:
    with pytest.raises(CommandError, match="needs --user"):
        call_command("run_job", "export", stdout=StringIO())
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("run_job", "export", "--user", "nobody", stdout=StringIO())
    with pytest.raises(CommandError, match="conversation's id"):
        call_command("run_job", "title", stdout=StringIO())
    with pytest.raises(CommandError, match="no conversation 999999"):
        call_command("run_job", "title", "999999", stdout=StringIO())
    with pytest.raises(CommandError, match="takes no positional"):
        call_command("run_job", "rollup", "3", stdout=StringIO())
    with pytest.raises(CommandError, match="must be a JSON object"):
        call_command("run_job", "tune", "--params", "[1, 2]", stdout=StringIO())
    with pytest.raises(CommandError, match="not JSON"):
        call_command("run_job", "tune", "--params", "{grid", stdout=StringIO())
    with pytest.raises(CommandError, match="--wait is for a queued job"):
        call_command("run_job", "rollup", "--wait", stdout=StringIO())
    with pytest.raises(CommandError, match="--model is for run_job benchmark, not tune"):
        call_command("run_job", "tune", "--model", "/m", stdout=StringIO())
    with pytest.raises(CommandError, match="--format is for run_job export, not rollup"):
        call_command("run_job", "rollup", "--format", "json", stdout=StringIO())
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("run_job", "defragment", stdout=StringIO())
    assert not Job.objects.exists()  # nothing half-started


def test_benchmark_job_keeps_results_and_plot(settings) -> None:  # type: ignore[no-untyped-def]
    settings.BENCH_COMMAND = f"{{python}} {FAKE_BENCH}"
    _, out = run_job("benchmark", "--model", "/models/other")
    job = Job.objects.get(pk=out["id"])
    assert job.status == "done" and job.params == {"model": "/models/other"}
    assert job.result["single_ours"]["decode_tok_s"] == 2.5
    assert (Path(settings.VAR_DIR) / job.file).stat().st_size > 2000
    assert "--model /models/other" in job.log


def test_a_failed_benchmark_fails_the_command(settings) -> None:  # type: ignore[no-untyped-def]
    settings.BENCH_COMMAND = f"{sys.executable} -c 'raise SystemExit(3)'"
    with pytest.raises(CommandError, match=r"failed: RuntimeError: the benchmark exited with"):
        call_command("run_job", "benchmark", stdout=StringIO())
    assert Job.objects.get().status == "failed"


def test_tune_takes_the_dashboard_options_and_json_axes(settings, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    settings.ENGINE = {
        **settings.ENGINE,
        "MODEL": str(tiny_model_dir),
        "DTYPE": "float32",
        "KV_CACHE_MEMORY_MB": 32,
        "KV_TIER_URL": "",
    }
    axes = {"MAX_NUM_BATCHED_TOKENS": [64, 512]}
    _, out = run_job(
        "tune", "--requests", "4", "--rate", "30", "--synthetic",
        "--params", json.dumps({"axes": axes, "repeats": 3}),
    )  # fmt: skip
    job = Job.objects.get(pk=out["id"])
    want = {"axes": axes, "repeats": 3, "requests": 4, "rate": 30.0, "synthetic": True}
    assert job.params == want
    assert job.status == "done", job.log
    assert out["result"]["verdict"] == job.result["verdict"]


def test_kv_upkeep_with_the_tier_off_says_so(settings) -> None:  # type: ignore[no-untyped-def]
    settings.ENGINE = {**settings.ENGINE, "KV_TIER_URL": ""}
    _, out = run_job("kv-upkeep")
    assert out["result"] == {"status": "done", "enabled": False}
    assert Job.objects.get().kind == "kv_tier"


def test_title_job_for_one_conversation(tiny_engine) -> None:  # type: ignore[no-untyped-def]
    user = get_user_model().objects.create_user("titled")
    question = "How do I bake a simple loaf of bread at home without a machine?"
    conv = Conversation.objects.create(owner=user, title=question[:40])
    first = Message.objects.create(conversation=conv, role="user", text=question)
    Message.objects.create(
        conversation=conv, parent=first, role="assistant", text="Mix, knead, rise, bake."
    )
    text, out = run_job("title", str(conv.pk))
    assert "inference.generate_title running in this process" in text
    conv.refresh_from_db()
    # None: the job kept the title it had (the tiny model's answer is unusable).
    assert conv.title == (out["result"] or question[:40])


# --- pruning finished jobs -------------------------------------------------------------


def finished_job(kind: str, age: timedelta, status: str = "done") -> Job:
    job = Job.objects.create(kind=kind, status=status)
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - age)
    return job


def test_prune_drops_finished_jobs_and_their_files_keeps_unfinished(settings) -> None:  # type: ignore[no-untyped-def]
    from chatapp.jobs.files import job_dir

    day = timedelta(days=1)
    upkeep_old, upkeep_new = finished_job("kv_tier", 3 * day), finished_job("kv_tier", day / 2)
    bench_recent, bench_old = (
        finished_job("benchmark", 3 * day),
        finished_job("benchmark", 40 * day),
    )
    failed_old = finished_job("export", 31 * day, status="failed")
    running = Job.objects.create(kind="tuning", status="running")
    queued = Job.objects.create(kind="export", status="queued")
    Job.objects.filter(pk__in=[running.pk, queued.pk]).update(created_at=timezone.now() - 100 * day)
    (job_dir(bench_old) / "plot.png").write_bytes(b"png")
    kept_file = job_dir(bench_recent) / "plot.png"
    kept_file.write_bytes(b"png")

    assert rollups.prune_jobs(raw_hours=48, job_days=30) == 3
    left = set(Job.objects.values_list("pk", flat=True))
    assert left == {upkeep_new.pk, bench_recent.pk, running.pk, queued.pk}
    assert not (Path(settings.VAR_DIR) / "jobs" / f"benchmark-{bench_old.pk}").exists()
    assert kept_file.exists()
    assert upkeep_old.pk not in left and failed_old.pk not in left


def test_the_prune_job_counts_jobs_under_the_settings(settings) -> None:  # type: ignore[no-untyped-def]
    settings.OBS_RAW_RETENTION_HOURS = 1
    settings.OBS_JOB_RETENTION_DAYS = 2
    finished_job("kv_tier", timedelta(hours=2))
    finished_job("tuning", timedelta(days=3))
    keep = finished_job("tuning", timedelta(days=1))
    _, out = run_job("prune")
    assert out["result"]["jobs"] == 2
    assert list(Job.objects.values_list("pk", flat=True)) == [keep.pk]


# --- the benchmark's KV tier URL --------------------------------------------------------


def test_bench_kv_tier_url_follows_the_setting() -> None:
    env = {"ENGINE_KV_TIER_URL": "redis://tier.example:6380/2"}
    assert kv_tier.tier_url(None, env) == "redis://tier.example:6380/2"
    # An explicit --kv-tier-url wins; unset falls back to the setting's own default.
    assert kv_tier.tier_url("redis://other:6379/9", env) == "redis://other:6379/9"
    assert kv_tier.tier_url(None, {}) == kv_tier.DEFAULT_URL == "redis://127.0.0.1:6379/4"
    # Empty: the tier is off, and the section says so instead of using another Redis.
    assert kv_tier.tier_url(None, {"ENGINE_KV_TIER_URL": ""}) == ""
    assert "ENGINE_KV_TIER_URL is empty" in kv_tier.run("unused-model", "")["error"]


def test_the_benchmark_job_hands_the_server_tier_to_the_bench(settings) -> None:  # type: ignore[no-untyped-def]
    from chatapp.observability.benchmark import benchmark_env

    settings.ENGINE = {**settings.ENGINE, "KV_TIER_URL": "redis://kv.internal:6379/0"}
    assert benchmark_env()["ENGINE_KV_TIER_URL"] == "redis://kv.internal:6379/0"
    assert benchmark_env()["PATH"] == os.environ["PATH"]
    settings.ENGINE = {**settings.ENGINE, "KV_TIER_URL": ""}
    assert benchmark_env()["ENGINE_KV_TIER_URL"] == ""


def test_the_bench_drops_only_its_own_namespace() -> None:
    import redis

    url = "redis://127.0.0.1:6379/4"
    r = redis.Redis.from_url(url)
    try:
        r.ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {url}")
    mine, other = f"bench-kvtier-t{os.getpid()}", f"obs-test-keep-{os.getpid()}"
    try:
        for i in range(3):
            r.set(f"{mine}:fp:{i}", b"x")
        r.set(f"{other}:fp:0", b"y")
        kv_tier.drop_namespace(url, mine)
        assert not list(r.scan_iter(f"{mine}:*")) and r.get(f"{other}:fp:0") == b"y"
        with pytest.raises(ValueError, match="not a namespace of the bench's"):
            kv_tier.drop_namespace(url, other)
        assert r.get(f"{other}:fp:0") == b"y"
    finally:
        r.delete(f"{other}:fp:0", *r.scan_iter(f"{mine}:*"))


@pytest.mark.django_db(transaction=True)
def test_with_no_broker_a_long_job_has_its_own_thread(settings, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The in-process split matches the Celery queues: while a benchmark holds the
    long-job thread, the short jobs' thread (titles, exports of nothing) still runs."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from chatapp.jobs import queue

    # Fresh threads: the process-wide ones may still be busy with an earlier test's job.
    short = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offline-job")
    long = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offline-long-job")
    monkeypatch.setattr(queue, "_in_process", short)
    monkeypatch.setattr(queue, "_in_process_long", long)
    gate = tmp_path / "gate"
    settings.OBS_BACKGROUND = True
    settings.BENCH_COMMAND = f"{{python}} {FAKE_BENCH} --gate {gate}"
    job = queue.start(Job.Kind.BENCHMARK)
    try:
        deadline = time.monotonic() + 60
        while Job.objects.get(pk=job.pk).status != "running":
            assert time.monotonic() < deadline, Job.objects.get(pk=job.pk).log
            time.sleep(0.05)
        name = short.submit(lambda: threading.current_thread().name).result(timeout=10)
        assert name.startswith("offline-job")
        assert Job.objects.get(pk=job.pk).status == "running"
    finally:
        gate.touch()
    long.submit(lambda: None).result(timeout=60)
    assert Job.objects.get(pk=job.pk).status == "done"
    short.shutdown()
    long.shutdown()


@pytest.mark.parametrize("args", [("kv-upkeep",), ("title", "1")])
def test_generation_jobs_are_not_queued_in_embedded_mode(settings, args) -> None:  # type: ignore[no-untyped-def]
    """A Celery worker holds no engine in the embedded mode, so queueing a title or the
    tier upkeep there would only be skipped: the command says so and queues nothing."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.ENGINE = {**settings.ENGINE, "MODE": "embedded"}
    user = get_user_model().objects.create_user("queued")
    Conversation.objects.create(pk=1, owner=user, title="t")
    with pytest.raises(CommandError, match=r"only the web process has the engine.*--now"):
        call_command("run_job", *args, stdout=StringIO())


@pytest.mark.django_db(transaction=True)
def test_with_no_broker_a_job_that_fails_to_start_ends_failed_and_is_logged(
    settings, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A job's background thread has nobody waiting on it: when even marking the job
    running fails, the job ends failed with the error, never queued forever."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db.models import QuerySet

    from chatapp.jobs import queue

    long = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offline-long-job")
    monkeypatch.setattr(queue, "_in_process_long", long)
    settings.OBS_BACKGROUND = True
    settings.BENCH_COMMAND = f"{{python}} {FAKE_BENCH}"
    real_update = QuerySet.update

    def refuse_running(self, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("status") == Job.Status.RUNNING:
            raise RuntimeError("the database refused the write")
        return real_update(self, **kwargs)

    monkeypatch.setattr(QuerySet, "update", refuse_running)
    job = queue.start(Job.Kind.BENCHMARK)
    long.submit(lambda: None).result(timeout=60)
    long.shutdown()
    row = Job.objects.get(pk=job.pk)
    assert row.status == "failed" and "the database refused the write" in row.log
