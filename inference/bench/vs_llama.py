"""Our server against llama.cpp's `llama-server` on the same GGUF, through the OpenAI API.

    make bench-baseline                      # builds llama-server once (a few minutes)
    python -m inference.bench.vs_llama --concurrency 1 16 64 --repeat 3
    python -m inference.bench.vs_llama --concurrency 64 --workload chat --max-tokens 64
    python -m inference.bench.vs_llama --concurrency 1 --threads 1
    python -m inference.bench.vs_llama --concurrency 1 16 --workload chat --model x.Q4_K_M.gguf
    python -m inference.bench.vs_llama --concurrency 1 16 64 --workload rewrite \
        --variant off ENGINE_SPECULATIVE_MODE= --variant auto ENGINE_SPECULATIVE_MODE=auto
    python -m inference.bench.vs_llama --concurrency 1 16 --repeat 2 --workload json-schema

Both servers run on this machine; `--threads 0` (the default) leaves each at its own
default thread settings (llama-server: its physical cores; ours: ENGINE_NUM_THREADS and
ENGINE_SMALL_STEP_THREADS unset), `--threads N` puts both on N (llama-server `-t N -tb N`;
ours both settings N). Each level of concurrent clients runs a multi-turn workload of
api_clients.py (streaming, each turn the whole history so far) against each server in turn,
rotating which goes first, `--repeat` times. Several variants of ours run side by side,
each with an equal KV pool and an equal share of one Redis KV tier cap (servers.equal_pools)
unless a setting sizes them. Prints, per
level, the median of each figure with its min-max spread and each of our variants' ratio
to llama-server, and writes the raw runs as JSON. llama-server's own time per token (its
`timings`, without HTTP and the client) is the last column. A second table gives the
share of our engine's step time spent in decode-only steps, mixed steps (decodes beside
prompt chunks) and prompt-only chunks over each run, from our server's /metrics
(`chatapp:engine_step_seconds_total`) read before and after it.

The default workload, `chat-mix` (chat_workload.py), is chat-shaped: one conversation per
client with short and long questions and, in one client of eight, a pasted document;
greedy replies that end where the model ends them, bounded by `--max-tokens` (256). Each
level and repetition draws its own conversations from `--seed`, the same for every server.
With natural lengths the two servers need not do the same work (their replies, though
both greedy, can part where their arithmetic differs, and a longer reply makes the next
turn's history longer): tok/s counts the tokens each server itself reports it generated,
over the run's wall time, and the table shows those tokens beside it (their ratio too),
so read tok/s against the work done. `--lengths fixed` makes every reply `--max-tokens`
long instead (`ignore_eos`, which both servers honour): the same work on both, as the
other workloads (`chat`, `rewrite`, `story`: 64 tokens, temperature 0.7) do by default.

`--workload json-schema` asks each turn for a record as a JSON object (api_clients.SCHEMA:
a nested object, an array of strings, an enum, bounded integers), greedy, replies to their
end (where the object closes, under a grammar), at most `--max-tokens`. Every server runs
it twice, as NAME without a schema (the same prompts) and NAME+schema with it as OpenAI's
`response_format` json_schema (strict): ours enforces it with its grammar engine,
llama-server turns it into its own GBNF grammar. The table adds, per system, the replies
that validate against the schema (and that parse as JSON) of those asked for, and the
ratios NAME+schema / NAME: the grammar's cost on each server (per token, TPOT: replies
without a schema run longer).

Our server is started as `make run` serves it (servers.OurServer, on tools/live_server.py:
daphne, the embedded engine, the defaults), on its own SQLite file and KV-tier namespace;
`--variant NAME KEY=VALUE ...` starts one such server per variant (each its own
settings), side by side; `TREE=path` among a variant's settings runs another checkout's
code (`git worktree add /tmp/base HEAD`: the last commit against the working tree, in one
interleaved run). llama-server gets `-np` slots equal to the clients, each with context
for the longest conversation (its replies and 1024 tokens of prompts; 2048 at least).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from inference.bench import step_kinds
from inference.bench.api_clients import (
    CHAT_MIX,
    JSON_SCHEMA,
    RESPONSE_FORMAT,
    WORKLOAD_NAMES,
    run_level,
)
from inference.bench.llama_server import LlamaServer, llama_server_binary
from inference.bench.servers import OurServer, cpu_model, equal_pools, settings
from inference.bench.spread import cell, spread
from inference.model_files import bundled_gguf, default_model_path

FIGURES = ("tok_s", "tokens", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "server_tpot_p50_ms")
RATIOS = FIGURES[:5]
# TTFT p90 of the first turns (every client's, arriving together) and of the later ones,
# in a table of their own.
TURN_FIGURES = ("ttft_first_p90_ms", "ttft_later_p90_ms")
LLAMA = "llama-server"
# Workloads of greedy replies that end where the model ends them.
NATURAL = (CHAT_MIX, JSON_SCHEMA)
# The json-schema workload's second run of every server: the same requests with the schema.
WITH_SCHEMA = "+schema"
# The natural workloads' cap on a reply; the other workloads' fixed reply length.
CHAT_MIX_MAX_TOKENS = 256
FIXED_MAX_TOKENS = 64
# Tokens of a conversation beyond its replies: questions and, at most, one pasted document.
PROMPT_ALLOWANCE = 1024
# Our server's /metrics, read by the benchmark with this token.
METRICS_TOKEN = secrets.token_urlsafe(24)


def run_seed(seed: int, concurrency: int, rep: int) -> int:
    """The conversations' seed of one repetition of one level: each its own, so that no
    run finds the previous one's histories in a server's prefix cache."""
    return seed * 1_000_000 + concurrency * 1000 + rep


def request_modes(workload: str) -> dict[str, dict[str, Any]]:
    """The suffix of each run of every server on this workload, with what its requests add."""
    if workload == JSON_SCHEMA:
        return {"": {}, WITH_SCHEMA: {"response_format": RESPONSE_FORMAT}}
    return {"": {}}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if runs and "valid" in runs[0]:
        for f in ("asked", "parsed", "valid"):
            out[f] = sum(r[f] for r in runs)
    for f in FIGURES + TURN_FIGURES:
        vals = [r[f] for r in runs if r.get(f) is not None]
        if vals:
            out[f] = spread(vals)
    for kind in step_kinds.KINDS:
        vals = [r["step_share"][kind] for r in runs if r.get("step_share")]
        if vals:
            out.setdefault("step_share", {})[kind] = spread(vals)
    return out


def print_table(results: dict[str, Any]) -> None:
    threads = results["threads"] or "default"
    load = results.get("load_avg", {})
    print(
        f"\n{results['machine']}; threads: {threads}; workload {results['settings']['workload']}; "
        f"replies {'of' if results['settings'].get('ignore_eos') else 'to their end, at most'} "
        f"{results['settings']['max_tokens']} tokens; "
        f"load (1 min) {load.get('before', 0):.2f} before, {load.get('after', 0):.2f} after; "
        f"medians (min-max) of {results['settings']['repeat']}"
    )
    valid = results["settings"]["workload"] == JSON_SCHEMA
    head = (
        "| users | system | tok/s | tokens | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | "
        "server's own TPOT p50 ms |" + (" valid (parse) / asked |" if valid else "")
    )
    print(head + "\n|" + "---|" * (8 + valid))
    for level in results["levels"]:
        c = level["concurrency"]
        for name in level["systems"]:
            cells = " | ".join(cell(level[name].get(f)) for f in FIGURES)
            if valid:
                s = level[name]
                cells += f" | {s['valid']} ({s['parsed']}) / {s['asked']}"
            print(f"| {c} | {name} | {cells} |")
        for label, r in level["ratios"].items():
            cells = " | ".join(f"{r[f]:.2f}x" if f in r else "-" for f in RATIOS)
            print(f"| {c} | {label} | {cells} | |" + (" |" if valid else ""))
    print("\nTTFT p90 ms by turn: the first turns (all clients at once) and the later ones")
    print("| users | system | first turns | later turns |\n|---|---|---|---|")
    for level in results["levels"]:
        for name in level["systems"]:
            cells = " | ".join(cell(level[name].get(f)) for f in TURN_FIGURES)
            print(f"| {level['concurrency']} | {name} | {cells} |")
    print_step_shares(results)


def print_step_shares(results: dict[str, Any]) -> None:
    """Our servers' step time by kind, per level: percent, median (min-max) over runs."""
    rows = [
        (level["concurrency"], name, level[name]["step_share"])
        for level in results["levels"]
        for name in level["systems"]
        if "step_share" in level.get(name, {})
    ]
    if not rows:
        return
    print("\nour engine's step time by kind, % (median (min-max) over runs)")
    print("| users | system | decode-only | mixed | prompt-only |\n|" + "---|" * 5)
    for c, name, share in rows:
        cells = " | ".join(
            cell({k: 100 * v for k, v in share[kind].items()}) if kind in share else "-"
            for kind in step_kinds.KINDS
        )
        print(f"| {c} | {name} | {cells} |")


def run(
    concurrency: tuple[int, ...] = (1, 16, 64),
    repeat: int = 3,
    turns: int = 3,
    max_tokens: int | None = None,
    threads: int = 0,
    llama_server: str = "",
    env: dict[str, str] | None = None,
    variants: dict[str, dict[str, str]] | None = None,
    workload: str = CHAT_MIX,
    with_llama: bool = True,
    fixed_lengths: bool | None = None,
    seed: int = 0,
    model_file: str = "",
) -> dict[str, Any]:
    """Both servers at each level of concurrent clients; the figures as a dict. `variants`:
    one of our servers per name, each with its own settings on top of `env`.
    `max_tokens`, `fixed_lengths`: None, the workload's own (chat-mix, json-schema: natural
    lengths up to 256 tokens, greedy; the others: 64 tokens each, temperature 0.7).
    `model_file`: a GGUF both servers serve (ours as CHATAPP_MODEL), else the bundled one."""
    natural = workload in NATURAL
    if workload == JSON_SCHEMA and fixed_lengths:
        raise ValueError("json-schema replies end where their object closes: natural lengths")
    binary = llama_server_binary(llama_server) if with_llama else ""
    gguf = Path(model_file) if model_file else bundled_gguf()
    variants = variants or {"ours": {}}
    if max_tokens is None:
        max_tokens = CHAT_MIX_MAX_TOKENS if natural else FIXED_MAX_TOKENS
    if fixed_lengths is None:
        fixed_lengths = not natural
    sampling: dict[str, Any] = {"temperature": 0.0} if natural else {
        "temperature": 0.7, "top_p": 0.95
    }  # fmt: skip
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
            "seed": seed,
            **sampling,
            **(env or {}),
            "model_file": str(gguf),
        },
        "variants": variants,
        "levels": [],
    }
    model = str(default_model_path().name)
    if model_file:
        env = {**(env or {}), "CHATAPP_MODEL": model_file}
    pools = equal_pools(len(variants), [env or {}, *variants.values()])
    results["settings"].update(pools)
    with tempfile.TemporaryDirectory(prefix="bench-vs-llama-") as tmp:
        ours: list[OurServer] = []
        try:
            for name, settings in variants.items():
                token = {"METRICS_BEARER_TOKEN": METRICS_TOKEN}
                ours.append(
                    OurServer(
                        Path(tmp), threads, {**token, **pools, **(env or {}), **settings}, name
                    )
                )
                ours[-1].start()
            if model_file:
                model = served_model(ours[0])
            for c in concurrency:
                results["levels"].append(
                    _level(c, ours, binary, threads, Path(tmp), model, repeat, turns,
                           max_tokens, sampling, workload, seed, gguf)
                )  # fmt: skip
        finally:
            for server in ours:
                server.stop()
    results["load_avg"]["after"] = os.getloadavg()[0]
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    print_table(results)
    return results


def served_model(server: OurServer) -> str:
    """The id our server lists first in /v1/models: the one it serves."""
    request = urllib.request.Request(
        f"{server.url}/v1/models", headers={"Authorization": f"Bearer {server.key}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.load(response)["data"][0]["id"])


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
    seed: int,
    gguf: Path,
) -> dict[str, Any]:
    """One level of c clients: every server `repeat` times, rotating which goes first (on
    the json-schema workload each server twice, without and with the schema)."""
    # Room for the longest conversation: its replies and PROMPT_ALLOWANCE (2048 at least).
    ctx = max(2048, -(-(PROMPT_ALLOWANCE + turns * max_tokens) // 256) * 256)
    llama = LlamaServer(binary, gguf, threads, c, tmp, ctx).start() if binary else None
    servers: list[tuple[str, str, str]] = [(s.name, s.url, s.key) for s in ours]
    if llama is not None:
        servers.append((LLAMA, llama.url, "none"))
    modes = request_modes(workload)
    # (system, url, key, sampling): each server once per request mode.
    systems = [
        (name + suffix, url, key, {**sampling, **extra})
        for name, url, key in servers
        for suffix, extra in modes.items()
    ]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in systems}
    ours_urls = {s.name + suffix: s.url for s in ours for suffix in modes}
    try:
        for _, url, key, params in systems:  # warm-up, on conversations of its own
            warm = run_seed(seed, c, -1)
            asyncio.run(run_level(f"{url}/v1", key, model, 1, 1, 8, params, workload, warm))
        for rep in range(repeat):
            shift = rep % len(systems)
            for name, url, key, params in systems[shift:] + systems[:shift]:
                before = _step_seconds(ours_urls.get(name))
                one = asyncio.run(
                    run_level(f"{url}/v1", key, model, c, turns, max_tokens, params,
                              workload, run_seed(seed, c, rep))
                )  # fmt: skip
                if name in ours_urls:
                    one["step_share"] = step_kinds.shares(before, _step_seconds(url))
                runs[name].append(one)
                print(f"{c} users, {name}: {one}", flush=True)
    finally:
        if llama is not None:
            llama.stop()
    level: dict[str, Any] = {"concurrency": c, "systems": list(runs), "runs": runs}
    level.update({name: summarise(r) for name, r in runs.items()})
    # Each of ours to llama-server (else to the first of ours) in the same request mode;
    # with a schema, each server to itself without.
    pairs = [
        (s.name + suffix, (LLAMA if llama is not None else ours[0].name) + suffix)
        for suffix in modes
        for s in ours
        if llama is not None or s is not ours[0]
    ]
    if WITH_SCHEMA in modes:
        pairs += [(name + WITH_SCHEMA, name) for name, _, _ in servers]
    level["ratios"] = {f"{a} / {b}": ratios(level[a], level[b]) for a, b in pairs}
    return level


def ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """a's medians over b's, of the figures both have."""
    return {
        f: a[f]["median"] / b[f]["median"] for f in RATIOS if f in a and f in b and b[f]["median"]
    }


def _step_seconds(url: str | None) -> dict[str, float]:
    """Our server's step seconds by kind so far; {} for llama-server."""
    return step_kinds.read(url, METRICS_TOKEN) if url else {}


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m inference.bench.vs_llama",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--repeat", type=int, default=3, help="runs per level and server")
    ap.add_argument("--turns", type=int, default=3, help="turns per conversation")
    ap.add_argument(
        "--max-tokens", type=int, default=None,
        help=f"a reply's cap (chat-mix, json-schema: {CHAT_MIX_MAX_TOKENS}) or, with fixed "
        f"lengths, its length (the other workloads: {FIXED_MAX_TOKENS})",
    )  # fmt: skip
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
    ap.add_argument("--workload", choices=WORKLOAD_NAMES, default=CHAT_MIX)
    ap.add_argument("--seed", type=int, default=0, help="the chat-mix conversations' seed")
    ap.add_argument(
        "--lengths", choices=("natural", "fixed"), default=None,
        help="natural: replies end at the model's end-of-sequence token (chat-mix's and "
        "json-schema's default); fixed: every reply max-tokens long (the other workloads' "
        "default)",
    )  # fmt: skip
    ap.add_argument(
        "--natural-lengths", action="store_const", const="natural", dest="lengths",
        help="the same as --lengths natural",
    )  # fmt: skip
    ap.add_argument(
        "--model", default="",
        help="a GGUF file both servers serve (ours as CHATAPP_MODEL); default: the bundled one",
    )  # fmt: skip
    ap.add_argument("--json", default="bench_vs_llama.json")
    args = ap.parse_args()
    variants = {v[0]: settings(ap, v[1:]) for v in args.variant} or None
    results = run(
        tuple(args.concurrency), args.repeat, args.turns, args.max_tokens, args.threads,
        args.llama_server, settings(ap, args.env), variants, args.workload, not args.no_llama,
        None if args.lengths is None else args.lengths == "fixed", args.seed, args.model,
    )  # fmt: skip
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
