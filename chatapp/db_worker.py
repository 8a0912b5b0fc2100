"""One thread that runs the serving path's short database work for async code: the API
key check before a request reaches the engine, and the record a request leaves when its
stream ends.

Why not `sync_to_async`: under ASGI each request runs its sync work on a thread of its
own, and Django opens a new database connection on each (and closes it when the request
ends). A burst of 64 requests then opens 64 connections at once, on the cores the engine
computes on; with SQLite each open is ~40 Django SQL functions registered and two
PRAGMAs, and on a busy 2-core host that took 40-55 ms per request before its first query
(`python -m inference.bench.burst`). Here one thread keeps its connection while
work is queued and closes it as soon as the queue is empty, so a burst pays one open, a
lone request pays what it paid before, and no connection outlives the work (a test
database can still be dropped, a restarted server is reconnected to).

The work runs on another thread than the caller's, on its own connection: it sees
committed rows only (a test that checks through it wants `django_db(transaction=True)`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError, connections

T = TypeVar("T")

_Item = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]

_queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
_lock = threading.Lock()
_thread: threading.Thread | None = None
_pid = 0


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _serve() -> None:
    while True:
        work, loop, future = _queue.get()
        result: Any = None
        error: BaseException | None = None
        if not future.cancelled():
            try:
                result = work()
            except BaseException as exc:  # handed to the caller, whatever it is
                error = exc
                if isinstance(exc, DatabaseError):
                    # A broken connection (the server restarted, the file went away) must
                    # not fail the next item too.
                    connections.close_all()
        # Closed before the answer goes out, not after: a caller that queues its next item
        # as soon as it has this one would otherwise race the check, and a test database
        # dropped right after its last test would still have this connection on it.
        if _queue.empty():
            connections.close_all()
        # RuntimeError: that loop has closed, nobody waits for the answer.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, future, result, error)


def _ensure_thread() -> None:
    global _thread, _pid
    with _lock:
        # After a fork (a Celery worker's children) the parent's thread is not there.
        if _thread is not None and _thread.is_alive() and _pid == os.getpid():
            return
        _pid = os.getpid()
        _thread = threading.Thread(target=_serve, name="db-worker", daemon=True)
        _thread.start()


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on the database thread; its result or its exception."""
    _ensure_thread()
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    _queue.put((lambda: fn(*args, **kwargs), loop, future))
    return await future
