# The two commands: `make run` sets everything up and serves the app on :8000;
# `make test` runs the whole test suite. Both are safe to repeat.
.PHONY: run test test-fast lint bench

run:
	scripts/run.sh

test:
	scripts/test.sh $(ARGS)

test-fast:
	scripts/test.sh -m "not slow"

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

bench:
	.venv/bin/python -m inference.bench $(ARGS)
