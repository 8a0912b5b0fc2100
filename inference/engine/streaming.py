"""One request's stream of deltas, read from a queue until its finished delta: the loop
every way to reach an engine shares (AsyncEngine here; the upstream and remote backends).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Protocol

from inference.engine.outputs import Delta


class DeltaSource(Protocol):
    """What the deltas come from: an asyncio.Queue of them (and of errors)."""

    async def get(self) -> Delta | BaseException: ...


async def until_finished(
    source: DeltaSource, abandon: Callable[[], object]
) -> AsyncGenerator[Delta, None]:
    """Yield the deltas put on `source` up to and including the finished one. An exception
    put there is raised: the request ended with it. If the stream ends any other way first
    (the consumer stopped reading, closed the stream or was cancelled), `abandon()` stops
    the request, so an engine never works for nobody.

    Close it when done (`contextlib.aclosing`), as any async generator read inside
    another: an early exit then runs `abandon` at once, not whenever it is collected."""
    finished = False
    try:
        while not finished:
            item = await source.get()
            if isinstance(item, BaseException):
                finished = True
                raise item
            finished = item.finished
            yield item
    finally:
        if not finished:
            abandon()
