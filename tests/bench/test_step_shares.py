"""vs_llama's step-time shares from a real server's /metrics: a short chat-mix run on the
tiny model, read before and after as the benchmark reads it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference.bench import step_kinds
from inference.bench.api_clients import run_level
from tests.servers import PASSWORD, engine_stats, started, users_code
from tools.live_server import LiveServer

TOKEN = "step-shares-test-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LiveServer]:
    srv = LiveServer(
        tmp_path_factory.mktemp("step-shares"), tiny_model_dir, METRICS_BEARER_TOKEN=TOKEN
    )
    started(srv, users_code("apiuser", password=PASSWORD))
    yield srv
    srv.stop()


@pytest.mark.slow  # a real server's start: 20-40 s
def test_step_time_by_kind_from_metrics(server: LiveServer, tiny_model_dir: Path) -> None:
    key = server.make_key("apiuser")
    before = step_kinds.read(server.url, TOKEN)
    assert set(before) == set(step_kinds.KINDS)  # every kind, from the first scrape on
    level = asyncio.run(
        run_level(f"{server.url}/v1", key, tiny_model_dir.name, 3, 2, 8,
                  {"temperature": 0.0}, "chat-mix", seed=3)
    )  # fmt: skip
    after = step_kinds.read(server.url, TOKEN)
    assert level["requests"] == 6 and level["tokens"] > 0
    shares = step_kinds.shares(before, after)
    assert sum(shares[k] for k in step_kinds.KINDS) == pytest.approx(1.0)
    # Three first turns reach an idle engine together: a prompt-only step comes first;
    # then replies decode.
    assert shares["prompt"] > 0 and shares["decode"] > 0
    assert 0 < shares["step_s"] < level["seconds"]
    # The metric is the engine's own figure (scraped while the server is idle).
    stats = engine_stats(server)
    for kind in step_kinds.KINDS:
        assert after[kind] == pytest.approx(stats[f"step_seconds_{kind}"], rel=1e-6)


def test_no_shares_without_the_metric() -> None:
    assert step_kinds.step_seconds("# HELP x y\n# TYPE x counter\nx_total 3.0\n") == {}
    assert step_kinds.shares({}, {}) == {}
