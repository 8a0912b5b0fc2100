"""Fixtures of the engine workers' tests: a Redis connection, a namespace of the module's
own and the web side's client for the module's workers. The workers themselves and the
other helpers are plain code in tests/engine_workers.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from tests.engine_workers import REDIS_URL, distributed_client


@pytest.fixture(scope="module")
def redis() -> Iterator[Redis]:
    client = Redis.from_url(REDIS_URL, socket_timeout=5)
    yield client
    client.close()


@pytest.fixture(scope="module")
def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def client(workers: list[Any], tiny_model_dir: Path, namespace: str) -> Iterator[Any]:
    """The web side's distributed client, for a module whose `workers` fixture runs them."""
    with distributed_client(tiny_model_dir, namespace) as c:
        yield c
