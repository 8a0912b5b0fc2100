"""Where a decode step's time goes, by weight format and number of streams.

    python -m inference.bench.step_profile --streams 1 16 64 --quantization fp16 hybrid

For each format and stream count it decodes that many greedy streams together and splits
the wall time of the steps into the model's forward (matrix products, attention, the
rest of the layers), the logits (lm_head), sampling, and everything else the step does in
Python (scheduling, building the batch's tensors, detokenizing, bookkeeping). Prints a
table (ms per step, medians over --repeat runs with min-max) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.sampling_params import SamplingParams

PARTS = ("forward", "logits", "sampling", "python")


def _timed(acc: dict[str, float], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[key] += time.perf_counter() - start

    return wrapper


def profile(
    engine: LLMEngine, streams: int, tokens: int, temperature: float, top_p: float
) -> dict[str, float]:
    acc = dict.fromkeys(PARTS, 0.0)
    model, sampler = engine.runner.model, engine.sampler
    forward, logits, sample = model.forward, model.compute_logits, sampler.__call__
    model.forward = _timed(acc, "forward", forward)
    model.compute_logits = _timed(acc, "logits", logits)
    engine.sampler = _timed(acc, "sampling", sample)  # type: ignore[assignment]
    try:
        prompt = engine.tokenizer.encode(
            "<|im_start|>user\nTell me a long story about a dragon.<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        for i in range(streams):
            p = SamplingParams(
                max_tokens=tokens, temperature=temperature, top_p=top_p, ignore_eos=True
            )
            engine.add_request([*prompt, 100 + i], p)
        while any(s.num_uncomputed_tokens > 1 for s in engine.scheduler.running) or (
            engine.scheduler.waiting or engine._inbox
        ):
            engine.step()  # prefill: not what this measures
        for k in acc:
            acc[k] = 0.0
        steps, total = 0, 0.0
        while engine.has_work():
            start = time.perf_counter()
            engine.step()
            total += time.perf_counter() - start
            steps += 1
    finally:
        model.forward, model.compute_logits, engine.sampler = forward, logits, sampler
    acc["python"] = total - acc["forward"] - acc["logits"] - acc["sampling"]
    return {"step_ms": total / steps * 1e3, **{k: v / steps * 1e3 for k, v in acc.items()}}


def main() -> None:
    from inference.model_files import default_model_path

    ap = argparse.ArgumentParser(prog="python -m inference.bench.step_profile", description=__doc__)
    ap.add_argument("--model", default=str(default_model_path()))
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--quantization", nargs="+", default=["fp16", "hybrid"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=48, help="tokens decoded per stream")
    ap.add_argument("--temperature", type=float, default=0.7, help="0 for greedy")
    ap.add_argument("--top-p", type=float, default=0.95, help="the chat UI's default")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="bench_step_profile.json")
    args = ap.parse_args()
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {args.threads} threads",
        "torch": torch.__version__,
        "rows": [],
    }
    for q in args.quantization:
        engine = LLMEngine(
            EngineConfig(
                model=args.model, quantization=q, num_threads=args.threads,
                small_step_threads=args.threads, kv_tier_url="", max_num_seqs=max(args.streams),
            )
        )  # fmt: skip
        for n in args.streams:
            runs = [
                profile(engine, n, args.tokens, args.temperature, args.top_p)
                for _ in range(args.repeat)
            ]
            row: dict[str, Any] = {"quantization": q, "streams": n}
            for key in ("step_ms", *PARTS):
                vals = [r[key] for r in runs]
                row[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
        engine.close()
    print(f"\n{results['machine']}; ms per decode step, median (min-max)")
    print("| weights | streams | step | forward | logits | sampling | python |\n|" + "---|" * 7)
    for row in results["rows"]:
        cells = " | ".join(
            f"{row[k]['median']:.2f} ({row[k]['min']:.1f}-{row[k]['max']:.1f})"
            for k in ("step_ms", *PARTS)
        )
        print(f"| {row['quantization']} | {row['streams']} | {cells} |")
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
