"""python -m inference.bench.workers: aggregate throughput and TTFT with 1, then 2
engine workers (`manage.py run_engine` processes) under the same load.

The same N concurrent streams (distinct conversations, greedy, fixed length) go through
the distributed client (RemoteEngine over Redis) for a few rounds, first with one worker,
then with a second one added. Client-side TTFT includes routing and the Redis hops.
Prints a table and writes a JSON file. Needs Redis (ENGINE_WORKERS_REDIS_URL's default).

Read the figures against the machine: each worker runs its own model copy with
--threads torch threads, so 2 workers on 2 cores compete with each other, the client
and Redis for the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from inference.bench.kv_tier import drop_namespace
from inference.bench.spread import pct
from inference.engine import SamplingParams
from tools.live_server import DjangoProcess


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from inference.model_files import default_model_path

    p = argparse.ArgumentParser(prog="python -m inference.bench.workers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--model", default=str(default_model_path()), help="HF model folder")
    p.add_argument("--streams", type=int, default=8, help="concurrent streams per round")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per stream")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the load per setup")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/3", help="workers' Redis")
    p.add_argument("--json", default="bench_workers.json", help="where to write the figures")
    return p.parse_args(argv)


def run(model: str, threads: int = 1) -> dict[str, Any]:
    """The section `python -m inference.bench --workers` adds: 1 vs 2 worker processes."""
    args = parse_args(["--model", model, "--threads", str(threads)])
    results = asyncio.run(bench(args))
    print_table(results, args)
    return results


class WorkerProcess(DjangoProcess):
    """One `manage.py run_engine` process on the workers' Redis, started at once (the
    project's launcher, tools/live_server.py, gives it its settings and stops it)."""

    def __init__(self, args: argparse.Namespace, namespace: str, worker_id: str, tmp: Path):
        super().__init__(
            tmp, None, CHATAPP_MODEL=args.model, ENGINE_WORKERS_REDIS_URL=args.redis,
            ENGINE_WORKERS_NAMESPACE=namespace, ENGINE_WORKER_ID=worker_id,
            ENGINE_NUM_THREADS=str(args.threads),
            ENGINE_KV_TIER_URL="",  # the workers alone, no write-back traffic
            LOG_LEVEL="WARNING",
        )  # fmt: skip
        self.id = worker_id
        self.log = tmp / f"{worker_id}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "run_engine"],
                cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def stop(self, timeout: float = 30) -> None:
        super().stop(timeout)


def wait_registered(redis: Any, namespace: str, ids: list[str], procs: list[WorkerProcess]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if all(redis.exists(f"{namespace}:worker:{i}") for i in ids):
            return
        for p in procs:
            if p.proc.poll() is not None:
                raise SystemExit(f"worker {p.id} exited; see {p.log.name}")
        time.sleep(0.2)
    raise SystemExit(f"workers {ids} did not register")


async def one_stream(engine: Any, ids: list[int], sampling: SamplingParams, session: str) -> dict:
    started = time.perf_counter()
    ttft, tokens, worker = None, 0, ""
    async for delta in engine.generate(ids, sampling, session_id=session):
        if ttft is None:
            ttft = time.perf_counter() - started
        tokens += len(delta.token_ids)
        if delta.finished and delta.figures is not None:
            worker = getattr(delta.figures, "worker", "")
    return {"ttft": ttft, "tokens": tokens, "worker": worker}


async def run_load(engine: Any, tokenizer: Any, args: argparse.Namespace, tag: str) -> dict:
    sampling = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    prompts = [
        list(tokenizer.encode(f"Stream {i}: tell me something about the number {i * 7}.",
                              add_special_tokens=False))
        for i in range(args.streams)
    ]  # fmt: skip
    # Warm-up: one short request per stream slot, so first-call costs stay out.
    warm = SamplingParams(max_tokens=2, temperature=0)
    await asyncio.gather(*(one_stream(engine, p, warm, f"warm-{tag}-{i}")
                           for i, p in enumerate(prompts)))  # fmt: skip
    ttfts: list[float] = []
    rates: list[float] = []
    per_worker: dict[str, int] = {}
    for r in range(args.rounds):
        started = time.perf_counter()
        results = await asyncio.gather(
            *(one_stream(engine, p, sampling, f"{tag}-{r}-{i}") for i, p in enumerate(prompts))
        )
        wall = time.perf_counter() - started
        rates.append(sum(x["tokens"] for x in results) / wall)
        ttfts += [x["ttft"] for x in results if x["ttft"] is not None]
        for x in results:
            per_worker[x["worker"]] = per_worker.get(x["worker"], 0) + 1
    return {
        "output_tok_s": sum(rates) / len(rates),
        "ttft_p50_ms": pct(ttfts, 0.5) * 1000,
        "ttft_p99_ms": pct(ttfts, 0.99) * 1000,
        "requests_per_worker": per_worker,
    }


async def bench(args: argparse.Namespace) -> dict:
    from redis import Redis
    from transformers import AutoTokenizer

    from inference.backends.remote import RemoteEngine

    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    redis = Redis.from_url(args.redis)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = args.model.rstrip("/").rsplit("/", 1)[-1]
    results: dict[str, Any] = {}
    procs: list[WorkerProcess] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for count in (1, 2):
                while len(procs) < count:
                    procs.append(WorkerProcess(args, namespace, f"bench-w{len(procs) + 1}",
                                               Path(tmp)))  # fmt: skip
                wait_registered(redis, namespace, [p.id for p in procs], procs)
                engine = RemoteEngine(tokenizer, url=args.redis, namespace=namespace, model=model)
                print(f"... {count} worker(s): {args.rounds} rounds of {args.streams} streams",
                      flush=True)  # fmt: skip
                results[str(count)] = await run_load(engine, tokenizer, args, f"w{count}")
                await engine.aclose()
                engine.shutdown()
        finally:
            for p in procs:
                p.stop()
            drop_namespace(args.redis, namespace)
    return results


def print_table(results: dict[str, Any], args: argparse.Namespace) -> None:
    print()
    print(f"{args.streams} concurrent streams x {args.tokens} tokens, {args.rounds} rounds, "
          f"{args.threads} torch thread(s) per worker, {os.cpu_count()} CPU cores")  # fmt: skip
    print(f"{'workers':>7} | {'output tok/s':>12} | {'TTFT p50 ms':>11} | {'TTFT p99 ms':>11} | "
          "requests per worker")  # fmt: skip
    for count, r in results.items():
        share = ", ".join(f"{k}: {v}" for k, v in sorted(r["requests_per_worker"].items()))
        print(f"{count:>7} | {r['output_tok_s']:>12.1f} | {r['ttft_p50_ms']:>11.1f} | "
              f"{r['ttft_p99_ms']:>11.1f} | {share}")  # fmt: skip
    if "1" in results and "2" in results:
        gain = results["2"]["output_tok_s"] / results["1"]["output_tok_s"]
        print(f"2 workers / 1 worker throughput: {gain:.2f}x")


def main() -> None:
    args = parse_args()
    results = asyncio.run(bench(args))
    print_table(results, args)
    report = {
        "config": {**vars(args), "cpu_count": os.cpu_count(), "machine": platform.machine(),
                   "load_avg": os.getloadavg()},
        "workers": results,
    }  # fmt: skip
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
