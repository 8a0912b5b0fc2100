"""The serving path's database thread (chatapp/db_worker.py): a burst shares one
connection, the connection is closed once the queue is empty, errors reach their caller
and do not fail the next item."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import OperationalError, connection
from django.db.backends.signals import connection_created

from chatapp import db_worker

# The work runs on another connection: it sees committed rows only.
pytestmark = pytest.mark.django_db(transaction=True)


def count_users() -> int:
    return get_user_model().objects.count()


def connection_is_open() -> bool:
    return connection.connection is not None


async def test_a_burst_shares_one_connection_which_closes_when_the_queue_is_empty() -> None:
    # Not asyncio.to_thread: its executor thread would keep a connection open past the test.
    await db_worker.run(get_user_model().objects.create_user, "dora", password="pw-12345678")
    opened: list[Any] = []

    def created(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened.append(threading.current_thread().name)

    connection_created.connect(created)
    try:
        # The first item holds the thread until the whole burst is queued behind it.
        gate = threading.Event()
        first = asyncio.ensure_future(db_worker.run(lambda: (gate.wait(10), count_users())[1]))
        await asyncio.sleep(0)
        burst = [asyncio.ensure_future(db_worker.run(count_users)) for _ in range(40)]
        await asyncio.sleep(0)
        gate.set()
        counts = await asyncio.gather(first, *burst)
        assert counts == [1] * 41
        assert opened == ["db-worker"]
        # Queued after the burst had drained: its connection was closed by then.
        assert await db_worker.run(connection_is_open) is False
    finally:
        connection_created.disconnect(created)


async def test_errors_reach_their_caller_and_the_next_item_still_runs() -> None:
    def broken() -> None:
        raise OperationalError("server closed the connection unexpectedly")

    with pytest.raises(OperationalError, match="closed the connection"):
        await db_worker.run(broken)
    with pytest.raises(ZeroDivisionError):
        await db_worker.run(lambda: 1 / 0)
    assert await db_worker.run(count_users) == 0


async def test_a_cancelled_caller_does_not_stop_the_thread() -> None:
    gate = threading.Event()
    held = asyncio.ensure_future(db_worker.run(gate.wait, 10))
    waiting = asyncio.ensure_future(db_worker.run(count_users))
    await asyncio.sleep(0)
    waiting.cancel()
    gate.set()
    assert await held is True
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await db_worker.run(count_users) == 0
