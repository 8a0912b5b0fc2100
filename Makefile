# The two commands: `make run` sets everything up and serves the app on :8000;
# `make test` runs the static checks and the whole test suite. Both are safe to repeat.
# `make check` runs the static checks alone (ruff, mypy, tsc: scripts/check.sh).
.PHONY: run test test-fast test-compose check lint bench bench-baseline

run:
	scripts/run.sh

test:
	scripts/test.sh $(ARGS)

test-fast:
	scripts/test.sh -m "not slow"

# The docker compose stack run for real (README, "Docker compose"): the base images (built
# from Debian packages where the image hub is out of reach), the wheelhouse and npm cache,
# the build, `up`, a chat, an API call, an export job and an engine worker restart through
# the proxy, then `down -v`. Minutes, and docker: not part of `make test`.
test-compose:
	scripts/offline-images.sh
	scripts/wheelhouse.sh
	CHATAPP_COMPOSE_TEST=1 .venv/bin/python -m pytest tests/deploy/test_compose_stack.py -v -s -o timeout=3600 $(ARGS)

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
