"""What streaming OpenAI clients measure against a running server.

    python -m inference.bench.api_clients --url http://127.0.0.1:8000/v1 --key sk-chat-... \\
        --concurrency 1 16 --turns 4 --max-tokens 64

Each client holds a conversation: every turn streams a chat completion with the whole
history so far (its earlier questions and the server's own answers) plus a new question,
as a chat UI does. It records the time to the first content chunk (TTFT), the time per
output token after the first (TPOT: from first to last chunk over tokens - 1), and the
tokens the server reports. Prints a table and, with --json, a file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any, cast

QUESTIONS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a KV cache is.",
    "Give me three tips for sleeping better.",
    "How do plants make food from sunlight?",
    "Tell me a fun fact about octopuses.",
    "What should I pack for a weekend hike?",
    "Summarise the story of Cinderella.",
]
FOLLOW_UPS = ["Tell me more.", "Can you make it shorter?", "Why is that?", "Give an example."]


async def one_client(
    client: Any, model: str, turns: int, max_tokens: int, i: int, sampling: dict[str, float]
) -> list[dict[str, float]]:
    out = []
    history: list[dict[str, str]] = []
    for turn in range(turns):
        question = QUESTIONS[i % len(QUESTIONS)] if turn == 0 else FOLLOW_UPS[(i + turn) % 4]
        history.append({"role": "user", "content": question})
        start = time.perf_counter()
        first = last = None
        tokens = 0
        text: list[str] = []
        stream = await client.chat.completions.create(
            model=model,
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=max_tokens,
            messages=history,
            **sampling,
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                last = time.perf_counter()
                first = first or last
                text.append(chunk.choices[0].delta.content)
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        history.append({"role": "assistant", "content": "".join(text)})
        if first is None or last is None:
            continue
        tpot = (last - first) / (tokens - 1) if tokens > 1 and last > first else float("nan")
        out.append({"ttft": first - start, "tokens": tokens, "tpot": tpot, "e2e": last - start})
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


async def run_level(
    url: str,
    key: str,
    model: str,
    concurrency: int,
    turns: int,
    max_tokens: int,
    sampling: dict[str, float] | None = None,
) -> dict[str, Any]:
    import httpx
    from openai import AsyncOpenAI

    # A new connection per request: llama-server's HTTP library closes a kept-alive
    # connection after a few requests, and a client reusing it then fails the request.
    http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0), timeout=600)
    # openai 3 still takes an httpx client (its legacy path); its types name httpx2 only.
    client = AsyncOpenAI(
        base_url=url, api_key=key, max_retries=0, timeout=600, http_client=cast(Any, http)
    )
    started = time.perf_counter()
    results = await asyncio.gather(
        *(
            one_client(client, model, turns, max_tokens, i, sampling or {})
            for i in range(concurrency)
        )
    )
    wall = time.perf_counter() - started
    await client.close()
    rows = [r for rs in results for r in rs]
    ttft = [r["ttft"] for r in rows]
    tpot = [r["tpot"] for r in rows if r["tpot"] == r["tpot"]]
    return {
        "concurrency": concurrency,
        "requests": len(rows),
        "tok_s": round(sum(r["tokens"] for r in rows) / wall, 1),
        "ttft_p50_ms": round(statistics.median(ttft) * 1000, 1),
        "ttft_p90_ms": round(pct(ttft, 0.9) * 1000, 1),
        "tpot_p50_ms": round(statistics.median(tpot) * 1000, 2) if tpot else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", required=True, help="the server's /v1 base URL")
    ap.add_argument("--key", required=True)
    ap.add_argument("--model", default="", help="default: the first model the server lists")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--turns", type=int, default=4, help="turns per conversation (client)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from openai import OpenAI

    model = args.model or OpenAI(base_url=args.url, api_key=args.key).models.list().data[0].id
    sampling = {"temperature": args.temperature, "top_p": 0.95}
    levels = [
        asyncio.run(run_level(args.url, args.key, model, c, args.turns, args.max_tokens, sampling))
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
