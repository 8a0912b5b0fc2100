"""One writer that saves every streaming reply's text so far, so that a crash (SIGKILL,
power loss) loses at most about CHAT_CHECKPOINT_INTERVAL_S of what a reader saw.

A write per token would cost a transaction per token per stream; a timer per reply would
cost a transaction per stream per interval, each one queued behind the others on
SQLite's single writer. Here each reply only marks itself changed (a dict assignment on
the event loop), and one task saves all the changed replies every interval in a single
short transaction on the serving path's database thread (chatapp/db_worker.py). Its cost
at 64 streams: `python -m chatapp.chat.checkpoint_bench`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from chatapp import db_worker
from chatapp.chat.models import Message

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    """A reply's text as it stood when the batch was taken."""

    message_id: int
    text: str


def save_progress(batch: Iterable[Progress]) -> set[int]:
    """Save each reply's text so far in one transaction; the ids of the replies that no
    longer exist (deleted with their conversation), whose generation should stop.

    Only rows still streaming are written: a reply that ended meanwhile was saved whole
    by its final save, which a late checkpoint must not undo. The token ids are saved
    only by that final save; until then they are left empty, never behind the text, so a
    reply cut by a crash goes into the next prompt as text (PostgreSQL took ~2 ms to
    store a 1,024-id jsonb list, 64 of them 130 ms a batch against 8 ms for the text).
    One prepared UPDATE for every row (executemany), not the ORM's bulk_update, whose CASE
    expressions cost several times the write (python -m tools.checkpoint_bench)."""
    rows = [(p.text, p.message_id) for p in batch]
    if not rows:
        return set()
    conn = connections[Message.objects.db]
    no_ids = Message._meta.get_field("token_ids").get_db_prep_save([], conn)
    now = Message._meta.get_field("updated_at").get_db_prep_save(timezone.now(), conn)
    qn = conn.ops.quote_name
    sql = (
        f"UPDATE {qn(Message._meta.db_table)} SET {qn('text')} = %s, {qn('token_ids')} = %s,"
        f" {qn('updated_at')} = %s WHERE {qn('id')} = %s AND {qn('status')} = %s"
    )
    streaming = str(Message.Status.STREAMING)
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        cursor.executemany(sql, [(text, no_ids, now, pk, streaming) for text, pk in rows])
    ids = {pk for _, pk in rows}
    return ids - set(Message.objects.filter(pk__in=ids).values_list("pk", flat=True))


class CheckpointWriter:
    """The replies changed since the last save, and the one task that saves them."""

    def __init__(self) -> None:
        self._changed: dict[int, Callable[[], Progress]] = {}
        self._task: asyncio.Task[None] | None = None
        self._on_gone: dict[int, Callable[[], None]] = {}

    def changed(
        self, message_id: int, progress: Callable[[], Progress], gone: Callable[[], None]
    ) -> None:
        """Note that a reply has new text; `progress` is read when the batch is taken,
        `gone` is called if its message turns out to be deleted."""
        self._changed[message_id] = progress
        self._on_gone[message_id] = gone
        loop = asyncio.get_running_loop()
        # A task left on a loop that has closed (a test's) never runs again: start anew.
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run(), name="reply-checkpoints")

    def forget(self, message_id: int) -> None:
        """The reply is saved whole from here on (its final save)."""
        self._changed.pop(message_id, None)
        self._on_gone.pop(message_id, None)

    async def _run(self) -> None:
        # Ends when nothing is left to save; the next change starts it again.
        while self._changed:
            await asyncio.sleep(float(settings.CHAT_CHECKPOINT_INTERVAL_S))
            await self.flush()

    async def flush(self) -> None:
        """Save every changed reply now, in one transaction."""
        # Taken on the event loop, between deltas: each reply's text and ids agree.
        taken, self._changed = self._changed, {}
        batch = [progress() for progress in taken.values()]
        if not batch:
            return
        try:
            gone = await db_worker.run(save_progress, batch)
        except Exception:
            # A locked or unreachable database: the next batch carries the same text on.
            log.warning("could not checkpoint %d streaming replies", len(batch), exc_info=True)
            for message_id, progress in taken.items():
                if message_id in self._on_gone:  # still streaming
                    self._changed.setdefault(message_id, progress)
            return
        for message_id in gone:
            on_gone = self._on_gone.pop(message_id, None)
            if on_gone is not None:
                on_gone()


writer = CheckpointWriter()
