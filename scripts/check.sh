#!/usr/bin/env bash
# The static checks: ruff's lint and format, mypy (strict on inference/engine, see
# [tool.mypy] in pyproject.toml), the import contracts (lint-imports: the layering, see
# [tool.importlinter] in pyproject.toml) and the TypeScript compiler. Every check runs even when
# an earlier one fails, so one failure never hides another; the exit status is non-zero
# when any failed. Called by scripts/test.sh (so by `make test` and CI) before the tests;
# `make check` runs it alone. Needs the tools scripts/setup.sh installs.
set -uo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

for tool in ruff mypy lint-imports; do
  if [ ! -x ".venv/bin/$tool" ]; then
    echo "check: .venv/bin/$tool is missing: run scripts/setup.sh (make test does) first" >&2
    exit 1
  fi
done

failed=()
# run NAME HOW-TO-FIX COMMAND...: one check, remembered by name when it fails.
run() {
  local name=$1 fix=$2
  shift 2
  say "check: $name"
  if ! "$@"; then
    echo "check failed: $name ($fix)" >&2
    failed+=("$name")
  fi
}

run "ruff check" "fix by hand or with: .venv/bin/ruff check --fix ." .venv/bin/ruff check .
run "ruff format" "reformat with: .venv/bin/ruff format ." .venv/bin/ruff format --check .
run "mypy" "fix the type errors above" .venv/bin/mypy
run "lint-imports" "an import breaks the layering: see the contract above" .venv/bin/lint-imports
if [ -f frontend/package.json ]; then
  # --no: never fetch a compiler from the registry; the one in node_modules is the pinned one.
  run "tsc" "fix the TypeScript errors above" bash -c 'cd frontend && npx --no -- tsc --noEmit'
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf '\033[1;31m==> checks failed: %s\033[0m\n' "$(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')" >&2
  exit 1
fi
say "checks passed"
