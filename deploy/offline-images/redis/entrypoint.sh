#!/bin/sh
set -eu
if [ "${1:-}" = redis-server ]; then
    shift
    exec redis-server --protected-mode no "$@"
fi
exec "$@"
