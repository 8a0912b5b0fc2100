"""The work of the dashboard's jobs (run by inference.tasks): each takes its Job row,
fills in `result` / `file` / `log`, and raises on failure."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils.text import slugify

from inference.models import Job

# The dashboard's tuning form takes these; `manage.py run_job tune --params` takes any.
TUNING_PARAMS = (
    "requests",
    "rate",
    "synthetic",
    "ttft_target_s",
    "tpot_target_s",
    "repeats",
    "axes",
)

# The Celery task (inference.tasks) that runs each kind of job started by somebody; the KV
# tier upkeep task makes its own Job row on each pass.
TASK_NAMES = {
    Job.Kind.BENCHMARK: "run_benchmark",
    Job.Kind.EXPORT: "export_conversations",
    Job.Kind.TUNING: "tune",
}


def task_for(kind: str) -> Any:
    from inference import tasks

    if kind not in TASK_NAMES:
        raise ValueError(f"no job of kind {kind!r} can be started; one of {sorted(TASK_NAMES)}")
    return getattr(tasks, TASK_NAMES[kind])


def create(kind: str, user: Any = None, params: dict[str, Any] | None = None) -> Job:
    """The queued Job row, checked: the work itself starts with `start` or `run_job`."""
    task_for(kind)
    if kind == Job.Kind.EXPORT:
        if user is None:
            raise ValueError("an export is of one user's conversations: name the user")
        if (params or {}).get("format", "md") not in ("md", "json"):
            raise ValueError("the export format must be 'md' or 'json'")
    return Job.objects.create(kind=kind, user=user, params=params or {})


def start(kind: str, user: Any = None, params: dict[str, Any] | None = None) -> Job:
    """Create a job and queue it the way every offline task is (inference.tasks.submit):
    to the broker, whose routes put tuning, benchmark and exports on the long queue, or
    to this process's background thread."""
    from inference import tasks

    job = create(kind, user, params)
    tasks.submit(task_for(kind), job.pk)
    return job


def job_dir(job: Job) -> Path:
    folder = Path(settings.VAR_DIR) / "jobs" / f"{job.kind}-{job.pk}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# --- benchmark ----------------------------------------------------------------------


def benchmark_command(job: Job, out: Path) -> list[str]:
    cmd = [part.replace("{python}", sys.executable) for part in shlex.split(settings.BENCH_COMMAND)]
    model = job.params.get("model") or str(settings.ENGINE["MODEL"])
    return [
        *cmd,
        "--model",
        model,
        "--json",
        str(out / "results.json"),
        "--plot",
        str(out / "plot.png"),
    ]


def benchmark_env() -> dict[str, str]:
    """The bench's KV tier section uses the tier this server is configured with (it writes
    under a namespace of its own and drops it); "" skips the section."""
    return {**os.environ, "ENGINE_KV_TIER_URL": str(settings.ENGINE.get("KV_TIER_URL") or "")}


def benchmark(job: Job) -> dict[str, Any]:
    """Run `python -m inference.bench` in a subprocess; keep its JSON, plot and output."""
    out = job_dir(job)
    cmd = benchmark_command(job, out)
    proc = subprocess.run(
        cmd,
        cwd=settings.BASE_DIR,
        env=benchmark_env(),
        capture_output=True,
        text=True,
        timeout=settings.BENCH_TIMEOUT_S,
    )
    log = f"$ {shlex.join(cmd)}\n{proc.stdout}{proc.stderr}"[-20000:]
    results_file = out / "results.json"
    if proc.returncode != 0 or not results_file.exists():
        job.log = log
        raise RuntimeError(f"the benchmark exited with status {proc.returncode}")
    results = json.loads(results_file.read_text())
    plot = out / "plot.png"
    Job.objects.filter(pk=job.pk).update(
        result=results,
        log=log,
        file=str(plot.relative_to(settings.VAR_DIR)) if plot.exists() else "",
    )
    return {"targets": len(results.get("targets", []))}


def benchmark_summary(results: dict[str, Any]) -> dict[str, Any]:
    """The figures the dashboard compares run against run."""

    def get(section: str, key: str) -> Any:
        value = results.get(section)
        return value.get(key) if isinstance(value, dict) else None

    return {
        "single_decode_tok_s": get("single_ours", "decode_tok_s"),
        "single_ttft_s": get("single_ours", "ttft"),
        "streams16_tok_s": get("streams16_ours", "tok_s"),
        "streams64_tok_s": get("streams64_ours", "tok_s"),
        "busy_ttft_ratio_p99": get("busy", "ttft_ratio_p99"),
        "busy_itl_ratio": get("busy", "itl_ratio"),
        "targets_met": sum(1 for t in results.get("targets", []) if t.get("met")),
        "targets": len(results.get("targets", [])),
    }


# --- conversation export ------------------------------------------------------------


def export(job: Job) -> dict[str, Any]:
    """All of a user's conversations as a zip: one Markdown file each, or one JSON."""
    from chatapp.export import conversation_markdown, conversation_payload
    from chatapp.models import Conversation

    fmt = job.params.get("format", "md")
    if fmt not in ("md", "json"):
        raise ValueError(f"unknown export format {fmt!r}")
    convs = list(Conversation.objects.filter(owner=job.user).order_by("id"))
    path = job_dir(job) / f"conversations-{fmt}.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        if fmt == "json":
            data = [conversation_payload(c) for c in convs]
            zf.writestr("conversations.json", json.dumps(data, ensure_ascii=False, indent=2))
        else:
            for c in convs:
                name = f"{c.pk:05d}-{slugify(c.title)[:50] or 'conversation'}.md"
                zf.writestr(name, conversation_markdown(c))
    Job.objects.filter(pk=job.pk).update(
        file=str(path.relative_to(settings.VAR_DIR)), result={"conversations": len(convs)}
    )
    return {"conversations": len(convs)}


# --- tuning ---------------------------------------------------------------------------


def kv_tier(job: Job) -> dict[str, Any]:
    from inference import kv_upkeep

    report = kv_upkeep.run()
    Job.objects.filter(pk=job.pk).update(result=report)
    if report.get("error"):
        raise RuntimeError(report["error"])
    return report


def tune(job: Job) -> dict[str, Any]:
    from inference import tuning

    report = tuning.run(job.params)
    Job.objects.filter(pk=job.pk).update(result=report)
    return {"best": report["best"]}
