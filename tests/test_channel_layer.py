"""The Redis channel layer (used when several processes serve) against the real Redis."""

from __future__ import annotations

import uuid

import pytest
from channels_redis.core import RedisChannelLayer

REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture
async def layer():
    layer = RedisChannelLayer(hosts=[REDIS], prefix=f"test-{uuid.uuid4().hex[:8]}")
    yield layer
    await layer.flush()
    await layer.close_pools()


async def test_messages_cross_the_redis_layer(layer: RedisChannelLayer) -> None:
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "chat.delta", "text": "héllo 👋"})
    assert (await layer.receive(channel)) == {"type": "chat.delta", "text": "héllo 👋"}


async def test_group_messages_reach_every_member(layer: RedisChannelLayer) -> None:
    a, b = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("viewers", a)
    await layer.group_add("viewers", b)
    await layer.group_send("viewers", {"type": "chat.done"})
    assert (await layer.receive(a))["type"] == "chat.done"
    assert (await layer.receive(b))["type"] == "chat.done"


def test_settings_select_the_redis_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    import chatapp.settings.base as base

    monkeypatch.setenv("CHANNEL_LAYER", "redis")
    try:
        reloaded = importlib.reload(base)
        assert (
            reloaded.CHANNEL_LAYERS["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
        )
    finally:
        monkeypatch.delenv("CHANNEL_LAYER")
        importlib.reload(base)


async def test_the_settings_layer_waits_past_its_blocking_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A receive on an empty channel outlasts channels_redis' blocking read (BZPOPMIN,
    `brpop_timeout`): with a socket timeout at or under it, the read failed with redis-py's
    TimeoutError and every idle chat socket closed with 1011."""
    import asyncio
    import importlib

    import chatapp.settings.base as base

    monkeypatch.setenv("CHANNEL_LAYER", "redis")
    monkeypatch.setenv("REDIS_URL", REDIS)
    try:
        config = importlib.reload(base).CHANNEL_LAYERS["default"]["CONFIG"]
    finally:
        monkeypatch.delenv("CHANNEL_LAYER")
        importlib.reload(base)
    layer = RedisChannelLayer(**{**config, "prefix": f"test-{uuid.uuid4().hex[:8]}"})
    assert config["hosts"][0]["socket_timeout"] > layer.brpop_timeout
    channel = await layer.new_channel()
    try:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(layer.receive(channel), layer.brpop_timeout + 2)
    finally:
        await layer.close_pools()
