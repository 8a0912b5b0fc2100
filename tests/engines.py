"""The real engine as the web app's engine in tests: on a model folder (the tiny
random-weight llama, or the real default model), installed in this process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from inference.backends.embedded import EmbeddedClient
from inference.client import set_engine_client
from inference.engine import EngineConfig
from inference.engine.async_engine import AsyncEngine


@contextmanager
def installed_engine(model_dir: Path) -> Iterator[EmbeddedClient]:
    """The real engine on `model_dir`, installed as the web app's engine meanwhile."""
    client = make_engine_client(model_dir)
    set_engine_client(client)
    try:
        yield client
    finally:
        set_engine_client(None)


def make_engine_client(
    model_dir: Path, name: str | None = None, **overrides: Any
) -> EmbeddedClient:
    """The real engine on `model_dir`, served as `name` (default: the default model's);
    small by default, `overrides` on top."""
    small = {"max_num_seqs": 8, "max_num_batched_tokens": 256, "kv_cache_memory_mb": 64}
    config = EngineConfig(model=str(model_dir), dtype="float32", **{**small, **overrides})
    return EmbeddedClient(AsyncEngine(config), name=name)
