"""Settings for the test suite."""

import os
import tempfile
from pathlib import Path

import dj_database_url

from chatapp.settings.base import *  # noqa: F403
from chatapp.settings.base import CHANNEL_LAYERS, DATABASES, ENGINE

# The Redis KV tier stays on under tests (as in docker compose), in a namespace of this test
# run, so that what an earlier run left in Redis never shows up in cached-token counts.
# Exported, so the servers and workers the tests start share it; tests/conftest.py empties
# it when the session ends.
os.environ.setdefault("ENGINE_KV_TIER_NAMESPACE", f"test-kvtier-{os.getpid()}")
# The engines of the tests and of the servers they start keep the 512 MB KV pool of before
# (it holds the bundled model's whole context): an unsized pool takes a share of the memory
# available (kv_budget), written whole at start, which a dozen engines alive at once would
# pay in memory for nothing.
os.environ.setdefault("ENGINE_KV_CACHE_MEMORY_MB", "512")

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
ENGINE = {
    **ENGINE,
    "PRELOAD": False,
    "KV_TIER_NAMESPACE": os.environ["ENGINE_KV_TIER_NAMESPACE"],
    "KV_CACHE_MEMORY_MB": int(os.environ["ENGINE_KV_CACHE_MEMORY_MB"]),
}
CHAT_DISCONNECT_GRACE_S = 0.0
# CHANNEL_LAYER=redis (scripts/test.sh's compose pass): this run's groups apart from any
# other run's or deployment's on the same Redis.
if "CONFIG" in CHANNEL_LAYERS["default"]:
    CHANNEL_LAYERS = {
        "default": {
            **CHANNEL_LAYERS["default"],
            "CONFIG": {**CHANNEL_LAYERS["default"]["CONFIG"], "prefix": f"test-asgi-{os.getpid()}"},
        }
    }
CELERY_TASK_ALWAYS_EAGER = True
# Observability (inference/): no sampler thread or engine-written titles under tests;
# tests/observability turns titles on where it tests them.
OBS_BACKGROUND = False
CHAT_AUTO_TITLES = False

# TEST_DATABASE_URL runs the suite on another database, e.g. the PostgreSQL that docker
# compose deploys (scripts/test.sh does a second pass so); pytest-django makes and drops
# its test_ database there.
if os.environ.get("TEST_DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(os.environ["TEST_DATABASE_URL"], conn_max_age=0)}
    # One test database per run, so two runs on one server (two checkouts, CI beside a
    # developer) never drop each other's.
    DATABASES["default"]["TEST"] = {"NAME": f"test_chatapp_{os.getpid()}"}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, as deployed (WAL, a busy timeout: base.py). Django's default SQLite test
    # database is in memory with one cache shared by its connections, where a write that
    # meets another connection's read fails at once ("database table is locked") instead
    # of waiting: a job or streaming thread of a test lost writes no deployment loses.
    DATABASES["default"]["TEST"] = {
        "NAME": str(Path(tempfile.gettempdir()) / f"test_chatapp_{os.getpid()}.sqlite3")
    }
