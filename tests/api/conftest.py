from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live_server import LiveServer

PASSWORD = "a-long-test-password-1"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LiveServer]:
    srv = LiveServer(tmp_path_factory.mktemp("api-server"), tiny_model_dir).start()
    srv.make_user("apiuser", PASSWORD)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_key(server: LiveServer) -> str:
    return server.make_key("apiuser")


@pytest.fixture(scope="module")
def model_id(tiny_model_dir: Path) -> str:
    return tiny_model_dir.name


def logged_in(server: LiveServer, username: str = "apiuser") -> httpx.Client:
    return server.login(username, PASSWORD)


def engine_stats(server: LiveServer) -> dict[str, Any]:
    c = logged_in(server)
    try:
        return c.get("/api/engine/").json()["stats"]
    finally:
        c.close()
