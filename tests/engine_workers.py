"""Real engine workers (`manage.py run_engine` subprocesses on the tiny model) in a Redis
namespace of their own, and the web side's client for them in this process. Plain helpers,
shared by tests/workers, tests/jobs and tests/observability (tests/workers/conftest.py
builds its fixtures on them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.test import override_settings
from redis import Redis

from inference.client import get_engine_client, set_engine_client
from tools.live_server import ROOT, DjangoProcess

REDIS_URL = "redis://127.0.0.1:6379/3"
KV_TIER_URL = "redis://127.0.0.1:6379/4"


def worker_env(namespace: str, **env: str) -> dict[str, str]:
    """What a worker and the web side share: where the workers meet, and how fast."""
    return {
        "ENGINE_WORKERS_REDIS_URL": REDIS_URL,
        "ENGINE_WORKERS_NAMESPACE": namespace,
        "ENGINE_KV_CACHE_MEMORY_MB": "64",
        "ENGINE_NUM_THREADS": "1",
        # The Redis KV tier (issue 4, part 1), in a namespace of this test's own.
        "ENGINE_KV_TIER_URL": KV_TIER_URL,
        "ENGINE_KV_TIER_NAMESPACE": f"kv-{namespace}",
        **env,
    }


class Worker(DjangoProcess):
    """One `manage.py run_engine` process (with `args`, e.g. ("--model", "tiny=/m/tiny"))."""

    def __init__(
        self,
        workdir: Path,
        model_dir: Path,
        namespace: str,
        worker_id: str,
        args: tuple[str, ...] = (),
        **env: str,
    ):
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(
            workdir, model_dir, **worker_env(namespace, ENGINE_WORKER_ID=worker_id, **env)
        )
        self.args = args
        self.id = worker_id
        self.key = f"{namespace}:worker:{worker_id}"
        self.log = workdir / f"worker-{worker_id}.log"

    def start(self) -> Worker:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "run_engine", *self.args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def wait_registered(self, redis: Redis, timeout: float = 90) -> Worker:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.id} exited:\n{self.log.read_text()}")
            if redis.exists(self.key):
                return self
            time.sleep(0.2)
        raise RuntimeError(f"worker {self.id} did not register:\n{self.log.read_text()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)


@contextmanager
def workers_running(
    tmp: Path, model_dir: Path, namespace: str, redis: Redis, *ids: str, **env: str
) -> Iterator[list[Worker]]:
    """Start the workers side by side (they load at once), wait until all registered."""
    workers = [Worker(tmp / wid, model_dir, namespace, wid, **env).start() for wid in ids]
    try:
        for w in workers:
            w.wait_registered(redis)
        yield workers
    finally:
        for w in workers:
            w.stop()


@contextmanager
def distributed_client(model_dir: Path, namespace: str, url: str = REDIS_URL) -> Iterator[Any]:
    """This process's engine client in distributed mode (what a web process gets)."""
    engine = {
        **settings.ENGINE,
        "MODE": "distributed",
        "MODEL": str(model_dir),
        "WORKERS_REDIS_URL": url,
        "WORKERS_NAMESPACE": namespace,
        "WORKER_DEAD_AFTER_S": 3.0,
    }
    with override_settings(ENGINE=engine):
        set_engine_client(None)
        try:
            yield get_engine_client()
        finally:
            set_engine_client(None)


@contextmanager
def fresh_namespace(redis: Redis) -> Iterator[str]:
    """A namespace of its own for the workers of one test, cleaned up after it."""
    namespace = f"test-{uuid.uuid4().hex[:10]}"
    try:
        yield namespace
    finally:
        cleanup(redis, namespace)


def cleanup(redis: Redis, namespace: str) -> None:
    """The workers' keys and their KV tier's blocks (`kv-` + namespace, in the tier's
    database): left behind, every run's blocks stayed in Redis for a day, their TTL."""
    tier = Redis.from_url(KV_TIER_URL)
    try:
        for client, pattern in ((redis, f"{namespace}:*"), (tier, f"kv-{namespace}:*")):
            keys = list(client.scan_iter(pattern, count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])
    finally:
        tier.close()
