"""A chat socket ends with the login it was opened with: close code 4401 on logout,
password change, deactivation or deletion, on the in-memory and the Redis channel
layer alike; and a socket opened without a login is told so with 4401 as well."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client

from chatapp.asgi import application
from tests.sockets import open_socket, opened
from tools.live_server import free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["memory", "redis"])
def channel_layer(request: pytest.FixtureRequest, settings: Any) -> Iterator[str]:
    if request.param == "redis":
        settings.CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                "CONFIG": {"hosts": [django_settings.REDIS_URL], "prefix": f"test-{os.getpid()}"},
            }
        }
    yield request.param


def logged_in_client(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


async def socket_of(client: Client) -> WebsocketCommunicator:
    """A chat socket opened with this browser session's cookie."""
    cookie = f"{django_settings.SESSION_COOKIE_NAME}={client.session.session_key}".encode()
    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"), (b"cookie", cookie)]
    communicator = opened(WebsocketCommunicator(application, "/ws/chat/", headers=headers))
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def closed_with(communicator: WebsocketCommunicator, timeout: float = 3) -> int | None:
    """The close code the server sent, skipping other output."""
    while True:
        out = await communicator.receive_output(timeout)
        if out["type"] == "websocket.close":
            return out.get("code")


async def still_answers(communicator: WebsocketCommunicator) -> bool:
    await communicator.send_json_to({"type": "ping"})
    return (await communicator.receive_json_from(timeout=3))["type"] == "pong"


async def test_an_anonymous_socket_is_accepted_then_closed_with_4401(db: None) -> None:
    sock, connected, _ = await open_socket(None)
    assert connected  # accepted, so the browser sees the code, not a bare 1006
    assert await closed_with(sock.c) == 4401


async def test_logout_closes_that_sessions_sockets_with_4401(
    make_user: Any, channel_layer: str
) -> None:
    alice = await database_sync_to_async(make_user)("alice")
    laptop = await database_sync_to_async(logged_in_client)(alice)
    phone = await database_sync_to_async(logged_in_client)(alice)
    laptop_tabs = [await socket_of(laptop), await socket_of(laptop)]
    phone_tab = await socket_of(phone)
    try:
        answer = await database_sync_to_async(laptop.post)("/accounts/logout/")
        assert answer.status_code == 302
        assert (await database_sync_to_async(laptop.get)("/api/me/")).status_code == 401
        for tab in laptop_tabs:
            assert await closed_with(tab) == 4401
        # The phone's session still logs alice in (as it does over HTTP): its socket stays.
        assert await still_answers(phone_tab)
    finally:
        for tab in [*laptop_tabs, phone_tab]:
            await tab.disconnect()


@pytest.mark.parametrize("change", ["password", "deactivated", "deleted"])
async def test_a_changed_login_closes_every_socket_of_that_user(
    make_user: Any, channel_layer: str, change: str
) -> None:
    alice = await database_sync_to_async(make_user)("alice")
    bob = await database_sync_to_async(make_user)("bob")
    alice_tabs = [
        await socket_of(await database_sync_to_async(logged_in_client)(alice)) for _ in range(2)
    ]
    bob_tab = await socket_of(await database_sync_to_async(logged_in_client)(bob))

    def apply_change() -> None:
        if change == "password":
            alice.set_password("another-long-password-2")
            alice.save()
        elif change == "deactivated":
            alice.is_active = False
            alice.save()
        else:
            alice.delete()

    try:
        await database_sync_to_async(apply_change)()
        for tab in alice_tabs:
            assert await closed_with(tab) == 4401
        assert await still_answers(bob_tab)
    finally:
        for tab in [*alice_tabs, bob_tab]:
            await tab.disconnect()


async def test_saving_a_user_without_changing_the_login_keeps_the_sockets(
    make_user: Any,
) -> None:
    alice = await database_sync_to_async(make_user)("alice")
    tab = await socket_of(await database_sync_to_async(logged_in_client)(alice))
    try:

        def rename() -> None:
            alice.first_name = "Alice"
            alice.save()

        await database_sync_to_async(rename)()
        assert await still_answers(tab)
    finally:
        await tab.disconnect()


async def test_logging_out_works_while_the_channel_layer_is_away(
    make_user: Any, settings: Any
) -> None:
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [f"redis://127.0.0.1:{free_port()}/0"]},  # nothing listens
        }
    }
    alice = await database_sync_to_async(make_user)("alice")
    browser = await database_sync_to_async(logged_in_client)(alice)
    answer = await database_sync_to_async(browser.post)("/accounts/logout/")
    assert answer.status_code == 302
    assert (await database_sync_to_async(browser.get)("/api/me/")).status_code == 401
