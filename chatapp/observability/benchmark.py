"""The dashboard's benchmark job: `python -m inference.bench` on the served model, in a
subprocess; its JSON, plot and output are kept with the Job."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from chatapp.jobs import queue
from chatapp.jobs.files import job_dir, relative_to_var
from chatapp.jobs.models import Job


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
    return {**os.environ, "ENGINE_KV_TIER_URL": str(settings.ENGINE["KV_TIER_URL"] or "")}


def run(job: Job) -> dict[str, Any]:
    """Run the benchmark command; keep its JSON, plot and output. A cancel (or the reaper)
    stops the command within a second: the job's row is read between waits."""
    out = job_dir(job)
    cmd = benchmark_command(job, out)
    proc = subprocess.Popen(
        cmd,
        cwd=settings.BASE_DIR,
        env=benchmark_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + settings.BENCH_TIMEOUT_S
    try:
        while True:
            try:
                stdout, _ = proc.communicate(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise
                queue.check_cancelled(job.pk)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    log = f"$ {shlex.join(cmd)}\n{stdout}"[-20000:]
    results_file = out / "results.json"
    if proc.returncode != 0 or not results_file.exists():
        job.log = log
        raise RuntimeError(f"the benchmark exited with status {proc.returncode}")
    results = json.loads(results_file.read_text())
    plot = out / "plot.png"
    Job.objects.filter(pk=job.pk).update(
        result=results,
        log=log,
        file=relative_to_var(plot) if plot.exists() else "",
    )
    return {"targets": len(results.get("targets", []))}


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The numbers the dashboard compares run against run."""

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
