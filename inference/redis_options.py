"""The options of every long-lived Redis client of the serving side and the web app: the
engine workers' channel layer and the chat's channel layer (chatapp/settings/base.py).

channels_redis waits for a message with a blocking read (BZPOPMIN) of up to
`channels_redis.core.RedisChannelLayer.brpop_timeout` (5 s). A socket read timeout at or
under that fails every idle wait: redis-py 8 defaults to 5 s, and a chat socket on the Redis
layer then closed with 1011 after 5 s. The socket timeout here outlasts the blocking read
and still notices a Redis that stopped answering. tests/test_channel_layer.py checks both.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError

# channels_redis' blocking read, and the margin a busy Redis gets on top of it.
BLOCKING_READ_S = 5.0
SOCKET_TIMEOUT_S = BLOCKING_READ_S + 5.0
CONNECT_TIMEOUT_S = 1.0
# Short connect timeout, and one immediate retry on a broken connection (a pooled
# connection is stale after Redis restarted).
REDIS_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": CONNECT_TIMEOUT_S,
    "socket_timeout": SOCKET_TIMEOUT_S,
    "retry_on_error": [ConnectionError],
}


def channel_layer_host(url: str) -> dict[str, Any]:
    """A channels_redis `hosts` entry for `url` with these options."""
    return {"address": url, **REDIS_OPTIONS}
