"""Start an offline job from the command line, the way the dashboard and beat do.

    python manage.py run_job rollup|prune|kv-upkeep
    python manage.py run_job title CONVERSATION_ID
    python manage.py run_job benchmark [--model PATH]
    python manage.py run_job export --user NAME [--format md|json]
    python manage.py run_job tune [--requests N --rate R --synthetic ...] [--params JSON]

With a broker (CELERY_BROKER_URL) the job is queued through Celery, on the queue its
route names (tuning, benchmark and exports on CELERY_LONG_QUEUE), and the command prints
the Job id and task id; `--wait` then waits for the result. With no broker, or with
`--now`, it runs in this process and prints the result.
"""

from __future__ import annotations

import json
import time
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from chatapp.celery import app
from chatapp.jobs import queue
from chatapp.jobs.models import Job

# Kinds that are one Celery task with no Job row of their own to start from, by task name
# (the apps' tasks.py define them; this command imports none of the apps).
TASK_KINDS = {
    "rollup": "inference.rollup",
    "prune": "inference.prune",
    "title": "inference.generate_title",
    "kv-upkeep": "inference.kv_tier_upkeep",  # makes its own Job row (kind kv_tier) each pass
}
# Kinds started as a Job row, like the dashboard starts them (chatapp/jobs/queue.py: start).
JOB_KINDS = {"benchmark": Job.Kind.BENCHMARK, "export": Job.Kind.EXPORT, "tune": Job.Kind.TUNING}
FINISHED = (Job.Status.DONE, Job.Status.FAILED)
# The options that only some kinds take; given to another kind they are refused, not ignored.
KIND_OPTIONS = {
    "user": "export",
    "format": "export",
    "model": "benchmark",
    "requests": "tune",
    "rate": "tune",
    "synthetic": "tune",
    "ttft_target": "tune",
    "tpot_target": "tune",
    "params": "tune",
}


class Command(BaseCommand):
    help = (
        "Run an offline job: queued through Celery when a broker is configured (--wait for "
        "its result), else (or with --now) in this process."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", choices=[*TASK_KINDS, *JOB_KINDS])
        parser.add_argument(
            "conversation", nargs="?", type=int, help="title: the conversation's id"
        )
        parser.add_argument("--now", action="store_true", help="run in this process")
        parser.add_argument(
            "--wait", action="store_true", help="queued: wait for the job to finish"
        )
        parser.add_argument(
            "--timeout", type=float, default=3600.0, help="seconds --wait waits (3600)"
        )
        parser.add_argument("--user", help="export: whose conversations")
        parser.add_argument("--format", choices=("md", "json", "txt"), help="export (default md)")
        parser.add_argument("--model", help="benchmark: a model folder (default: the engine's)")
        parser.add_argument("--requests", type=int, help="tune: requests per trial")
        parser.add_argument("--rate", type=float, help="tune: arrivals per second")
        parser.add_argument(
            "--synthetic", action="store_true", help="tune: synthetic prompts, not recorded ones"
        )
        parser.add_argument("--ttft-target", type=float, help="tune: TTFT target, seconds")
        parser.add_argument("--tpot-target", type=float, help="tune: TPOT target, seconds")
        parser.add_argument(
            "--params", help="tune: a JSON object of tuning parameters (repeats, axes too)"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        kind = opts["kind"]
        if kind == "title" and opts["conversation"] is None:
            raise CommandError("run_job title needs the conversation's id")
        if kind != "title" and opts["conversation"] is not None:
            raise CommandError(f"run_job {kind} takes no positional argument")
        for opt, owner in KIND_OPTIONS.items():
            if opts[opt] not in (None, False) and kind != owner:
                raise CommandError(f"--{opt.replace('_', '-')} is for run_job {owner}, not {kind}")
        in_process = opts["now"] or settings.CELERY_TASK_ALWAYS_EAGER
        if opts["wait"] and in_process:
            raise CommandError("--wait is for a queued job; this one runs in this process")
        if kind in JOB_KINDS:
            self.run_job(JOB_KINDS[kind], self.job_params(kind, opts), opts, in_process)
        else:
            self.run_task(kind, opts, in_process)

    # --- Job rows (benchmark, export, tune) ----------------------------------------------

    def job_params(self, kind: str, opts: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if kind == "export":
            if not opts["user"]:
                raise CommandError("run_job export needs --user NAME")
            try:
                user = get_user_model().objects.get_by_natural_key(opts["user"])
            except get_user_model().DoesNotExist:
                raise CommandError(f"no user {opts['user']!r}") from None
            return user, {"format": opts["format"] or "md"}
        if kind == "benchmark":
            return None, {"model": opts["model"]} if opts["model"] else {}
        params: dict[str, Any] = {}
        if opts["params"]:
            try:
                params = json.loads(opts["params"])
            except ValueError as exc:
                raise CommandError(f"--params is not JSON: {exc}") from None
            if not isinstance(params, dict):
                raise CommandError("--params must be a JSON object")
        for opt, key in (
            ("requests", "requests"),
            ("rate", "rate"),
            ("ttft_target", "ttft_target_s"),
            ("tpot_target", "tpot_target_s"),
        ):
            if opts[opt] is not None:
                params[key] = opts[opt]
        if opts["synthetic"]:
            params["synthetic"] = True
        return None, params

    def run_job(
        self, kind: str, user_params: tuple[Any, dict[str, Any]], opts: dict[str, Any], now: bool
    ) -> None:
        user, params = user_params
        try:
            job = queue.create(kind, user, params)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        task = queue.task_for(kind)
        if now:
            self.stdout.write(f"job {job.pk} ({kind}) running in this process")
            task.apply((job.pk,))
        else:
            result = task.apply_async((job.pk,))
            self.stdout.write(
                f"job {job.pk} ({kind}) queued on {queue_of(task.name)!r} as task {result.id}"
            )
            if not opts["wait"]:
                return
            deadline = time.monotonic() + opts["timeout"]
            while not Job.objects.filter(pk=job.pk, status__in=FINISHED).exists():
                if time.monotonic() > deadline:
                    raise CommandError(
                        f"job {job.pk} is still {Job.objects.get(pk=job.pk).status} after "
                        f"{opts['timeout']:.0f} s; it goes on in the worker"
                    )
                time.sleep(0.5)
        job.refresh_from_db()
        self.stdout.write(json.dumps(job_summary(job), default=str))
        if job.status == Job.Status.FAILED:
            last = (job.log.strip().splitlines() or ["see its log"])[-1]
            raise CommandError(f"job {job.pk} failed: {last}")

    # --- plain tasks (rollup, prune, title, kv-upkeep) --------------------------------------

    def run_task(self, kind: str, opts: dict[str, Any], now: bool) -> None:
        task = queue.task_named(TASK_KINDS[kind])
        args: tuple[Any, ...] = ()
        if kind == "title":
            conversations = apps.get_model("chat", "Conversation").objects
            if not conversations.filter(pk=opts["conversation"]).exists():
                raise CommandError(f"no conversation {opts['conversation']}")
            args = (opts["conversation"],)
        if not now and queue.runs_in_process(task):
            # With a broker, only a generation job in the embedded mode stays in process:
            # a Celery worker builds no engine there (docs/titles.md), so queued it would
            # only be skipped.
            raise CommandError(
                f"{task.name} generates text, and in ENGINE_MODE=embedded only the web process "
                "has the engine (it runs this job itself); --now runs it here, loading the "
                "model into this process"
            )
        if now:
            self.stdout.write(f"{task.name} running in this process")
            value = task.apply(args).get()
        else:
            if opts["wait"] and not settings.CELERY_RESULT_BACKEND:
                raise CommandError(
                    f"--wait for {task.name} needs a result backend (CELERY_RESULT_BACKEND); "
                    "or run it here with --now"
                )
            result = task.apply_async(args)
            self.stdout.write(f"{task.name} queued on {queue_of(task.name)!r} as task {result.id}")
            if not opts["wait"]:
                return
            value = result.get(timeout=opts["timeout"])
        self.stdout.write(json.dumps({"task": task.name, "result": value}, default=str))
        if isinstance(value, dict) and value.get("status") == "failed":
            raise CommandError(f"{task.name} failed: {value.get('error')}")


def queue_of(task_name: str) -> str:
    """The queue Celery's routes (CELERY_TASK_ROUTES) send this task to."""
    return str(app.amqp.router.route({}, task_name)["queue"].name)


def job_summary(job: Job) -> dict[str, Any]:
    return {
        "id": job.pk,
        "kind": job.kind,
        "status": job.status,
        "file": job.file,
        "result": job.result,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
    }
