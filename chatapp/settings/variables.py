"""What each environment variable outside EngineConfig means, in one line.

The engine's own settings (ENGINE_<FIELD>) are documented on EngineConfig's fields
(inference/engine/config.py). `python -m chatapp.settings.reference` writes both into
docs/settings.md, and tests/test_settings_reference.py fails when the code reads a variable
that has no line here or there.
"""

from __future__ import annotations

MEANINGS: dict[str, str] = {
    # chatapp/settings/base.py, in its order
    "CHATAPP_VAR_DIR": "where the SQLite database and the jobs' files live",
    "DJANGO_SECRET_KEY": "Django's secret key; required by `chatapp.settings.production`",
    "DJANGO_DEBUG": "Django's debug mode",
    "DJANGO_ALLOWED_HOSTS": "host names served, comma-separated",
    "DJANGO_CSRF_TRUSTED_ORIGINS": (
        "other origins (`https://app.example.com`, `https://*.example.com`) allowed to post "
        "forms and open the chat WebSocket; otherwise both must come from the page's own "
        "scheme, host and port"
    ),
    "DATABASE_URL": "the database, e.g. `postgres://user:pass@host/db`",
    "SQLITE_BUSY_TIMEOUT_S": "how long a SQLite write waits for another's lock",
    "LOGIN_FAILURES_PER_ACCOUNT": (
        "failed log-ins allowed per account within the window; past it log-in (site and "
        "admin) is refused until the window ends"
    ),
    "LOGIN_FAILURES_PER_ADDRESS": "failed log-ins allowed per client address within the window",
    "LOGIN_FAILURE_WINDOW_S": "the log-in throttle's window, opened by the first failure",
    "REDIS_URL": "Redis for the channel layer (and, with db 3, the engine workers)",
    "CACHE_URL": (
        "Redis for Django's cache (rate-limit and log-in counters), shared by every process; "
        "empty: `REDIS_URL` with `CHANNEL_LAYER=redis`, else per-process memory"
    ),
    "CHANNEL_LAYER": "`memory` (one process) or `redis` (several web processes)",
    "CHANNEL_LAYER_PREFIX": (
        "the Redis channel layer's key prefix: one per deployment sharing a Redis"
    ),
    "CELERY_BROKER_URL": (
        "Celery's broker, e.g. `redis://127.0.0.1:6379/1`; empty: tasks run in-process"
    ),
    "CELERY_RESULT_BACKEND": "Celery's result backend",
    "CELERY_TASK_ALWAYS_EAGER": "run Celery tasks in the calling process",
    "CELERY_DEFAULT_QUEUE": (
        "the queue of rollups, pruning, titles and KV tier upkeep (docs/jobs.md)"
    ),
    "CELERY_LONG_QUEUE": "the queue of tuning, benchmark and exports, with a worker of its own",
    "CHATAPP_MODELS": (
        "more models beside `CHATAPP_MODEL`, comma-separated, each `folder` or `name=folder` "
        '(docs/api.md, "Models")'
    ),
    "ENGINE_MODE": (
        "`embedded` (the engine in the web process), `distributed` (`run_engine` workers, "
        "docs/workers.md) or `upstream` (another OpenAI-compatible server, docs/api.md)"
    ),
    "ENGINE_PRELOAD": "load the models when the server starts; false: each at its first request",
    "ENGINE_UPSTREAM_URL": "`ENGINE_MODE=upstream`: the server's `/v1` URL",
    "ENGINE_UPSTREAM_API_KEY": "`ENGINE_MODE=upstream`: its API key",
    "ENGINE_UPSTREAM_MODEL": "`ENGINE_MODE=upstream`: its model id; empty: the first it lists",
    "ENGINE_UPSTREAM_CACHE_SALT": (
        "send each request's per-user `cache_salt` (vLLM's field) upstream so its prefix "
        "cache keeps users apart; false for a server that refuses the field"
    ),
    "ENGINE_WORKERS_REDIS_URL": (
        "`ENGINE_MODE=distributed`: where web processes and `run_engine` workers meet"
    ),
    "ENGINE_WORKERS_NAMESPACE": "the workers' key prefix in that Redis",
    "ENGINE_WORKER_ID": "a worker's name; empty: `<hostname>-<pid>`",
    "ENGINE_WORKER_FLUSH_MS": "how long a worker gathers deltas into one message",
    "ENGINE_WORKER_DEAD_AFTER_S": "when a silent worker counts as dead",
    "ENGINE_WORKER_DRAIN_S": (
        "on SIGTERM, how long a worker's running replies get to finish before they are cut"
    ),
    "RESPONSE_CACHE_ENABLED": (
        "replay greedy or seeded requests answered before (docs/response-cache.md)"
    ),
    "RESPONSE_CACHE_URL": "the response cache's Redis",
    "RESPONSE_CACHE_TTL_S": "how long a cached response is kept",
    "CHAT_ALLOW_SIGNUP": "show and accept the sign-up page",
    "CHAT_FLUSH_INTERVAL_MS": "deltas are coalesced over this interval (the first goes at once)",
    "CHAT_MAX_MESSAGE_CHARS": "longest message (and system prompt) accepted",
    "CHAT_MAX_FRAME_BYTES": "largest WebSocket frame read; larger ones get `frame_too_large`",
    "CHAT_MAX_NEW_TOKENS": "highest `max_tokens` a conversation or an API request may set",
    "CHAT_DISCONNECT_GRACE_S": (
        "a reply keeps generating this long after its last viewer left, so a refresh can resume it"
    ),
    "CHAT_DRAIN_S": (
        "on SIGTERM, how long running replies may finish before they are cut and saved"
    ),
    "CHAT_CHECKPOINT_INTERVAL_S": "how often a streaming reply's partial text is saved",
    "CHAT_RATE_LIMIT_PER_MINUTE": "messages one user may send a minute on the chat socket",
    "CHAT_PROMPT_SIZE_PER_MINUTE": (
        "prompt-size counts (POST /api/chat/prompt-size/) one user may ask for a minute"
    ),
    "CHAT_MAX_CONCURRENT_STREAMS": "replies one user may have generating at once",
    "CHAT_ATTACHMENT_MAX_BYTES": 'largest attached file (docs/http.md, "Attachments")',
    "CHAT_ATTACHMENT_MAX_CHARS": "most text kept from one attached file",
    "CHAT_ATTACHMENTS_PER_MESSAGE": "most files attached to one message",
    "CHAT_ATTACHMENT_PENDING_HOURS": "how long an uploaded file never sent is kept",
    "CHAT_PDF_MAX_PAGES": "a PDF's pages read at most (docs/reliability.md)",
    "CHAT_PDF_MAX_CONTENT_BYTES": "a PDF's decoded content bytes read at most",
    "CHAT_PDF_TIMEOUT_S": "wall time a PDF's reader process gets before it is killed",
    "CHAT_IMPORT_MAX_BYTES": (
        "largest import file, and a zip's `conversations.json` once inflated (docs/http.md, "
        '"Import")'
    ),
    "CHAT_IMPORT_MAX_CONVERSATIONS": "most conversations in one import",
    "CHAT_IMPORT_MAX_MESSAGES": "most messages in one imported conversation",
    "CHAT_DEFAULT_SYSTEM_PROMPT": "a new conversation's system prompt",
    "CHAT_DEFAULT_TEMPERATURE": "a new conversation's temperature",
    "CHAT_DEFAULT_TOP_P": "a new conversation's top_p",
    "CHAT_DEFAULT_MAX_TOKENS": "a new conversation's `max_tokens`",
    "OPENAI_MAX_BODY_BYTES": "largest `/v1` request body; larger ones get 413",
    "OPENAI_RATE_LIMIT_PER_MINUTE": (
        "an API key's default requests a minute (per key: the admin's *API keys*)"
    ),
    "OPENAI_MAX_CONCURRENT": "an API key's default requests at once",
    "OPENAI_MAX_KEYS_PER_USER": "live API keys one account may make for itself",
    "METRICS_BEARER_TOKEN": "the bearer token Prometheus sends for `/metrics` (staff need none)",
    "METRICS_REPLICA": "the `replica` label of every `/metrics` series (several web replicas)",
    "OBS_BACKGROUND": "run the web process's scheduler and in-process jobs in background threads",
    "OBS_SAMPLE_INTERVAL_S": "how often the engine's live stats are sampled for the dashboard",
    "OBS_RAW_RETENTION_HOURS": "how long raw request figures (and KV tier upkeep passes) are kept",
    "OBS_ROLLUP_RETENTION_DAYS": "how long per-minute rollups are kept",
    "OBS_JOB_RETENTION_DAYS": (
        "how long finished benchmark, tuning and export jobs and their files are kept"
    ),
    "CHAT_AUTO_TITLES": "title a conversation after its first reply (docs/titles.md)",
    "BENCH_COMMAND": "the dashboard's benchmark job; `--model`, `--json` and `--plot` are appended",
    "BENCH_TIMEOUT_S": "how long the benchmark job may run",
    "OBS_TUNING_TTFT_S": "the tuning job's TTFT target (docs/tuning.md)",
    "OBS_TUNING_TPOT_S": "the tuning job's TPOT target",
    "KV_TIER_UPKEEP_S": "the Redis KV tier upkeep job's period (docs/kv-tier.md)",
    "KV_TIER_WARM_PROMPTS": "how many of the most-used system prompts the upkeep keeps warm",
    "LOG_LEVEL": "the root logger's level",
    # chatapp/settings/production.py
    "DJANGO_SECURE_SSL_REDIRECT": "redirect plain HTTP to HTTPS (false behind plain HTTP)",
    "DJANGO_SECURE_HSTS_SECONDS": "the Strict-Transport-Security max-age",
    # chatapp/settings/test.py
    "TEST_DATABASE_URL": "run the test suite on this database (scripts/test.sh's PostgreSQL pass)",
    # read elsewhere in chatapp/ and inference/
    "DJANGO_SETTINGS_MODULE": (
        "`chatapp.settings.dev`, or `chatapp.settings.production` for deployments "
        "(needs `DJANGO_SECRET_KEY`)"
    ),
    "CHATAPP_CACHE_DIR": "where converted models and the compiled step's cache live",
    "XDG_CACHE_HOME": "the cache folder's parent when `CHATAPP_CACHE_DIR` is unset",
    "PROMETHEUS_MULTIPROC_DIR": (
        "an empty folder shared by several processes serving one address: `/metrics` sums "
        "what each writes there"
    ),
    "ENGINE_KERNELS_AVX512": (
        "`0` serves as on a CPU without AVX512: the native kernels' AVX2 build and the "
        "choices an AVX2-only CPU gets, for comparisons"
    ),
    "ENGINE_AMX_MIN_ROWS": (
        "products of at least this many rows run on AMX's tiles; empty: measured per CPU, "
        "one number: layers and head, `0`: never; for comparisons (docs/performance.md)"
    ),
    "ENGINE_PANEL_MIN_ROWS": (
        "the native path's products of at least this many rows run on 16-column panels; "
        "empty: measured per CPU, one number: layers and head, `0`: never; for comparisons"
    ),
    "CC": "the C compiler that builds the native kernels (default gcc, else cc)",
    "CXX": "the C++ compiler the compiled step (inductor) needs (default g++)",
    "TORCHINDUCTOR_CACHE_DIR": "inductor's cache; default `CHATAPP_CACHE_DIR`/inductor",
    "WORLD_SIZE": "set by `torchrun`: the number of tensor-parallel ranks",
    "RANK": "set by `torchrun`: this process's rank",
    "LOCAL_RANK": "set by `torchrun`: this process's GPU",
    # scripts/*.sh
    "HOST": "`make run`: the address daphne listens on",
    "PORT": "`make run`: the port daphne listens on",
    "WEBSOCKET_MAX_MESSAGE_BYTES": (
        "`make run`: daphne's own WebSocket frame cap (past it daphne drops the connection); "
        "far above `CHAT_MAX_FRAME_BYTES` so big frames get `frame_too_large`"
    ),
    "PYTHON": "`make run` / `make test`: the Python that creates `.venv`",
    "TEST_POSTGRES_URL": "`make test`: the PostgreSQL of the compose-configuration pass",
    "TEST_REDIS_URL": "`make test`: the Redis of the compose-configuration pass",
    "OFFLINE_IMAGES": (
        "`make test-compose`: `force` builds the base images from Debian packages even where "
        "the image hub answers (scripts/offline-images.sh)"
    ),
    "TORCH_CPU_INDEX": "the package index scripts/wheelhouse.sh takes torch's CPU build from",
    "LLAMA_CPP_PYTHON_VERSION": (
        "the llama.cpp sources `make bench-baseline` builds `llama-server` from"
    ),
    "TMPDIR": (
        "`make test`: the folder of the Redis it starts when `/var/lib/redis` is not writable"
    ),
}

# Defaults the code computes, as the reference shows them.
SHOWN_DEFAULTS: dict[str, str] = {
    "CHATAPP_VAR_DIR": "`var/` in the checkout",
    "DJANGO_SECRET_KEY": "a dev-only key",
    "DJANGO_DEBUG": "true with `chatapp.settings.dev`, else false",
    "DATABASE_URL": "`sqlite:///var/db.sqlite3`",
    "CELERY_TASK_ALWAYS_EAGER": "true without a broker",
    "ENGINE_WORKERS_REDIS_URL": "`REDIS_URL` with db 3",
    "METRICS_REPLICA": "the host's name with `CHANNEL_LAYER=redis`, else none",
    "BENCH_COMMAND": "`python -m inference.bench --quick --skip-hf`",
    "DJANGO_SETTINGS_MODULE": "`chatapp.settings.dev`",
    "CHATAPP_CACHE_DIR": "`$XDG_CACHE_HOME/chatapp`",
    "XDG_CACHE_HOME": "`~/.cache`",
    "ENGINE_KERNELS_AVX512": "`1`",
    "CC": "`gcc`",
    "CXX": "`g++`",
    "TORCHINDUCTOR_CACHE_DIR": "`CHATAPP_CACHE_DIR`/inductor",
    "LOCAL_RANK": "`RANK`",
    "CHATAPP_MODEL": (
        "the bundled model, converted once (`CHATAPP_CACHE_DIR`/models/SmolLM2-135M-Instruct)"
    ),
    "ENGINE_AMX_MIN_ROWS": "empty",
    "ENGINE_PANEL_MIN_ROWS": "empty",
}
