"""python -m inference.bench.invariant: what batch-invariant rows cost, the engine in this
process on the default model.

    python -m inference.bench.invariant --streams 1 8 16 24 32 --repeat 3

A seeded request's rows are batch-invariant (model_runner's invariant rows): every row, a
prompt's too, on the one-row products, so its text does not depend on the cache or the
batch. Per level, `streams` chat requests (sampled, 64 tokens each, ignore_eos) start
together and run to the end, with none seeded, one seeded and all seeded; the one-seeded
run twice, its step folded into one forward up to cpu_backend.INVARIANT_FOLD_ROWS rows
(`fold`) and never (`split`), which is what that constant is read from. Then one prompt
of each length prefilled alone, seeded and not (its TTFT). Prints tables (median over
--repeat, min-max) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from inference.bench.speculative import CHAT, GROUNDED, chat_prompt
from inference.bench.spread import cell, spread
from inference.engine import cpu_backend
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.sampling_params import SamplingParams
from inference.model_files import default_model_path

TOKENS = 64
VARIANTS = ("none", "one_fold", "one_split", "all")


def _drain(engine: LLMEngine) -> None:
    while engine.has_work():
        engine.step()


def _batch(engine: LLMEngine, prompts: list[list[int]], streams: int, variant: str) -> float:
    """Seconds for `streams` requests started together, with the variant's seeds."""
    engine.kv.reset_prefix_cache()
    fold = cpu_backend.INVARIANT_FOLD_ROWS
    cpu_backend.INVARIANT_FOLD_ROWS = 0 if variant == "one_split" else fold
    try:
        start = time.perf_counter()
        for i in range(streams):
            seeded = variant == "all" or (variant.startswith("one") and i == 0)
            sampling = SamplingParams(
                max_tokens=TOKENS, temperature=0.8, seed=i if seeded else None, ignore_eos=True
            )
            engine.add_request(prompts[i % len(prompts)], sampling, request_id=f"r{i}")
        _drain(engine)
        return time.perf_counter() - start
    finally:
        cpu_backend.INVARIANT_FOLD_ROWS = fold


def _prefill(engine: LLMEngine, ids: list[int], seed: int | None) -> float:
    engine.kv.reset_prefix_cache()
    start = time.perf_counter()
    engine.add_request(ids, SamplingParams(max_tokens=1, seed=seed), request_id="p")
    _drain(engine)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[300, 1000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default="/tmp/invariant.json")
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model))
    assert engine.runner.invariant_rows, "this model runs no batch-invariant rows"
    prompts = [chat_prompt(engine, t) for t in CHAT + GROUNDED]
    _batch(engine, prompts, 2, "one_fold")  # warm up
    report: dict[str, Any] = {"batches": {}, "prefill": {}}
    print(f"{TOKENS} tokens a stream, seconds for the batch, median (min-max) of {args.repeat}")
    print("| streams | " + " | ".join(VARIANTS) + " | one_fold / none | one_split / none |")
    print("|---:|" + "---|" * len(VARIANTS) + "---:|---:|")
    for streams in args.streams:
        runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(args.repeat):  # interleaved, so drift touches every variant alike
            for v in VARIANTS:
                runs[v].append(_batch(engine, prompts, streams, v))
        s = {v: spread(r) for v, r in runs.items()}
        report["batches"][streams] = s
        none = s["none"]["median"]
        print(
            f"| {streams} | " + " | ".join(cell(s[v], 2) for v in VARIANTS)
            + f" | {s['one_fold']['median'] / none:.2f}x | {s['one_split']['median'] / none:.2f}x |"
        )  # fmt: skip
    text = (Path(__file__).parents[2] / "docs" / "performance.md").read_text()
    ids = engine.tokenizer.encode(text)
    print("\nA prompt prefilled alone, ms to its first token")
    print("| prompt tokens | unseeded | seeded | seeded / unseeded |\n|---:|---|---|---:|")
    for n in args.prompt_tokens:
        plain = spread([_prefill(engine, ids[:n], None) * 1000 for _ in range(args.repeat)])
        seeded = spread([_prefill(engine, ids[:n], 1) * 1000 for _ in range(args.repeat)])
        report["prefill"][n] = {"unseeded": plain, "seeded": seeded}
        ratio = seeded["median"] / plain["median"]
        print(f"| {n} | {cell(plain, 0)} | {cell(seeded, 0)} | {ratio:.2f}x |")
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
