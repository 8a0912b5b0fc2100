"""What streaming OpenAI clients measure against a running server.

    python -m inference.bench.api_clients --url http://127.0.0.1:8000/v1 --key sk-chat-... \\
        --concurrency 1 16 --requests 4 --max-tokens 64

Each client streams chat completions with the official `openai` package and records the
time to the first content chunk (TTFT) and its own decode rate (completion tokens after
the first / time from first to last chunk). Prints a table and, with --json, a file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a KV cache is.",
    "Give me three tips for sleeping better.",
]


async def one_client(
    client: Any, model: str, n: int, max_tokens: int, i: int
) -> list[dict[str, float]]:
    out = []
    for k in range(n):
        start = time.perf_counter()
        first = last = None
        tokens = 0
        stream = await client.chat.completions.create(
            model=model,
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=max_tokens,
            messages=[{"role": "user", "content": PROMPTS[(i + k) % len(PROMPTS)]}],
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                last = time.perf_counter()
                first = first or last
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        if first is None or last is None:
            continue
        rate = (tokens - 1) / (last - first) if tokens > 1 and last > first else float("nan")
        out.append({"ttft": first - start, "tokens": tokens, "rate": rate, "e2e": last - start})
    return out


async def run_level(
    url: str, key: str, model: str, concurrency: int, n: int, max_tokens: int
) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=600)
    started = time.perf_counter()
    results = await asyncio.gather(
        *(one_client(client, model, n, max_tokens, i) for i in range(concurrency))
    )
    wall = time.perf_counter() - started
    rows = [r for rs in results for r in rs]
    ttft = sorted(r["ttft"] for r in rows)
    rates = [r["rate"] for r in rows if r["rate"] == r["rate"]]
    return {
        "concurrency": concurrency,
        "requests": len(rows),
        "ttft_p50_ms": round(statistics.median(ttft) * 1000, 1),
        "ttft_p90_ms": round(ttft[min(len(ttft) - 1, int(0.9 * (len(ttft) - 1) + 0.5))] * 1000, 1),
        "per_stream_tok_s_p50": round(statistics.median(rates), 1) if rates else None,
        "aggregate_tok_s": round(sum(r["tokens"] for r in rows) / wall, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", required=True, help="the server's /v1 base URL")
    ap.add_argument("--key", required=True)
    ap.add_argument("--model", default="", help="default: the first model the server lists")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from openai import OpenAI

    model = args.model or OpenAI(base_url=args.url, api_key=args.key).models.list().data[0].id
    levels = [
        asyncio.run(run_level(args.url, args.key, model, c, args.requests, args.max_tokens))
        for c in args.concurrency
    ]
    cols = list(levels[0])
    print(" | ".join(cols))
    for row in levels:
        print(" | ".join(str(row[c]) for c in cols))
    if args.json:
        args.json.write_text(json.dumps({"model": model, "levels": levels}, indent=2))


if __name__ == "__main__":
    main()
