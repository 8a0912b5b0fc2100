#!/bin/sh
# The first start makes the cluster, its superuser (POSTGRES_USER, password
# POSTGRES_PASSWORD) and database (POSTGRES_DB), as the official image does; every start
# then runs the server listening on all interfaces with password authentication.
set -eu
if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    user="${POSTGRES_USER:-postgres}"
    pwfile="$(mktemp)"
    printf '%s\n' "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" > "$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    db="${POSTGRES_DB:-$user}"
    if [ "$db" != postgres ]; then
        echo "CREATE DATABASE \"$db\" OWNER \"$user\";" | postgres --single -D "$PGDATA" postgres >/dev/null
    fi
fi
if [ "${1:-}" = postgres ]; then
    shift
    exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
