"""The periodic work has one schedule (settings.PERIODIC_TASKS, docs/jobs.md): Celery beat
runs the entries a worker can run, the web process's scheduler the others, and every
entry when there is no broker. Nothing else starts periodic work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from chatapp import db_worker
from chatapp.jobs.scheduler import Scheduler
from chatapp.observability import recording
from chatapp.observability.models import MinuteRollup

ROOT = Path(__file__).resolve().parents[2]
EVERY = {
    "engine-sample",
    "rollup-every-minute",
    "prune-every-hour",
    "kv-tier-upkeep",
    "reap-jobs-every-minute",
}


def schedules(**env: str) -> dict[str, set[str]]:
    """Beat's entries and the web process's, under the settings these variables give."""
    code = (
        "import django, json; django.setup(); from django.conf import settings; "
        "from chatapp.jobs.scheduler import Scheduler; "
        "print(json.dumps({'beat': sorted(settings.CELERY_BEAT_SCHEDULE), 'web': sorted("
        "e.name for e in Scheduler(settings.PERIODIC_TASKS, 0.0).entries)}))"
    )
    full = {**os.environ, "DJANGO_SETTINGS_MODULE": "chatapp.settings.dev", **env}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return {k: set(v) for k, v in json.loads(out.stdout.splitlines()[-1]).items()}


def test_with_no_broker_the_web_process_runs_every_entry() -> None:
    got = schedules(CELERY_BROKER_URL="", ENGINE_MODE="embedded")
    assert got["web"] == EVERY


def test_with_a_broker_beat_and_the_web_process_split_the_schedule() -> None:
    embedded = schedules(CELERY_BROKER_URL="redis://127.0.0.1:6379/1", ENGINE_MODE="embedded")
    # The sample reads this process's engine; the upkeep warms it: both stay here.
    assert embedded == {
        "beat": {"rollup-every-minute", "prune-every-hour", "reap-jobs-every-minute"},
        "web": {"engine-sample", "kv-tier-upkeep"},
    }
    distributed = schedules(CELERY_BROKER_URL="redis://127.0.0.1:6379/1", ENGINE_MODE="distributed")
    assert distributed == {
        "beat": {
            "rollup-every-minute",
            "prune-every-hour",
            "kv-tier-upkeep",
            "reap-jobs-every-minute",
        },
        "web": {"engine-sample"},
    }


# transaction=True: run_due closes the thread's connection after each task, as the
# scheduler's own thread must; inside a test's transaction that would end the test's.
@pytest.mark.django_db(transaction=True)
def test_an_entry_runs_once_its_period_has_passed(settings) -> None:  # type: ignore[no-untyped-def]
    schedule = {"rollup": {"task": "inference.rollup", "schedule": 60.0}}
    scheduler = Scheduler(schedule, now=1000.0)
    assert scheduler.run_due(1030.0) == []
    assert scheduler.run_due(1061.0) == ["rollup"]
    assert scheduler.run_due(1062.0) == []
    assert MinuteRollup.objects.count() == 0  # nothing to roll up, but it ran


@pytest.mark.django_db(transaction=True)
async def test_recording_a_request_starts_no_thread(settings) -> None:  # type: ignore[no-untyped-def]
    from asgiref.sync import sync_to_async

    settings.OBS_BACKGROUND = True
    # asgiref's thread for database calls and the serving path's database thread
    # (chatapp/db_worker.py) exist in every served process; a test run alone has not made
    # them yet. A second request must start none of its own.
    await sync_to_async(lambda: None)()
    await db_worker.run(lambda: None)
    before = {t.name for t in threading.enumerate()}
    await recording.record_request("chat", "r1", None, "stop")
    assert {t.name for t in threading.enumerate()} - before <= {"asyncio_0"}
