"""Fixtures shared by the whole suite.

`tiny_model_dir` is a random-weight llama with the default model's tokenizer, built
once per test session: it runs the real engine code in milliseconds. Tests about
what the model says use the real default model and are marked slow.

`slow` means "loads the real default model or drives a real browser" (browser tests get
it here, marked or not), and `-m "not slow"` (make test-fast) leaves those out. A test
without the marker that still takes over SLOW_CALL_S in that fast set is listed at the
end of the run (pytest_terminal_summary below), without failing it.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.model_files import default_model_path, ensure_default_model
from tests.engines import installed_engine
from tests.tiny_model import build_tiny_llama


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    return ensure_default_model(default_model_path())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, real_model_dir: Path) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), real_model_dir)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, and on PostgreSQL no session left on it when it is
    dropped: a test's async ORM call (asgiref's thread) or `asyncio.to_thread` keeps its
    thread's connection, and PostgreSQL refuses to drop a database in use, which left a
    test_chatapp_<pid> database behind on the server after each run."""
    yield
    from django.db import connection

    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            connection.close()


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: Path) -> Iterator[Any]:
    """The real engine on the tiny model, installed as the web app's engine."""
    with installed_engine(tiny_model_dir) as client:
        yield client


@pytest.fixture(autouse=True)
def fresh_rate_limits(request: pytest.FixtureRequest) -> None:
    """Rate-limit counters live in the (in-process) cache: start every test at zero."""
    if "django_db_setup" not in request.fixturenames and "db" not in request.fixturenames:
        return
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def make_user(db: None) -> Any:
    def make(username: str = "alice", password: str = "a-long-test-password-1") -> Any:
        from django.contrib.auth import get_user_model

        return get_user_model().objects.create_user(username=username, password=password)

    return make


@pytest.fixture
def job_files_in_tmp(settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Job outputs (plots, archives) land in the test's folder, not in var/."""
    settings.VAR_DIR = tmp_path


@pytest.fixture
def staff_user(db: None):  # type: ignore[no-untyped-def]
    return _user_model().objects.create_user(
        "operator", password="a-long-test-password-1", is_staff=True
    )


@pytest.fixture
def plain_user(db: None):  # type: ignore[no-untyped-def]
    return _user_model().objects.create_user("alice", password="a-long-test-password-1")


def _user_model() -> Any:
    from django.contrib.auth import get_user_model

    return get_user_model()


def _uses_the_test_database(item: pytest.Item) -> bool:
    """Whether a test reads or writes the in-process test database, and no server process
    of its own (a LiveServer keeps its own SQLite file whatever the test database is)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("django_db") is None and not fixtures & {"db", "transactional_db"}:
        return False
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        for fixturedef in defs:
            if "LiveServer" in str(inspect.signature(fixturedef.func).return_annotation):
                return False
    return True


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that drives a real browser is `slow`, as the marker says, marked or not.
    The PostgreSQL pass of scripts/test.sh (TEST_DATABASE_URL set) runs only the tests
    that use the test database: the others would repeat the first pass unchanged."""
    for item in items:
        if "playwright_instance" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    if not os.environ.get("TEST_DATABASE_URL"):
        return
    keep = [item for item in items if _uses_the_test_database(item)]
    dropped = [item for item in items if item not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


# An unmarked test whose call phase takes longer than this, in the fast set, is reported.
SLOW_CALL_S = 10.0
_unmarked_slow = pytest.StashKey[list[tuple[str, float]]]()


def _runs_the_fast_set(config: pytest.Config) -> bool:
    """Whether this run leaves out the `slow` tests (`-m "not slow"`: make test-fast)."""
    return "not slow" in " ".join(str(config.getoption("markexpr", "") or "").split())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Note, in the fast set, each test not marked `slow` whose call phase (its fixtures'
    setup left out) took over SLOW_CALL_S: the marker is meant to keep the real model and
    real browsers out of that set, and an unmarked slow test slows every fast run."""
    report = yield
    if (
        call.when == "call"
        and call.duration > SLOW_CALL_S
        and item.get_closest_marker("slow") is None
        and _runs_the_fast_set(item.config)
    ):
        item.config.stash.setdefault(_unmarked_slow, []).append((item.nodeid, call.duration))
    return report


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    """List the unmarked slow tests noted above. A report only, never a failure: on a busy
    machine a test can pass the limit now and then without being slow."""
    found = config.stash.get(_unmarked_slow, [])
    if not found:
        return
    terminalreporter.section("unmarked slow tests")
    terminalreporter.write_line(
        f"{len(found)} test(s) not marked `slow` took over {SLOW_CALL_S:g} s each; mark a "
        "test `slow` if it loads the real model or drives a real browser, else make it faster:"
    )
    for nodeid, seconds in sorted(found, key=lambda f: -f[1]):
        terminalreporter.write_line(f"  {seconds:6.1f} s  {nodeid}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Empty this run's Redis KV tier namespace (chatapp/settings/test.py names it), and
    remove the SQLite test database's WAL files, which Django leaves beside it."""
    import redis
    from django.conf import settings

    test_db = (
        settings.DATABASES["default"].get("TEST", {}).get("NAME") if settings.configured else None
    )
    if test_db and settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        for suffix in ("-wal", "-shm"):
            Path(f"{test_db}{suffix}").unlink(missing_ok=True)

    namespace = os.environ.get("ENGINE_KV_TIER_NAMESPACE", "")
    url = settings.ENGINE.get("KV_TIER_URL") if settings.configured else ""
    if not namespace.startswith("test-kvtier-") or not url:
        return
    try:
        r = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        keys = list(r.scan_iter(match=f"{namespace}:*", count=1000))
        for i in range(0, len(keys), 500):
            r.delete(*keys[i : i + 500])
    except redis.RedisError:
        pass  # Redis gone: nothing of ours to clean up
