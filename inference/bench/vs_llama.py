"""Our server against llama.cpp's `llama-server` on the same GGUF, through the OpenAI API.

    make bench-baseline                      # builds llama-server once (a few minutes)
    python -m inference.bench.vs_llama --concurrency 1 16 64 --repeat 3
    python -m inference.bench.vs_llama --concurrency 1 --threads 1
    python -m inference.bench.vs_llama --concurrency 1 16 64 --workload rewrite \
        --variant off ENGINE_SPECULATIVE_MODE= --variant auto ENGINE_SPECULATIVE_MODE=auto

Both servers run on this machine; `--threads 0` (the default) leaves each at its own
default thread settings (llama-server: its physical cores; ours: ENGINE_NUM_THREADS and
ENGINE_SMALL_STEP_THREADS unset), `--threads N` puts both on N (llama-server `-t N -tb N`;
ours both settings N). Each level of concurrent clients runs the multi-turn chat workload of
api_clients.py (streaming, growing history, 64 max tokens; `--workload` picks its prompts)
against each server in turn, rotating which goes first, `--repeat` times. Prints, per level,
the median of each figure with its min-max spread and each of our variants' ratio to
llama-server, and writes the raw runs as JSON. llama-server's own time per token (its
`timings`, without HTTP and the client) is the last column.

Every reply is `--max-tokens` long (`ignore_eos`, which both servers honour): tok/s then
compares the same work, where natural lengths (`--natural-lengths`) let one server's
shorter replies, sampled differently, count as slowness, since each reply pays its TTFT.

Our server is started as `make run` serves it (servers.OurServer, on tools/live_server.py:
daphne, the embedded engine, the defaults), on its own SQLite file and KV-tier namespace;
`--variant NAME KEY=VALUE ...` starts one such server per variant (each its own
settings), side by side; `TREE=path` among a variant's settings runs another checkout's
code (`git worktree add /tmp/base HEAD`: the last commit against the working tree, in one
interleaved run). llama-server gets `-np` slots equal to the clients, 2048 tokens of
context each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from inference.bench.api_clients import WORKLOADS, run_level
from inference.bench.llama_server import LlamaServer, llama_server_binary
from inference.bench.servers import OurServer, cpu_model, settings
from inference.bench.spread import cell, spread
from inference.model_files import bundled_gguf, default_model_path

FIGURES = ("tok_s", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "server_tpot_p50_ms")
RATIOS = FIGURES[:4]
LLAMA = "llama-server"


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in FIGURES:
        vals = [r[f] for r in runs if r.get(f) is not None]
        if vals:
            out[f] = spread(vals)
    return out


def print_table(results: dict[str, Any]) -> None:
    threads = results["threads"] or "default"
    load = results.get("load_avg", {})
    print(
        f"\n{results['machine']}; threads: {threads}; workload {results['settings']['workload']}; "
        f"replies {'of max_tokens' if results['settings'].get('ignore_eos') else 'to their end'}; "
        f"load (1 min) {load.get('before', 0):.2f} before, {load.get('after', 0):.2f} after; "
        f"medians (min-max) of {results['settings']['repeat']}"
    )
    head = (
        "| users | system | tok/s | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | "
        "server's own TPOT p50 ms |"
    )
    print(head + "\n|" + "---|" * 7)
    for level in results["levels"]:
        c = level["concurrency"]
        for name in level["systems"]:
            cells = " | ".join(cell(level[name].get(f)) for f in FIGURES)
            print(f"| {c} | {name} | {cells} |")
        base = "llama" if LLAMA in level["systems"] else level["systems"][0]
        for name, r in level["ratios"].items():
            cells = " | ".join(f"{r[f]:.2f}x" if f in r else "-" for f in RATIOS)
            print(f"| {c} | {name} / {base} | {cells} | |")


def run(
    concurrency: tuple[int, ...] = (1, 16, 64),
    repeat: int = 3,
    turns: int = 3,
    max_tokens: int = 64,
    threads: int = 0,
    llama_server: str = "",
    env: dict[str, str] | None = None,
    variants: dict[str, dict[str, str]] | None = None,
    workload: str = "chat",
    with_llama: bool = True,
    fixed_lengths: bool = True,
) -> dict[str, Any]:
    """Both servers at each level of concurrent clients; the figures as a dict. `variants`:
    one of our servers per name, each with its own settings on top of `env`."""
    binary = llama_server_binary(llama_server) if with_llama else ""
    variants = variants or {"ours": {}}
    sampling: dict[str, Any] = {"temperature": 0.7, "top_p": 0.95}
    if fixed_lengths:
        sampling["ignore_eos"] = True
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": cpu_model(),
        "threads": threads,
        "load_avg": {"before": os.getloadavg()[0]},
        "settings": {
            "turns": turns,
            "max_tokens": max_tokens,
            "repeat": repeat,
            "workload": workload,
            **sampling,
            **(env or {}),
        },
        "variants": variants,
        "levels": [],
    }
    model = str(default_model_path().name)
    with tempfile.TemporaryDirectory(prefix="bench-vs-llama-") as tmp:
        ours: list[OurServer] = []
        try:
            for name, settings in variants.items():
                ours.append(OurServer(Path(tmp), threads, {**(env or {}), **settings}, name))
                ours[-1].start()
            for c in concurrency:
                results["levels"].append(
                    _level(c, ours, binary, threads, Path(tmp), model, repeat, turns,
                           max_tokens, sampling, workload)
                )  # fmt: skip
        finally:
            for server in ours:
                server.stop()
    results["load_avg"]["after"] = os.getloadavg()[0]
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    print_table(results)
    return results


def _level(
    c: int,
    ours: list[OurServer],
    binary: str,
    threads: int,
    tmp: Path,
    model: str,
    repeat: int,
    turns: int,
    max_tokens: int,
    sampling: dict[str, Any],
    workload: str,
) -> dict[str, Any]:
    """One level of c clients: every server `repeat` times, rotating which goes first."""
    llama = LlamaServer(binary, bundled_gguf(), threads, c, tmp).start() if binary else None
    servers: list[tuple[str, str, str]] = [(s.name, s.url, s.key) for s in ours]
    if llama is not None:
        servers.append((LLAMA, llama.url, "none"))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in servers}
    try:
        for _, url, key in servers:  # warm-up
            asyncio.run(run_level(f"{url}/v1", key, model, 1, 1, 8, sampling, workload))
        for rep in range(repeat):
            shift = rep % len(servers)
            for name, url, key in servers[shift:] + servers[:shift]:
                one = asyncio.run(
                    run_level(f"{url}/v1", key, model, c, turns, max_tokens, sampling, workload)
                )
                runs[name].append(one)
                print(f"{c} users, {name}: {one}", flush=True)
    finally:
        if llama is not None:
            llama.stop()
    level: dict[str, Any] = {"concurrency": c, "systems": list(runs), "runs": runs}
    level.update({name: summarise(r) for name, r in runs.items()})
    base = level.get(LLAMA) or level[servers[0][0]]
    level["ratios"] = {
        s.name: {
            f: level[s.name][f]["median"] / base[f]["median"]
            for f in RATIOS
            if f in level[s.name] and f in base and base[f]["median"]
        }
        for s in ours
        if level.get(LLAMA) or s is not ours[0]
    }
    return level


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m inference.bench.vs_llama",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--repeat", type=int, default=3, help="runs per level and server")
    ap.add_argument("--turns", type=int, default=3, help="turns per conversation")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--threads", type=int, default=0,
        help="N: both servers on N threads; 0: each at its own default",
    )  # fmt: skip
    ap.add_argument("--llama-server", default="", help="binary (default: build or reuse)")
    ap.add_argument("--no-llama", action="store_true", help="our variants only")
    ap.add_argument("--env", nargs="*", default=[], help="KEY=VALUE settings for our server")
    ap.add_argument(
        "--variant", nargs="+", action="append", default=[], metavar="NAME [KEY=VALUE]",
        help="one of our servers with these settings (repeatable; ratios are to llama-server, "
        "or to the first variant with --no-llama)",
    )  # fmt: skip
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="chat")
    ap.add_argument(
        "--natural-lengths", action="store_true",
        help="let replies end at the model's end-of-sequence token (default: max-tokens each)",
    )  # fmt: skip
    ap.add_argument("--json", default="bench_vs_llama.json")
    args = ap.parse_args()
    variants = {v[0]: settings(ap, v[1:]) for v in args.variant} or None
    results = run(
        tuple(args.concurrency), args.repeat, args.turns, args.max_tokens, args.threads,
        args.llama_server, settings(ap, args.env), variants, args.workload, not args.no_llama,
        not args.natural_lengths,
    )  # fmt: skip
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
