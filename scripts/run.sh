#!/usr/bin/env bash
# Set up (if needed) and serve the app on http://127.0.0.1:8000 on the embedded
# default: SQLite, the in-memory channel layer, the engine in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/python manage.py ensure_admin
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8000}"
printf '\033[1m==> serving on http://%s:%s/ (Ctrl+C stops)\033[0m\n' "$HOST" "$PORT"
# Frames past CHAT_MAX_FRAME_BYTES get a `frame_too_large` error frame from the app; daphne's
# own cap (1 MiB by default, past which it drops the connection) sits well above it.
WS_MAX_BYTES="${WEBSOCKET_MAX_MESSAGE_BYTES:-16777216}"
exec .venv/bin/daphne -b "$HOST" -p "$PORT" \
  --websocket-max-message-size "$WS_MAX_BYTES" --websocket-max-frame-size "$WS_MAX_BYTES" \
  chatapp.asgi:application
