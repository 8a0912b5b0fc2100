"""A burst of streamed requests arriving at once, through the OpenAI API: what a request
waits for its first token when many clients ask together (the web side's work per request,
the API key check, the engine's prefill of the burst), server against server.

    python -m inference.bench.burst --requests 64 --rounds 10 \
        --variant ours --variant base TREE=/tmp/base

Each variant is one of our servers as `make run` serves it (servers.OurServer: daphne,
the embedded engine, its own SQLite file; `TREE=path` runs another checkout's code). All
start first; then each round sends one burst to each server, in turn (the order swapped
every round), a second apart: `--requests` streamed chat requests at once, each asking for
`--max-tokens` tokens over one of `--prompts` short prompts (cached after the two warm-up
bursts, so the engine computes little and what is measured is mostly the path to it).
Prints, per variant, the median over rounds of each burst's TTFT p50 / p90 / max and the
burst's wall time, with min-max spreads and the ratios to the first variant; writes the
raw figures as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from inference.bench.servers import OurServer, cpu_model, settings
from inference.bench.spread import cell, pct, spread
from inference.model_files import default_model_path

FIGURES = ("ttft_p50_ms", "ttft_p90_ms", "ttft_max_ms", "wall_ms")


async def _first_token_ms(
    client: httpx.AsyncClient, server: OurServer, model: str, prompt: str, max_tokens: int
) -> float:
    body = {
        "model": model,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "messages": [{"role": "user", "content": prompt}],
    }
    start = time.perf_counter()
    headers = {"Authorization": f"Bearer {server.key}"}
    async with client.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, headers=headers
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{server.name}: HTTP {response.status_code}")
        first = None
        async for line in response.aiter_lines():
            if first is None and line.startswith("data:") and '"content"' in line:
                first = (time.perf_counter() - start) * 1000
        if first is None:
            raise RuntimeError(f"{server.name}: a stream ended without a token")
        return first


async def _burst(
    server: OurServer, model: str, requests: int, prompts: int, max_tokens: int
) -> dict[str, float]:
    limits = httpx.Limits(max_connections=requests + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        start = time.perf_counter()
        ttfts = await asyncio.gather(
            *(
                _first_token_ms(
                    client, server, model, f"Say hello to user number {i % prompts}.", max_tokens
                )
                for i in range(requests)
            )
        )
        wall = (time.perf_counter() - start) * 1000
    return {
        "ttft_p50_ms": pct(ttfts, 0.5),
        "ttft_p90_ms": pct(ttfts, 0.9),
        "ttft_max_ms": max(ttfts),
        "wall_ms": wall,
    }


def run(
    variants: dict[str, dict[str, str]],
    requests: int = 64,
    rounds: int = 10,
    prompts: int = 8,
    max_tokens: int = 1,
    pause_s: float = 1.0,
) -> dict[str, Any]:
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": cpu_model(),
        "load_avg": {"before": os.getloadavg()[0]},
        "settings": {
            "requests": requests,
            "rounds": rounds,
            "prompts": prompts,
            "max_tokens": max_tokens,
        },
        "variants": variants,
        "runs": {name: [] for name in variants},
    }
    model = default_model_path().name  # the id our servers serve it under, as vs_llama asks
    with tempfile.TemporaryDirectory(prefix="bench-burst-") as tmp:
        servers: list[OurServer] = []
        try:
            for name, settings in variants.items():
                servers.append(OurServer(Path(tmp), 0, settings, name).start())
            for server in servers:
                for _ in range(2):  # warm-up: the prompts cached, the code paths loaded
                    asyncio.run(_burst(server, model, requests, prompts, max_tokens))
            for r in range(rounds):
                for server in servers if r % 2 == 0 else servers[::-1]:
                    time.sleep(pause_s)
                    figures = asyncio.run(_burst(server, model, requests, prompts, max_tokens))
                    results["runs"][server.name].append(figures)
                    print(f"round {r + 1}, {server.name}: {figures}", flush=True)
        finally:
            for server in servers:
                server.stop()
    results["load_avg"]["after"] = os.getloadavg()[0]
    results["summary"] = {
        name: {f: spread([run[f] for run in runs]) for f in FIGURES}
        for name, runs in results["runs"].items()
    }
    print_table(results)
    return results


def print_table(results: dict[str, Any]) -> None:
    s = results["settings"]
    print(
        f"\n{results['machine']}; {s['requests']} streamed requests at once, "
        f"{s['max_tokens']} token(s) each, {s['prompts']} prompts; load (1 min) "
        f"{results['load_avg']['before']:.2f} before, {results['load_avg']['after']:.2f} "
        f"after; medians (min-max) of {s['rounds']} bursts"
    )
    print("| variant | TTFT p50 ms | TTFT p90 ms | TTFT max ms | burst wall ms |")
    print("|---|---|---|---|---|")
    summary = results["summary"]
    for name, figs in summary.items():
        print(f"| {name} | " + " | ".join(cell(figs[f], 0) for f in FIGURES) + " |")
    names = list(summary)
    for name in names[1:]:
        ratios = [summary[name][f]["median"] / summary[names[0]][f]["median"] for f in FIGURES]
        print(f"| {name} / {names[0]} | " + " | ".join(f"{x:.2f}x" for x in ratios) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m inference.bench.burst",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--requests", type=int, default=64, help="requests in one burst")
    ap.add_argument("--rounds", type=int, default=10, help="bursts per server")
    ap.add_argument("--prompts", type=int, default=8, help="distinct prompts in a burst")
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument(
        "--variant", nargs="+", action="append", default=[], metavar="NAME [KEY=VALUE]",
        help="one of our servers with these settings (repeatable; ratios to the first)",
    )  # fmt: skip
    ap.add_argument("--json", default="bench_burst.json")
    args = ap.parse_args()
    variants = {v[0]: settings(ap, v[1:]) for v in args.variant or [["ours"]]}
    results = run(variants, args.requests, args.rounds, args.prompts, args.max_tokens)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
