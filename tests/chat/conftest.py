"""Fixtures for the chat feature: users, logged-in sockets, an engine on a tiny model.
The socket helpers themselves are plain functions in tests/sockets.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from inference.backends.embedded import EmbeddedClient
from tests.sockets import ChatSocket, open_socket


@pytest.fixture
async def alice_socket(make_user: Any, tiny_engine: EmbeddedClient) -> AsyncIterator[ChatSocket]:
    user = await database_sync_to_async(make_user)("alice")
    sock, connected, _ = await open_socket(user)
    assert connected
    sock.user = user  # type: ignore[attr-defined]
    yield sock
    await sock.close()
