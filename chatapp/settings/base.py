"""Settings shared by every environment. Everything a user may change reads the
environment; README.md lists the variables."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
from csp.constants import NONE, SELF

from chatapp.settings.engine import engine_settings, served_model_list
from chatapp.settings.env import env_bool, env_float, env_int, env_list, env_str
from inference.redis_options import channel_layer_host

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(env_str("CHATAPP_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = env_str("DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])
CSRF_FAILURE_VIEW = "chatapp.views.csrf_failure"  # JSON under /api/ and /v1/

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    # The web apps (each one job; docs: README "Layout"), the shared offline jobs, and
    # serving (no models: it brings `manage.py run_engine`).
    "chatapp.accounts",
    "chatapp.chat",
    "chatapp.openai_api",
    "chatapp.observability",
    "chatapp.jobs",
    "inference",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "chatapp.middleware.DatabaseUnavailableMiddleware",
]

# Content-Security-Policy on every response (django-csp): scripts, styles, fonts and
# connections from this origin only, no inline script or style, images from this origin or
# data: URLs. A reply that smuggles in a remote image (or anything else that loads on
# sight) cannot send the page's text to another host, even if the markdown sanitiser
# missed it.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],  # 'self' covers ws:/wss: to this host (CSP level 3)
        "media-src": [NONE],
        "object-src": [NONE],
        "frame-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

ROOT_URLCONF = "chatapp.urls"
ASGI_APPLICATION = "chatapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Site-wide templates (chatapp/base.html); each app keeps its own.
        "DIRS": [BASE_DIR / "chatapp" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "chatapp.accounts.context_processors.flags",
            ],
        },
    },
]

# SQLite by default (the embedded setup); DATABASE_URL switches to PostgreSQL.
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}"), conn_max_age=0
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL + IMMEDIATE transactions + a busy timeout: the streaming writer and the
    # request handlers share the file without "database is locked" errors.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": env_float("SQLITE_BUSY_TIMEOUT_S", 20.0),
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
# Log-in throttling (chatapp/accounts/login_throttle.py): failed log-ins allowed per account and per
# address within the window; past either, no password is checked until it ends.
LOGIN_FAILURES_PER_ACCOUNT = env_int("LOGIN_FAILURES_PER_ACCOUNT", 10)
LOGIN_FAILURES_PER_ADDRESS = env_int("LOGIN_FAILURES_PER_ADDRESS", 30)
LOGIN_FAILURE_WINDOW_S = env_int("LOGIN_FAILURE_WINDOW_S", 900)
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
# The frontend build (npm run build) lands in frontend/dist/ and is served as-is.
# chatapp/static/: the site's own (the favicon).
STATICFILES_DIRS = [BASE_DIR / "frontend" / "dist", BASE_DIR / "chatapp" / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# Serve straight from STATICFILES_DIRS, so `make run` needs no collectstatic step.
WHITENOISE_USE_FINDERS = True

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

# Rate-limit counters live in the cache, which several processes must share: CACHE_URL
# (Redis), else with the Redis channel layer (several web replicas) REDIS_URL under the
# layer's prefix, else this process's memory.
CACHE_URL = env_str("CACHE_URL", "")
CACHES: dict[str, dict[str, Any]] = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL}
        if CACHE_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

# "memory" (one process, the embedded default) or "redis" (several processes). The Redis
# layer's socket options (inference/redis_options.py) outlast its blocking reads; the prefix
# keeps two deployments (or two test runs) on one Redis apart.
CHANNEL_LAYER = env_str("CHANNEL_LAYER", "memory")
CHANNEL_LAYER_PREFIX = env_str("CHANNEL_LAYER_PREFIX", "asgi")
CHANNEL_LAYERS: dict[str, dict[str, Any]]
if CHANNEL_LAYER == "redis":
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [channel_layer_host(REDIS_URL)],
                "prefix": CHANNEL_LAYER_PREFIX,
                "capacity": 1500,
                "expiry": 30,
            },
        }
    }
    if not CACHE_URL:
        CACHES["default"] = {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"{CHANNEL_LAYER_PREFIX}:cache",
        }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Celery: tasks run in-process unless a broker is configured (docker compose sets one).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "")
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", "")
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", not CELERY_BROKER_URL)
CELERY_TASK_EAGER_PROPAGATES = True
# Two queues, so a rollup never waits behind an hour of tuning: the default one (rollups,
# pruning, titles, KV tier upkeep) and one for long jobs (tuning, benchmark, exports), each
# with its own worker (docker-compose.yml: celery-worker, celery-worker-long).
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_DEFAULT_QUEUE", "celery")
CELERY_LONG_QUEUE = env_str("CELERY_LONG_QUEUE", "long")
LONG_TASKS = ("inference.tune", "inference.run_benchmark", "inference.export_conversations")
CELERY_TASK_ROUTES = {name: {"queue": CELERY_LONG_QUEUE} for name in LONG_TASKS}

# The engine. "embedded" runs it in-process, beside the asyncio loop. One entry per
# EngineConfig field (ENGINE_<FIELD>, chatapp/settings/engine.py), then the serving
# settings that are not the engine's own.
ENGINE = {
    **engine_settings(),
    # More models beside CHATAPP_MODEL (the default): `folder` or `name=folder`, comma-
    # separated (inference/catalog.py). Embedded: one engine per model in this process;
    # distributed: the folders a web process reads tokenizers from.
    "MODELS": served_model_list(env_str("CHATAPP_MODELS", "")),
    "MODE": env_str("ENGINE_MODE", "embedded"),
    # Load the model when the server starts rather than on the first message.
    "PRELOAD": env_bool("ENGINE_PRELOAD", True),
    # ENGINE_MODE=upstream: any OpenAI-compatible server is the engine instead.
    "UPSTREAM_URL": env_str("ENGINE_UPSTREAM_URL", ""),  # e.g. http://gpu-box:8000/v1
    "UPSTREAM_API_KEY": env_str("ENGINE_UPSTREAM_API_KEY", ""),
    "UPSTREAM_MODEL": env_str("ENGINE_UPSTREAM_MODEL", ""),  # default: the first it lists
    # Send each request's per-user `cache_salt` (vLLM's field), so the upstream's prefix
    # cache does not tell one user what another sent; off for servers that refuse the field.
    "UPSTREAM_CACHE_SALT": env_bool("ENGINE_UPSTREAM_CACHE_SALT", True),
    # ENGINE_MODE=distributed: `manage.py run_engine` workers serve over Redis (docs/workers.md).
    "WORKERS_REDIS_URL": env_str(
        "ENGINE_WORKERS_REDIS_URL", urlsplit(REDIS_URL)._replace(path="/3").geturl()
    ),
    "WORKERS_NAMESPACE": env_str("ENGINE_WORKERS_NAMESPACE", "engine"),
    "WORKER_ID": env_str("ENGINE_WORKER_ID", ""),  # default: <hostname>-<pid>
    "WORKER_FLUSH_MS": env_int("ENGINE_WORKER_FLUSH_MS", 15),
    "WORKER_DEAD_AFTER_S": env_float("ENGINE_WORKER_DEAD_AFTER_S", 3.0),
    # On SIGTERM a worker's running replies get this long to finish: within the stop
    # grace period of whatever stops it (compose's for `engine` is 40 s).
    "WORKER_DRAIN_S": env_float("ENGINE_WORKER_DRAIN_S", 30.0),
}

# The response cache (docs/response-cache.md): a deterministic request (greedy, or seeded)
# answered before is replayed from Redis without the engine. Off unless turned on.
RESPONSE_CACHE_ENABLED = env_bool("RESPONSE_CACHE_ENABLED", False)
RESPONSE_CACHE_URL = env_str("RESPONSE_CACHE_URL", "redis://127.0.0.1:6379/4")
RESPONSE_CACHE_TTL_S = env_float("RESPONSE_CACHE_TTL_S", 3600.0)

# Chat behaviour.
CHAT_ALLOW_SIGNUP = env_bool("CHAT_ALLOW_SIGNUP", True)
CHAT_FLUSH_INTERVAL_MS = env_int("CHAT_FLUSH_INTERVAL_MS", 30)
CHAT_MAX_MESSAGE_CHARS = env_int("CHAT_MAX_MESSAGE_CHARS", 32000)
CHAT_MAX_FRAME_BYTES = env_int("CHAT_MAX_FRAME_BYTES", 256 * 1024)
CHAT_MAX_NEW_TOKENS = env_int("CHAT_MAX_NEW_TOKENS", 2048)
# How long a reply keeps generating after its last viewer disconnected, so that a page
# refresh can pick it up again; past this it is stopped and saved (finish "disconnect").
CHAT_DISCONNECT_GRACE_S = env_float("CHAT_DISCONNECT_GRACE_S", 20.0)
# On SIGTERM the replies running in this process get this long to finish; the rest are cut
# (finish "shutdown") and saved. Below compose's stop_grace_period for web (40 s).
CHAT_DRAIN_S = env_float("CHAT_DRAIN_S", 30.0)
# Save the streaming replies' partial text this often (all of them in one transaction:
# chatapp/chat/checkpoints.py), so a crash loses about this much of what a reader saw.
CHAT_CHECKPOINT_INTERVAL_S = env_float("CHAT_CHECKPOINT_INTERVAL_S", 0.25)
# Per-user limits on the chat socket.
CHAT_RATE_LIMIT_PER_MINUTE = env_int("CHAT_RATE_LIMIT_PER_MINUTE", 30)
# The composer's prompt-size counts one user may ask for a minute (each tokenizes up to a
# context window on the web process's cores, beside everyone's replies).
CHAT_PROMPT_SIZE_PER_MINUTE = env_int("CHAT_PROMPT_SIZE_PER_MINUTE", 60)
CHAT_MAX_CONCURRENT_STREAMS = env_int("CHAT_MAX_CONCURRENT_STREAMS", 4)
# Documents attached to a message (docs/http.md, "Attachments"): the largest file taken,
# the most text kept from one, how many go with one message, and how long an uploaded file
# that was never sent is kept.
CHAT_ATTACHMENT_MAX_BYTES = env_int("CHAT_ATTACHMENT_MAX_BYTES", 10 * 1024 * 1024)
CHAT_ATTACHMENT_MAX_CHARS = env_int("CHAT_ATTACHMENT_MAX_CHARS", 500_000)
CHAT_ATTACHMENTS_PER_MESSAGE = env_int("CHAT_ATTACHMENTS_PER_MESSAGE", 10)
CHAT_ATTACHMENT_PENDING_HOURS = env_float("CHAT_ATTACHMENT_PENDING_HOURS", 24.0)
# A PDF is read in a process of its own, killed past these (docs/reliability.md).
CHAT_PDF_MAX_PAGES = env_int("CHAT_PDF_MAX_PAGES", 2000)
CHAT_PDF_MAX_CONTENT_BYTES = env_int("CHAT_PDF_MAX_CONTENT_BYTES", 16 * 1024 * 1024)
CHAT_PDF_TIMEOUT_S = env_float("CHAT_PDF_TIMEOUT_S", 15.0)
# Imports (POST /api/conversations/import/): the largest file, and its size once unzipped.
CHAT_IMPORT_MAX_BYTES = env_int("CHAT_IMPORT_MAX_BYTES", 128 * 1024 * 1024)
CHAT_IMPORT_MAX_CONVERSATIONS = env_int("CHAT_IMPORT_MAX_CONVERSATIONS", 10_000)
CHAT_IMPORT_MAX_MESSAGES = env_int("CHAT_IMPORT_MAX_MESSAGES", 200_000)
CHAT_DEFAULTS = {
    "system_prompt": env_str("CHAT_DEFAULT_SYSTEM_PROMPT", ""),
    "temperature": env_float("CHAT_DEFAULT_TEMPERATURE", 0.7),
    "top_p": env_float("CHAT_DEFAULT_TOP_P", 0.95),
    "max_tokens": env_int("CHAT_DEFAULT_MAX_TOKENS", 512),
}

# OpenAI-compatible API (/v1/...).
OPENAI_MAX_BODY_BYTES = env_int("OPENAI_MAX_BODY_BYTES", 1024 * 1024)
# Django refuses bodies over this with its own 400 page; never below the API's own limit,
# so a configured larger OPENAI_MAX_BODY_BYTES is honoured (the views answer 413 past it).
DATA_UPLOAD_MAX_MEMORY_SIZE = max(2621440, OPENAI_MAX_BODY_BYTES)
OPENAI_RATE_LIMIT_PER_MINUTE = env_int("OPENAI_RATE_LIMIT_PER_MINUTE", 120)
OPENAI_MAX_CONCURRENT = env_int("OPENAI_MAX_CONCURRENT", 8)
# Live keys one account may make for itself (the keys page and /api/keys/).
OPENAI_MAX_KEYS_PER_USER = env_int("OPENAI_MAX_KEYS_PER_USER", 20)

# --- Observability and offline jobs (chatapp/observability, chatapp/jobs) ---
# /metrics is readable by staff, or with "Authorization: Bearer <METRICS_BEARER_TOKEN>".
METRICS_BEARER_TOKEN = env_str("METRICS_BEARER_TOKEN", "")
# Every /metrics series is labelled replica="<this>", so several web replicas scraped
# behind one proxy stay apart: by default the host's name (a container's, under compose)
# where several processes serve (the Redis channel layer), none for the one process.
METRICS_REPLICA = env_str(
    "METRICS_REPLICA", socket.gethostname() if CHANNEL_LAYER == "redis" else ""
)
# Background threads of the web process: its scheduler (PERIODIC_TASKS), in-process jobs.
OBS_BACKGROUND = env_bool("OBS_BACKGROUND", True)
OBS_SAMPLE_INTERVAL_S = env_float("OBS_SAMPLE_INTERVAL_S", 5.0)
OBS_RAW_RETENTION_HOURS = env_float("OBS_RAW_RETENTION_HOURS", 48.0)
OBS_ROLLUP_RETENTION_DAYS = env_float("OBS_ROLLUP_RETENTION_DAYS", 90.0)
# Finished jobs somebody started (benchmark, tuning, export) and their files; the periodic
# KV tier upkeep passes go after OBS_RAW_RETENTION_HOURS.
OBS_JOB_RETENTION_DAYS = env_float("OBS_JOB_RETENTION_DAYS", 30.0)
# A title written by the engine after a conversation's first reply.
CHAT_AUTO_TITLES = env_bool("CHAT_AUTO_TITLES", True)
# The dashboard's benchmark job; --model, --json and --plot are appended.
BENCH_COMMAND = env_str("BENCH_COMMAND", "{python} -m inference.bench --quick --skip-hf")
BENCH_TIMEOUT_S = env_float("BENCH_TIMEOUT_S", 3600.0)
# The tuning job's latency targets (goodput counts the requests that meet both).
OBS_TUNING_TTFT_S = env_float("OBS_TUNING_TTFT_S", 1.0)
OBS_TUNING_TPOT_S = env_float("OBS_TUNING_TPOT_S", 0.1)
# Redis KV tier upkeep: how often, and how many of the most-used system prompts to warm.
KV_TIER_UPKEEP_S = env_float("KV_TIER_UPKEEP_S", 600.0)
KV_TIER_WARM_PROMPTS = env_int("KV_TIER_WARM_PROMPTS", 5)
# Jobs that generate text on the engine serving users: in embedded mode only the web
# process has it, so they run there, broker or not (chatapp/jobs/queue.py).
GENERATION_TASKS = ("inference.generate_title", "inference.kv_tier_upkeep")
# Tasks that read this process's engine client: always run in the process that serves.
SERVING_PROCESS_TASKS = ("inference.sample_engine",)
# The periodic work, the one schedule (docs/jobs.md). Celery beat runs the entries a
# worker can run (CELERY_BEAT_SCHEDULE below); the web process's scheduler
# (chatapp/jobs/scheduler.py) runs the others, and every entry when there is no broker.
# Task names keep the `inference.` prefix they had before the apps were split: queued
# tasks and existing beat schedules name them so.
PERIODIC_TASKS = {
    "engine-sample": {"task": "inference.sample_engine", "schedule": OBS_SAMPLE_INTERVAL_S},
    "rollup-every-minute": {"task": "inference.rollup", "schedule": 60.0},
    "prune-every-hour": {"task": "inference.prune", "schedule": 3600.0},
    "reap-jobs-every-minute": {"task": "inference.reap_jobs", "schedule": 60.0},
    "kv-tier-upkeep": {"task": "inference.kv_tier_upkeep", "schedule": KV_TIER_UPKEEP_S},
}
_web_process_only = set(SERVING_PROCESS_TASKS) | (
    set(GENERATION_TASKS) if ENGINE["MODE"] == "embedded" else set()
)
CELERY_BEAT_SCHEDULE = {
    name: entry for name, entry in PERIODIC_TASKS.items() if entry["task"] not in _web_process_only
}
CELERY_RESULT_EXPIRES = 3600
# --- end observability ---

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "filters": {
        "not_a_loading_probe": {
            "()": "django.utils.log.CallbackFilter",
            "callback": "ext://chatapp.log_filters.not_a_loading_probe",
        }
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # The readiness probe's 503 while the model loads is expected, not an error.
        "django.request": {"filters": ["not_a_loading_probe"]},
    },
}
