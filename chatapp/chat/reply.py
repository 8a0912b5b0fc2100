"""A reply as a chat socket watches it, wherever it is generated: a Generation in this
process (generation.py) or one another web replica generates (replicas.RemoteReply). Both
modules build on this one, so neither imports the other to name it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(eq=False)
class Subscription:
    """One watcher's queue of a reply's events."""

    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)


class Reply(Protocol):
    """A reply as a socket watches it: a Generation here, or one another web replica
    generates (replicas.RemoteReply)."""

    message_id: int
    text: str
    deltas_sent: int
    finished: bool

    def subscribe(self) -> Subscription: ...

    def unsubscribe(self, sub: Subscription) -> None: ...

    def stop(self, reason: str = "abort") -> None: ...
