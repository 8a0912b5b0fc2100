"""python -m inference.bench.tp: the same engine on 1 rank and on N tensor-parallel ranks.

Per size: single-stream decode tok/s, a 16-stream batch's tok/s, the mean step time and the
share of rank 0's forward spent in all-reduces and in sending the step's inputs. It also
checks that every size produced the same greedy tokens as the first. On a CUDA machine the
engine runs on the GPU(s) and the ranks use nccl (gloo when they share one GPU).

Splitting a model only pays when one device is the bottleneck and several are idle (a model
too big for one GPU, or memory bandwidth bound on one). On one CPU the ranks share the same
cores and memory bus, so expect no speed-up there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from typing import Any

import torch

from inference.bench.driver import Arrival, drive
from inference.bench.workloads import greedy, make_prompts
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.model_runner import dtype_name


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from inference.model_files import default_model_path

    p = argparse.ArgumentParser(prog="python -m inference.bench.tp", description=__doc__)
    p.add_argument("--model", default=str(default_model_path()), help="HF model folder")
    p.add_argument("--sizes", default="1,3", help="tensor_parallel_size values, comma-separated")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--streams", type=int, default=16, help="requests in the batch workload")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length")
    p.add_argument("--dtype", default="auto", help="auto|float32|bfloat16|float16")
    p.add_argument("--quantization", default="auto", help="auto|none|fp16|int8|int4|hybrid")
    p.add_argument("--device", default="auto", help="auto|cpu|cuda")
    p.add_argument(
        "--threads", type=int, default=0,
        help="CPU threads for the whole engine, shared by its ranks (0: cores - 1)",
    )  # fmt: skip
    p.add_argument("--json", default="bench_tp.json", help="where to write the figures")
    return p.parse_args(argv)


def run_size(args: argparse.Namespace, size: int) -> dict[str, Any]:
    engine = LLMEngine(
        EngineConfig(
            model=args.model,
            dtype=args.dtype,
            quantization=args.quantization,
            device=args.device,
            num_threads=args.threads,
            tensor_parallel_size=size,
        )
    )
    model = engine.runner.model
    if size > 1:
        model.sync_timing = engine.runner.device.type == "cuda"
    try:
        prompts = make_prompts(engine, [args.prompt_tokens] * args.streams)
        _run(engine, prompts[:1], 4)  # warm-up: first-touch allocations, the ranks' KV pools
        single = _run(engine, prompts[:1], args.tokens)
        batch = _run(engine, prompts, args.tokens)
        return {
            "tensor_parallel_size": size,
            "device": str(engine.runner.device),
            "dtype": dtype_name(engine.runner.dtype),
            "quantization": engine.runner.quantization,
            "single": single,
            f"streams{args.streams}": batch,
        }
    finally:
        if size > 1:
            model.close()


def _run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    engine.kv.reset_prefix_cache()
    model = engine.runner.model
    tp = hasattr(model, "tp_stats")
    if tp:
        model.reset_tp_stats()
    arrivals = [Arrival(0, f"r{i}", p, greedy(max_tokens)) for i, p in enumerate(prompts)]
    res = drive(engine, arrivals)
    ms = [f.figures for f in res.finished.values()]
    produced = sum(m.output_tokens for m in ms)
    out: dict[str, Any] = {
        "tok_s": produced / res.wall,
        "decode_tok_s": len(ms) / _median([m.tpot for m in ms if m.tpot]),
        "step_ms": 1000 * res.wall / res.steps,
        "steps": res.steps,
        "tokens": {rid: f.token_ids for rid, f in sorted(res.finished.items())},
    }
    if tp:
        s = model.tp_stats()
        out["allreduce_share"] = s["allreduce_seconds"] / s["forward_seconds"]
        out["broadcast_share"] = s["broadcast_seconds"] / s["forward_seconds"]
        out["forward_ms"] = 1000 * s["forward_seconds"] / s["steps"]
    return out


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2]


def print_table(r: dict[str, Any], streams: int) -> None:
    print(f"\nmachine: {r['machine']}   load (1 min) before: {r['load_before']:.2f}\n")
    head = (
        f"{'N':>3}{'1-stream tok/s':>16}{'step ms':>9}{'all-reduce':>12}"
        f"{f'{streams}-stream tok/s':>18}{'step ms':>9}{'all-reduce':>12}{'inputs':>8}"
        f"{'same tokens':>13}"
    )
    print(head)
    print("-" * len(head))
    for row in r["sizes"]:
        one, many = row["single"], row[f"streams{streams}"]
        print(
            f"{row['tensor_parallel_size']:>3}{one['decode_tok_s']:>16.1f}{one['step_ms']:>9.1f}"
            f"{_pct(one.get('allreduce_share')):>12}{many['tok_s']:>18.1f}"
            f"{many['step_ms']:>9.1f}{_pct(many.get('allreduce_share')):>12}"
            f"{_pct(many.get('broadcast_share')):>8}{_yes(row['same_tokens']):>13}"
        )
    print(
        "\nall-reduce / inputs: share of rank 0's forward time spent in the all-reduces\n"
        "(waiting for slower ranks included) and in broadcasting the step's inputs."
    )


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _yes(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "NO")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""),
        "load_before": os.getloadavg()[0],
        "sizes": [],
    }
    reference: tuple[Any, Any] | None = None
    for size in sizes:
        row = run_size(args, size)
        key = f"streams{args.streams}"
        tokens = (row["single"]["tokens"], row[key]["tokens"])
        row["same_tokens"] = None if reference is None else tokens == reference
        reference = reference or tokens
        results["sizes"].append(row)
    print_table(results, args.streams)
    for row in results["sizes"]:  # the JSON keeps figures, not token lists
        row["single"].pop("tokens")
        row[f"streams{args.streams}"].pop("tokens")
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nfigures in {args.json}")
    return results


if __name__ == "__main__":
    main()
