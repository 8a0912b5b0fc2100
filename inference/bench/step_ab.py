"""The torch path's forward, before and after, on the very same batches, interleaved.

    python -m inference.bench.step_ab --rows 16 32 64 --prefill 512 --context 200

For each row count it builds one decode step of that many sequences (each `--context`
tokens into its reply) and runs its forward over and over, rotating through the variants:

- gather: the path before the native paged attention: each decode group's blocks gathered
  for SDPA (the batch built by the grouped `_prepare`, with its masks);
- eager: the native paged attention, eager ops around it;
- compiled: the same as one compiled graph (compiled_step.py), if it compiled here.

With --prefill N, one step prefilling an N-token prompt too (gather and eager are then
the same path: long chunks take SDPA). Prints ms per forward (median, min-max, over
--repeat rounds) in wall and the engine thread's CPU time, and each variant's ratio to
gather; writes JSON. A shared machine moves absolute figures; the ratios hold better.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from typing import Any

import torch

from inference.bench.spread import spread
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence


def _batch(engine: LLMEngine, rows: int, context: int, chunk: int, tag: str) -> list[Sequence]:
    """`rows` sequences whose first `context` tokens are in the cache and whose next
    `chunk` tokens are this step's (allocated, not yet computed)."""
    g = torch.Generator().manual_seed(rows * 7919 + context)
    seqs = []
    for i in range(rows):
        ids = torch.randint(200, 40000, (context + chunk,), generator=g).tolist()
        seq = Sequence(f"{tag}-{i}", ids, SamplingParams(max_tokens=1))
        if not engine.kv.allocate(seq, context + chunk):
            raise SystemExit(f"the KV pool holds fewer than {rows} x {context + chunk} tokens")
        seq.num_computed_tokens = context
        seqs.append(seq)
    return seqs


def _variants(
    engine: LLMEngine, seqs: list[Sequence], counts: list[int]
) -> dict[str, Callable[[], Any]]:
    runner, model = engine.runner, engine.runner.model
    model.native = None  # the torch path's variants, whatever the native path would take
    ids, flat, _ = runner._prepare(seqs, counts, False)
    paged = model.paged
    model.paged = None
    try:
        ids_g, grouped, _ = runner._prepare(seqs, counts, False)
    finally:
        model.paged = paged
    rows = ids.shape[0]

    def gather() -> Any:
        model.paged = None
        try:
            return model.forward(ids_g, grouped, runner.kv_caches)
        finally:
            model.paged = paged

    out: dict[str, Callable[[], Any]] = {
        "gather": gather,
        "eager": lambda: model.forward(ids, flat, runner.kv_caches),
    }
    step = runner.compiled
    if step is not None and step.handles(rows, flat):
        out["compiled"] = lambda: step.forward(ids, flat)
    runner._set_threads(False, len(seqs))
    return out


def _time(fn: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    return (time.perf_counter() - wall) * 1e3, (time.thread_time() - cpu) * 1e3


def measure(engine: LLMEngine, name: str, seqs: list[Sequence], counts: list[int],
            repeat: int) -> list[dict[str, Any]]:  # fmt: skip
    variants = _variants(engine, seqs, counts)
    with torch.inference_mode():
        for fn in variants.values():
            fn()  # warm
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
        for _ in range(repeat):
            for k, fn in variants.items():
                times[k].append(_time(fn))
    base_wall = [w for w, _ in times["gather"]]
    base_cpu = [c for _, c in times["gather"]]
    rows = []
    for k, ts in times.items():
        walls, cpus = [w for w, _ in ts], [c for _, c in ts]
        row = {
            "case": name, "variant": k, "wall_ms": spread(walls), "cpu_ms": spread(cpus),
            "wall_to_gather": spread([w / b for w, b in zip(walls, base_wall, strict=True)]),
            "cpu_to_gather": spread([c / b for c, b in zip(cpus, base_cpu, strict=True)]),
        }  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    from inference.model_files import default_model_path

    ap = argparse.ArgumentParser(prog="python -m inference.bench.step_ab", description=__doc__)
    ap.add_argument("--model", default=str(default_model_path()))
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--context", type=int, default=200, help="tokens cached per sequence")
    ap.add_argument("--prefill", type=int, nargs="*", default=[512])
    ap.add_argument("--compile", default="on", help="ENGINE_COMPILE for the engine (on/off)")
    ap.add_argument("--threads", type=int, default=0, help="ENGINE_NUM_THREADS (0: default)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--json", default="bench_step_ab.json")
    args = ap.parse_args()
    engine = LLMEngine(
        EngineConfig(
            model=args.model, kv_tier_url="", compile=args.compile, num_threads=args.threads,
            max_num_batched_tokens=max([512, *args.prefill, *args.rows]),
            kv_cache_memory_mb=1024,
        )
    )  # fmt: skip
    results: dict[str, Any] = {
        "machine": platform.machine(),
        "torch": torch.__version__,
        "threads": engine.config.cpu_threads(),
        "context": args.context,
        "compiled": engine.runner.compiled is not None,
        "rows": [],
    }
    for n in args.rows:
        seqs = _batch(engine, n, args.context, 1, f"d{n}")
        results["rows"] += measure(engine, f"decode {n} rows", seqs, [1] * n, args.repeat)
        for s in seqs:
            engine.kv.free(s)
    for n in args.prefill:
        seqs = _batch(engine, 1, 0, n, f"p{n}")
        results["rows"] += measure(
            engine, f"prefill {n} tokens", seqs, [n], max(3, args.repeat // 3)
        )
        for s in seqs:
            engine.kv.free(s)
    engine.close()
    print(f"\n{results['machine']}, torch {results['torch']}, {results['threads']} thread(s)")
    print(
        "| case | variant | wall ms | CPU ms | wall / gather | CPU / gather |\n"
        "|---|---|---|---|---|---|"
    )
    for r in results["rows"]:
        cells = " | ".join(
            f"{r[k]['median']:.2f} ({r[k]['min']:.2f}-{r[k]['max']:.2f})"
            for k in ("wall_ms", "cpu_ms", "wall_to_gather", "cpu_to_gather")
        )
        print(f"| {r['case']} | {r['variant']} | {cells} |")
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
