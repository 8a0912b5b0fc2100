"""What the reply checkpoints cost: N replies streaming at once, saved by the one writer
(chatapp/chat/checkpoints.py) every interval, on a database of its own.

    python -m tools.checkpoint_bench                           # 64 streams on SQLite
    python -m tools.checkpoint_bench --database-url postgres://postgres@127.0.0.1/bench

Each simulated reply gains a token (4 characters) every 1/--tokens-per-s seconds on the
event loop, starting from --start-tokens tokens (a long reply costs the most to save).
Every --interval the writer saves all of them in one transaction, as in a server. It
prints a table (per batch: milliseconds, replies, kilobytes; the share of one core the
batches kept the database thread busy) and --json FILE for comparisons.
A write per token would have been streams x tokens-per-s transactions a second.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def setup_django(database_url: str | None, workdir: Path) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings.dev")
    os.environ["CHATAPP_VAR_DIR"] = str(workdir)
    os.environ["DATABASE_URL"] = database_url or f"sqlite:///{workdir / 'bench.sqlite3'}"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", "--noinput", verbosity=0)


def make_replies(streams: int, start_tokens: int) -> list[int]:
    from django.contrib.auth import get_user_model

    from chatapp.chat.models import Conversation, Message

    user, _ = get_user_model().objects.get_or_create(username="checkpoint-bench")
    conv = Conversation.objects.create(owner=user, title="bench")
    replies = Message.objects.bulk_create(
        Message(conversation=conv, role=Message.Role.ASSISTANT, status=Message.Status.STREAMING,
                text="word" * start_tokens, token_ids=list(range(start_tokens)))
        for _ in range(streams)
    )  # fmt: skip
    return [m.pk for m in replies]


async def run(args: argparse.Namespace, ids: list[int]) -> dict[str, Any]:
    from chatapp.chat import checkpoints

    texts = {i: "word" * args.start_tokens for i in ids}
    writer = checkpoints.CheckpointWriter()
    end = time.monotonic() + args.seconds

    def progress(i: int) -> checkpoints.Progress:
        return checkpoints.Progress(i, texts[i])

    async def stream(i: int) -> None:
        while time.monotonic() < end:
            await asyncio.sleep(1 / args.tokens_per_s)
            texts[i] += "word"
            writer.changed(i, functools.partial(progress, i), lambda: None)

    batches: list[dict[str, float]] = []

    async def flush_every_interval() -> None:
        while time.monotonic() < end:
            await asyncio.sleep(args.interval)
            size = sum(len(texts[i]) for i in ids) / 1024
            t0 = time.perf_counter()
            await writer.flush()
            batches.append({"ms": (time.perf_counter() - t0) * 1000, "kb": size})

    tasks = [asyncio.create_task(stream(i)) for i in ids]
    await flush_every_interval()
    await asyncio.gather(*tasks)
    ms = sorted(b["ms"] for b in batches)
    return {
        "streams": len(ids),
        "tokens_per_s_each": args.tokens_per_s,
        "interval_s": args.interval,
        "batches": len(batches),
        "batch_ms_p50": round(statistics.median(ms), 2),
        "batch_ms_p95": round(ms[int(0.95 * (len(ms) - 1))], 2),
        "batch_ms_max": round(ms[-1], 2),
        "batch_kb_mean": round(statistics.mean(b["kb"] for b in batches), 1),
        "writer_busy_share": round(sum(ms) / 1000 / args.seconds, 3),
        "transactions_per_s": round(len(batches) / args.seconds, 1),
        "per_token_transactions_per_s": round(len(ids) * args.tokens_per_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--tokens-per-s", type=float, default=20.0, help="per stream")
    p.add_argument("--start-tokens", type=int, default=1024)
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--database-url", help="default: a new SQLite file")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        setup_django(args.database_url, Path(workdir))
        from django.conf import settings

        # The writer's own timer stays idle: this program saves at --interval itself.
        settings.CHAT_CHECKPOINT_INTERVAL_S = 3600
        ids = make_replies(args.streams, args.start_tokens)
        result = asyncio.run(run(args, ids))
        from chatapp.chat.models import Message

        Message.objects.filter(pk__in=ids).delete()
    result["database"] = "sqlite" if not args.database_url else args.database_url.split(":")[0]
    for key, value in result.items():
        print(f"{key:30} {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
