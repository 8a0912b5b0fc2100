#!/usr/bin/env bash
# Set up (if needed), run the static checks (scripts/check.sh: ruff, mypy, tsc), then the
# whole test suite: Python (pytest, the slow real-model and browser tests included) and
# the frontend unit tests. A failed check fails the run, but the tests still run so that
# one failure never hides another. Extra arguments go to pytest, e.g. `make test ARGS="-m 'not slow'"` for the fast set alone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The browser tests drive Debian's Chromium (never a browser downloaded by a test tool).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    printf '\033[1m==> installing chromium (Debian package)\033[0m\n'
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: install Debian's chromium package (the browser tests need it)" >&2
  fi
fi
status=0
# Redis and PostgreSQL must answer before the tests: start whichever does not.
scripts/services.sh
# The static checks first: they take seconds, the tests minutes.
scripts/check.sh || status=$?
# llama.cpp's llama-server, the upstream engine of tests/backends/test_upstream_llama.py: built
# once into the cache folder (minutes on a new machine; afterwards this only finds it).
# Without the tools to build it, those tests skip and say why.
missing=$(.venv/bin/python -c 'from inference.bench.llama_server import missing_build_tools as m; print(" ".join(m()))')
if [ -z "$missing" ]; then
  scripts/build-llama-server.sh >/dev/null || { echo "building llama-server failed (scripts/build-llama-server.sh)" >&2; status=1; }
else
  echo "no $missing here: llama-server cannot be built, the tests in front of it will skip" >&2
fi
if [ -f frontend/package.json ]; then
  (cd frontend && npm test --silent) || status=$?
fi
# pytest exits 5 when it collected no tests: that is a failure here, not a pass. The 25
# slowest test phases are listed at the end of each run: where its time went (the aim is
# under 30 minutes for the whole of make test).
# The whole suite runs as two pytest processes at once: the engine's and the job queues'
# tests (in-process models, kernels and Celery workers: mostly computing) beside the web
# app's (servers, sockets and browsers: mostly waiting on them). Run one after the other
# they kept about one of two cores busy. They share no Redis database that either empties,
# no test database (each process has its own) and no file. Arguments that name tests run
# them in one process, as before.
SPLIT=(tests/engine tests/backends tests/bench tests/jobs)
named=""
for arg in "$@"; do
  if [ -e "${arg%%::*}" ]; then named=1; fi
done
if [ -n "$named" ]; then
  .venv/bin/python -m pytest --durations=25 "$@" || status=$?
else
  others=()
  for dir in "${SPLIT[@]}"; do others+=("--ignore=$dir"); done
  split_log=$(mktemp)
  .venv/bin/python -m pytest -p no:cacheprovider --durations=25 "$@" "${SPLIT[@]}" >"$split_log" 2>&1 &
  split_pid=$!
  .venv/bin/python -m pytest --durations=25 "$@" "${others[@]}" || status=$?
  split_status=0
  wait "$split_pid" || split_status=$?
  printf '\033[1m==> %s\033[0m\n' "${SPLIT[*]} (run beside the tests above)"
  cat "$split_log"
  rm -f "$split_log"
  if [ "$split_status" != 0 ]; then status=$split_status; fi
fi
# The chat, API and reliability tests again in docker compose's configuration: PostgreSQL
# (NUL handling, races and locking differ from SQLite) and the Redis channel layer (the
# chat's sockets, groups and resume go through Redis). Only the tests that use the test
# database run (tests/conftest.py); pytest-django makes and drops its own test_ database on
# this server, and the layer's keys carry this run's prefix (chatapp/settings/test.py).
# tests/deploy runs real server processes in that configuration in the first pass.
scripts/services.sh  # again: a service that went away during the first pass is back for the second
PG_URL="${TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
if .venv/bin/python -c 'import sys, psycopg; psycopg.connect(sys.argv[1], connect_timeout=5).close()' "$PG_URL" 2>/dev/null; then
  printf '\033[1m==> the database tests again, on PostgreSQL (%s) and the Redis channel layer\033[0m\n' "$PG_URL"
  TEST_DATABASE_URL="$PG_URL" CHANNEL_LAYER=redis REDIS_URL="${TEST_REDIS_URL:-redis://127.0.0.1:6379/0}" \
    .venv/bin/python -m pytest tests/chat tests/openai_api tests/reliability -m "not slow" || status=$?
else
  echo "PostgreSQL does not answer at $PG_URL: the PostgreSQL pass of the tests cannot run." >&2
  echo "Start PostgreSQL there (trust auth, user postgres), or point TEST_POSTGRES_URL at one." >&2
  status=1
fi
exit "$status"
