"""Our server against llama.cpp's `llama-server` on the same GGUF, through the OpenAI API.

    make bench-baseline                      # builds llama-server once (a few minutes)
    python -m inference.bench.vs_llama --concurrency 1 16 64 --repeat 3

Both servers run on this machine with the same thread budget; each level of concurrent
clients runs the multi-turn chat workload of api_clients.py (streaming, growing history,
64 max tokens) against one server and then the other, alternating which goes first, and
`--repeat` times. Prints, per level, the median of each figure with its min-max spread
and the ratio ours / llama-server, and writes the raw runs as JSON.

Our server is started as `make run` serves it (daphne, the embedded engine, the defaults),
on its own SQLite file and KV-tier namespace; llama-server gets `-np` slots equal to the
clients, 2048 tokens of context each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from inference.bench.api_clients import run_level
from inference.bench.llama_server import (
    LlamaServer,
    free_port,
    llama_server_binary,
    stop,
    wait_for,
)
from inference.model_files import bundled_gguf, default_model_path

ROOT = Path(__file__).resolve().parents[2]


class OurServer:
    def __init__(self, workdir: Path, threads: int, env: dict[str, str]) -> None:
        # threads: the engine's ENGINE_NUM_THREADS, the same budget llama-server gets.
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "ours.log"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "chatapp.settings.dev",
            "DJANGO_DEBUG": "false",
            "CHATAPP_VAR_DIR": str(workdir),
            "DATABASE_URL": f"sqlite:///{workdir / 'db.sqlite3'}",
            "ENGINE_PRELOAD": "true",
            "ENGINE_KV_TIER_NAMESPACE": f"bench-{os.getpid()}",
            "PYTHONUNBUFFERED": "1",
            "ENGINE_NUM_THREADS": str(threads),
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.key = ""

    def manage(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        return out.stdout.strip()

    def start(self) -> OurServer:
        self.manage("migrate", "--noinput", "-v", "0")
        self.key = self.manage(
            "shell", "--no-imports", "-c",
            "from django.contrib.auth import get_user_model as g; "
            "from chatapp.openai_api.keys import create_key; "
            "u = g().objects.create_user('bench', password='bench-password-1'); "
            "k, raw = create_key(u, 'bench'); "
            "type(k).objects.filter(pk=k.pk).update(max_concurrent=1024, "
            "rate_limit_per_minute=1000000); print(raw)",
        )  # fmt: skip
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                 "chatapp.asgi:application"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_for(f"{self.url}/healthz?engine=1", self.proc, self.log)
        return self

    def stop(self) -> None:
        stop(self.proc)


FIGURES = ("tok_s", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms")


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in FIGURES:
        vals = [r[f] for r in runs if r.get(f) is not None]
        if vals:
            out[f] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


def print_table(results: dict[str, Any]) -> None:
    def cell(s: dict[str, Any], f: str) -> str:
        v = s.get(f)
        return f"{v['median']:.1f} ({v['min']:.1f}-{v['max']:.1f})" if v else "-"

    print(f"\n{results['machine']}; {results['threads']} threads each; medians (min-max)")
    head = "| users | system | tok/s | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms |"
    print(head + "\n|" + "---|" * 6)
    for level in results["levels"]:
        for name in ("llama-server", "ours"):
            s = level[name]
            cells = " | ".join(cell(s, f) for f in FIGURES)
            print(f"| {level['concurrency']} | {name} | {cells} |")
        r = level["ratios"]
        print(
            f"| {level['concurrency']} | ours / llama | {r['tok_s']:.2f}x | "
            f"{r['ttft_p50_ms']:.2f}x | {r['ttft_p90_ms']:.2f}x | {r['tpot_p50_ms']:.2f}x |"
        )


def run(
    concurrency: tuple[int, ...] = (1, 16, 64),
    repeat: int = 3,
    turns: int = 3,
    max_tokens: int = 64,
    threads: int = 0,
    llama_server: str = "",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Both servers at each level of concurrent clients; the figures as a dict."""
    binary = llama_server_binary(llama_server)
    threads = threads or max(1, (os.cpu_count() or 1) - 1)
    env = env or {}
    sampling = {"temperature": 0.7, "top_p": 0.95}
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "threads": threads,
        "settings": {"turns": turns, "max_tokens": max_tokens, **sampling, **env},
        "levels": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-vs-llama-") as tmp:
        ours = OurServer(Path(tmp), threads, env).start()
        model = str(default_model_path().name)
        try:
            for c in concurrency:
                llama = LlamaServer(binary, bundled_gguf(), threads, c, Path(tmp)).start()
                runs: dict[str, list[dict[str, Any]]] = {"ours": [], "llama-server": []}
                try:
                    for server, key in ((ours, ours.key), (llama, "none")):  # warm-up
                        asyncio.run(run_level(f"{server.url}/v1", key, model, 1, 1, 8, sampling))
                    for rep in range(repeat):
                        order: list[tuple[str, OurServer | LlamaServer]] = [
                            ("ours", ours),
                            ("llama-server", llama),
                        ]
                        for name, server in order if rep % 2 == 0 else order[::-1]:
                            key = ours.key if name == "ours" else "none"
                            one = asyncio.run(
                                run_level(f"{server.url}/v1", key, model, c, turns,
                                          max_tokens, sampling)
                            )  # fmt: skip
                            runs[name].append(one)
                            print(f"{c} users, {name}: {one}", flush=True)
                finally:
                    llama.stop()
                level: dict[str, Any] = {"concurrency": c, "runs": runs}
                level.update({name: summarise(r) for name, r in runs.items()})
                level["ratios"] = {
                    f: level["ours"][f]["median"] / level["llama-server"][f]["median"]
                    for f in FIGURES
                    if f in level["ours"] and f in level["llama-server"]
                }
                results["levels"].append(level)
        finally:
            ours.stop()
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    print_table(results)
    return results


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
    ap.add_argument("--threads", type=int, default=0, help="0: cores - 1 for both servers")
    ap.add_argument("--llama-server", default="", help="binary (default: build or reuse)")
    ap.add_argument("--env", nargs="*", default=[], help="KEY=VALUE settings for our server")
    ap.add_argument("--json", default="bench_vs_llama.json")
    args = ap.parse_args()
    results = run(
        tuple(args.concurrency), args.repeat, args.turns, args.max_tokens, args.threads,
        args.llama_server, dict(kv.split("=", 1) for kv in args.env),
    )  # fmt: skip
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
