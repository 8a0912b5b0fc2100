"""The in-process scheduler: the periodic work of settings.PERIODIC_TASKS that this
process runs itself, started once by the web process (chatapp/asgi.py).

settings.PERIODIC_TASKS is the one schedule. With a broker, Celery beat runs its entries
(settings.CELERY_BEAT_SCHEDULE, derived from it) except those that need this process's
engine; this scheduler runs exactly the others (`queue.runs_in_process`): with no broker
(the embedded default) every entry, else the engine sample and, in embedded mode, the
jobs that generate text on the serving engine.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import close_old_connections

from chatapp.jobs import queue

log = logging.getLogger(__name__)


@dataclass
class Entry:
    name: str
    task: str
    every_s: float
    last_run: float


class Scheduler:
    def __init__(self, schedule: dict[str, dict[str, Any]], now: float) -> None:
        """The entries of `schedule` (PERIODIC_TASKS' shape) this process runs; each is
        first due one period after `now`."""
        self.entries = [
            Entry(name, spec["task"], float(spec["schedule"]), now)
            for name, spec in schedule.items()
            if queue.runs_in_process(spec["task"])
        ]
        self._thread: threading.Thread | None = None

    def run_due(self, now: float) -> list[str]:
        """Run every entry whose period has passed; the names of those that ran."""
        ran = []
        for entry in self.entries:
            if now - entry.last_run < entry.every_s:
                continue
            entry.last_run = now
            try:
                queue.task_named(entry.task).apply()
                ran.append(entry.name)
            except Exception:
                log.exception("periodic task %s failed", entry.name)
            finally:
                close_old_connections()
        return ran

    def start(self) -> None:
        if self._thread is None and self.entries:
            self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        tick = min(entry.every_s for entry in self.entries)
        while True:
            time.sleep(tick)
            self.run_due(time.monotonic())


_started: Scheduler | None = None
_lock = threading.Lock()


def start_in_process() -> Scheduler | None:
    """Start this process's scheduler once (a no-op while OBS_BACKGROUND is off)."""
    global _started
    if not settings.OBS_BACKGROUND:
        return None
    with _lock:
        if _started is None:
            _started = Scheduler(settings.PERIODIC_TASKS, time.monotonic())
            _started.start()
    return _started
