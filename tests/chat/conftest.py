"""Fixtures for the chat feature: users, logged-in sockets, an engine on a tiny model.
The socket helpers themselves are plain functions in tests/sockets.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from inference.backends.embedded import EmbeddedClient
from tests.sockets import ChatSocket, sockets_closed_at_the_end, user_socket

__all__ = ["sockets_closed_at_the_end"]  # autouse here (tests/sockets.py)


@pytest.fixture
async def alice_socket(make_user: Any, tiny_engine: EmbeddedClient) -> AsyncIterator[ChatSocket]:
    async with user_socket(make_user) as sock:
        yield sock
