"""The files jobs produce (benchmark plots, export archives), under VAR_DIR/jobs/."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.http import FileResponse, Http404

from chatapp.jobs.models import Job


def job_dir(job: Job) -> Path:
    folder = Path(settings.VAR_DIR) / "jobs" / f"{job.kind}-{job.pk}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def relative_to_var(path: Path) -> str:
    """How a Job row names its file (Job.file)."""
    return str(path.relative_to(settings.VAR_DIR))


def file_response(job: Job, attachment: bool) -> FileResponse:
    """The job's file, if it is one under VAR_DIR (a row never names a file elsewhere)."""
    if not job.file:
        raise Http404("no file")
    path = (Path(settings.VAR_DIR) / job.file).resolve()
    if not path.is_file() or Path(settings.VAR_DIR).resolve() not in path.parents:
        raise Http404("no file")
    return FileResponse(path.open("rb"), as_attachment=attachment, filename=path.name)
