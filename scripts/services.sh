#!/usr/bin/env bash
# The local services the test suite talks to: Redis at 127.0.0.1:6379 and PostgreSQL at
# 127.0.0.1:5432. Each one that does not answer is started, when its server is installed
# here, with the same command the machine's own start-up uses; one that cannot be started
# is named, and the tests in front of it fail (or skip, saying why).
# Usage: scripts/services.sh            (called by scripts/test.sh before the tests)
set -uo pipefail

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

port_open() {
  # bash's /dev/tcp: no client program needed.
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

wait_port() {
  for _ in $(seq 1 100); do
    port_open "$1" && return 0
    sleep 0.1
  done
  return 1
}

if ! port_open 6379; then
  if command -v redis-server >/dev/null 2>&1; then
    say "Redis does not answer at 127.0.0.1:6379: starting it"
    dir=/var/lib/redis
    [ -w "$dir" ] || dir="${TMPDIR:-/tmp}"
    logfile=/var/log/redis/ci.log
    [ -w "$(dirname "$logfile")" ] || logfile="$dir/redis.log"
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
      --appendonly no --dir "$dir" --logfile "$logfile" >/dev/null 2>&1 ||
      redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" \
        --appendonly no --dir "$dir" --logfile "$logfile" >/dev/null 2>&1 || true
    wait_port 6379 || echo "Redis could not be started at 127.0.0.1:6379 (see $logfile)" >&2
  else
    echo "no Redis at 127.0.0.1:6379 and no redis-server here: the tests that need Redis fail or skip" >&2
  fi
fi

if ! port_open 5432; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    say "PostgreSQL does not answer at 127.0.0.1:5432: starting it"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start >/dev/null 2>&1 || true
    wait_port 5432 || echo "PostgreSQL could not be started at 127.0.0.1:5432" >&2
  else
    echo "no PostgreSQL at 127.0.0.1:5432 and no pg_ctlcluster here" >&2
  fi
fi
exit 0
