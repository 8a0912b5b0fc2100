# The two commands: `make run` sets everything up and serves the app on :8000;
# `make test` runs the static checks and the whole test suite. Both are safe to repeat.
# `make check` runs the static checks alone (ruff, mypy, tsc: scripts/check.sh).
.PHONY: run test test-fast check lint bench bench-baseline

run:
	scripts/run.sh

test:
	scripts/test.sh $(ARGS)

test-fast:
	scripts/test.sh -m "not slow"

check:
	scripts/check.sh

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

bench:
	.venv/bin/python -m inference.bench $(ARGS)

# llama.cpp's llama-server, built once into the cache folder: the benchmark's baseline
# (python -m inference.bench.vs_llama) and the upstream engine of the tests in front of it
# (scripts/test.sh builds it too). Never needed by run.
bench-baseline:
	scripts/build-llama-server.sh
