"""The one launcher of this project's processes outside a test's own: daphne in a
subprocess on a free port, with its own SQLite file, serving the whole app (HTTP, WebSocket,
/v1), and its `manage.py` commands. The tests that need a real server use it, and so do the
benchmarks that start ours (inference/bench/servers.py) and llama.cpp's (free_port,
wait_until_up, stop_process)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import httpx
import websockets.sync.client as ws_client

ROOT = Path(__file__).resolve().parent.parent
# As every launcher of the project passes them (scripts/run.sh, Dockerfile, compose).
WEBSOCKET_LIMITS = (
    "--websocket-max-message-size",
    "16777216",
    "--websocket-max-frame-size",
    "16777216",
)


# A freshly migrated SQLite database per checkout, made by this process's first migrate and
# copied by the later ones: `migrate` on an empty file costs seconds of Django start-up and
# schema work, paid once per server otherwise (the test suite starts dozens).
_MIGRATED: dict[Path, Path] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_up(
    url: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    timeout: float = 120,
    answered: bool = False,
) -> None:
    """Until `url` answers 200 (with `answered`, anything at all: an HTTP error too); the
    process's log in the error if it exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except urllib.error.HTTPError:
            if answered:
                return
        except Exception:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def stop_process(
    proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = 15
) -> None:
    """`sig` (SIGTERM: a server drains and exits), then a kill once `timeout` has passed."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class DjangoProcess:
    """A process of this project (server or worker) with its own settings and SQLite file,
    and `manage.py` commands against the same settings.

    `model_dir`: the model it serves, in float32 unless ENGINE_DTYPE says otherwise (the
    tests' tiny models); None: the served default, as `make run` serves it. `root`: the
    checkout whose code runs (another one, e.g. a `git worktree` of a commit to compare
    with, runs with this environment's packages)."""

    def __init__(
        self, workdir: Path, model_dir: Path | str | None = None, root: Path = ROOT, **env: str
    ) -> None:
        self.workdir = workdir
        self.root = root
        self.db = workdir / "db.sqlite3"
        model = {} if model_dir is None else {
            "CHATAPP_MODEL": str(model_dir), "ENGINE_DTYPE": env.pop("ENGINE_DTYPE", "float32")
        }  # fmt: skip
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "chatapp.settings.dev",
            "DJANGO_DEBUG": "false",
            "CHATAPP_VAR_DIR": str(workdir),
            "DATABASE_URL": f"sqlite:///{self.db}",
            **model,
            "ENGINE_PRELOAD": "true",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "server.log"
        # True once the database is migrated (or set by a caller whose database is, such
        # as pytest-django's test database): migrate() then does nothing.
        self.migrated = False

    def manage(self, *args: str, timeout: float = 180) -> str:
        out = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(out.stdout + out.stderr)
        return out.stdout

    def migrate(self) -> None:
        """`manage.py migrate`; a new SQLite file of its own is a copy of the first one this
        process migrated for the same code (the schema comes from the code alone: no
        migration reads the settings or the environment)."""
        if self.migrated:
            return
        fresh = self.env.get("DATABASE_URL") == f"sqlite:///{self.db}" and not self.db.exists()
        template = _MIGRATED.get(self.root) if fresh else None
        if template is not None:
            self.db.parent.mkdir(parents=True, exist_ok=True)  # as migrate's settings make it
            shutil.copyfile(template, self.db)
            self.migrated = True
            return
        self.manage("migrate", "--noinput", "-v", "0")
        self.migrated = True
        if fresh and not Path(f"{self.db}-wal").exists():
            folder = Path(tempfile.mkdtemp(prefix="chatapp-migrated-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            shutil.copyfile(self.db, folder / self.db.name)
            _MIGRATED[self.root] = folder / self.db.name

    def python(self, code: str) -> str:
        """Run Django ORM code against this server's database; returns what it prints."""
        return self.manage("shell", "--no-imports", "-c", code).strip()

    def celery_worker(
        self, log_path: Path, hostname: str, queue: str | None = None, timeout: float = 120
    ) -> subprocess.Popen[bytes]:
        """A real Celery worker (solo pool) with these settings, on `queue` (default: the
        settings' default queue), started and ready."""
        queues = [f"--queues={queue}"] if queue else []
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "chatapp", "worker", "--pool=solo",
                 "--loglevel=INFO", "--without-gossip", "--without-mingle", *queues,
                 "--hostname", f"{hostname}@%h"],
                cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited:\n{log_path.read_text()}")
            if b"ready." in log_path.read_bytes():
                return proc
            time.sleep(0.3)
        proc.kill()
        raise RuntimeError(f"worker did not come up:\n{log_path.read_text()}")

    def stop(self, timeout: float = 15) -> None:
        stop_process(self.proc, timeout=timeout)


class LiveServer(DjangoProcess):
    def __init__(
        self, workdir: Path, model_dir: Path | str | None = None, root: Path = ROOT, **env: str
    ) -> None:
        # Its own part of the KV tier unless told: prefix scopes are per user id, and each
        # server's database numbers its users from 1, so two servers sharing a namespace
        # would find each other's users' blocks as their own. Under the run's namespace,
        # so that the test session's cleanup (tests/conftest.py) drops it.
        run_namespace = os.environ.get("ENGINE_KV_TIER_NAMESPACE", "chatapp")
        env.setdefault("ENGINE_KV_TIER_NAMESPACE", f"{run_namespace}:{uuid.uuid4().hex[:8]}")
        super().__init__(workdir, model_dir, root, **env)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> LiveServer:
        """Migrated, started, and up: /healthz?engine=1 answers 200 once the embedded
        engine is ready. In distributed mode the server is up once it answers at all:
        /healthz says 503 until an engine worker registers, and tests start the workers
        (or none) after it."""
        self.migrate()
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "daphne",
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    *WEBSOCKET_LIMITS,
                    "chatapp.asgi:application",
                ],
                cwd=self.root,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        distributed = self.env.get("ENGINE_MODE") == "distributed"
        wait_until_up(f"{self.url}/healthz?engine=1", self.proc, self.log, timeout, distributed)
        return self

    def login(self, username: str, password: str) -> httpx.Client:
        """An HTTP session logged in through the real login form (CSRF included)."""
        c = httpx.Client(base_url=self.url, follow_redirects=False, timeout=30)
        c.get("/accounts/login/")
        answer = c.post(
            "/accounts/login/",
            data={"username": username, "password": password,
                  "csrfmiddlewaretoken": c.cookies["csrftoken"]},
            headers={"Referer": self.url + "/accounts/login/"},
        )  # fmt: skip
        if answer.status_code != 302:
            raise AssertionError(f"login failed: {answer.status_code} {answer.text[:200]}")
        return c

    def chat_socket(self, username: str, password: str) -> Any:
        """A logged-in connection to the chat WebSocket (websockets' sync client)."""
        session = self.login(username, password)
        cookie = "; ".join(f"{k}={v}" for k, v in session.cookies.items())
        session.close()
        url = self.url.replace("http://", "ws://") + "/ws/chat/"
        return ws_client.connect(url, additional_headers={"Cookie": cookie, "Origin": self.url})

    def make_user(self, username: str, password: str, staff: bool = False) -> None:
        self.python(
            "from django.contrib.auth import get_user_model as g; "
            f"u = g().objects.create_user({username!r}, password={password!r}); "
            f"u.is_staff = u.is_superuser = {staff!r}; u.save()"
        )

    def make_key(self, username: str, **limits: Any) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in limits.items())
        return self.python(
            "from django.contrib.auth import get_user_model as g; "
            "from chatapp.openai_api.keys import create_key; "
            f"k, raw = create_key(g().objects.get(username={username!r}), 'test'); "
            + (f"type(k).objects.filter(pk=k.pk).update({fields}); " if fields else "")
            + "print(raw)"
        )
