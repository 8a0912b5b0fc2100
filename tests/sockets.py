"""The chat WebSocket in this process, as a logged-in browser opens it: the session cookie,
the socket and the client that speaks the chat protocol over it. Plain helpers, shared by
tests/chat and tests/reliability (tests/chat/conftest.py builds its fixtures on them)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from chatapp.asgi import application


def session_cookie(user: Any) -> bytes:
    client = Client()
    client.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}".encode()


class ChatSocket:
    """A logged-in WebSocket client speaking the chat protocol."""

    def __init__(self, communicator: WebsocketCommunicator) -> None:
        self.c = communicator

    async def send(self, frame: dict[str, Any]) -> None:
        await self.c.send_json_to(frame)

    async def recv(self, timeout: float = 30) -> dict[str, Any]:
        return await self.c.receive_json_from(timeout=timeout)

    async def recv_until(self, kind: str, timeout: float = 60) -> list[dict[str, Any]]:
        """Frames up to and including the first of type `kind`."""
        frames = []
        while True:
            frame = await self.recv(timeout)
            frames.append(frame)
            if frame["type"] == kind:
                return frames

    async def close(self) -> None:
        await self.c.disconnect()


# The sockets a test opened (open_socket, opened), closed at its end by
# sockets_closed_at_the_end while its event loop still runs. A consumer left running waits
# on the channel layer, and the Redis layer's receive, cancelled only as pytest-asyncio
# closes the loop with every other task, may never finish: the test's teardown then hangs.
_opened: list[WebsocketCommunicator] = []


def opened(communicator: WebsocketCommunicator) -> WebsocketCommunicator:
    """`communicator`, closed at the test's end (sockets_closed_at_the_end) unless it is first."""
    _opened.append(communicator)
    return communicator


@pytest.fixture(autouse=True)
async def sockets_closed_at_the_end() -> AsyncIterator[None]:
    """Every socket a test opened through `opened` whose consumer still runs, disconnected
    while the test's event loop runs (autouse where a conftest imports it)."""
    yield
    while _opened:
        communicator = _opened.pop()
        if not communicator.future.done():
            with contextlib.suppress(Exception):
                await communicator.disconnect()


async def open_socket(
    user: Any | None, origin: bytes = b"http://127.0.0.1"
) -> tuple[ChatSocket, bool, Any]:
    headers = [(b"origin", origin), (b"host", b"127.0.0.1")]
    if user is not None:
        headers.append((b"cookie", await database_sync_to_async(session_cookie)(user)))
    communicator = opened(WebsocketCommunicator(application, "/ws/chat/", headers=headers))
    connected, code = await communicator.connect()
    return ChatSocket(communicator), connected, code


@contextlib.asynccontextmanager
async def user_socket(make_user: Any, name: str = "alice") -> AsyncIterator[ChatSocket]:
    """A socket logged in as a new user `name` (made by the make_user fixture), its user on
    `.user`; closed on leaving."""
    user = await database_sync_to_async(make_user)(name)
    sock, connected, _ = await open_socket(user)
    assert connected
    sock.user = user  # type: ignore[attr-defined]
    try:
        yield sock
    finally:
        await sock.close()
