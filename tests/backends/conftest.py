"""Fixtures: a real server process on the tiny model (tests/servers.py)."""

from tests.servers import api_key, model_id, server

__all__ = ["api_key", "model_id", "server"]
