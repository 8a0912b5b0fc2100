#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: Python (pytest, the slow real-model
# and browser tests included) and the frontend unit tests. Extra arguments go to
# pytest, e.g. `make test ARGS="-m 'not slow'"` for the fast set alone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
status=0
if [ -f frontend/package.json ]; then
  (cd frontend && npm test --silent) || status=$?
fi
# pytest exits 5 when it collected no tests: that is a failure here, not a pass.
.venv/bin/python -m pytest "$@" || status=$?
exit "$status"
