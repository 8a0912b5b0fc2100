"""A step that mixes a prompt's chunk with running decodes: one forward or two.

    python -m inference.bench.mixed_step --decodes 4 8 16 32 63 --chunks 32 128 256

Under load most steps carry a new turn's prompt beside the running streams' decodes. As
one forward every row of such a step takes the float path (the native 4-bit path takes
decodes and short chunks only); split (ENGINE_SPLIT_MIXED_STEPS), the decodes run on
the native path and the chunk alone on the float path (here from any number of decodes).
For each number of decoding streams and chunk length this times the whole mixed step
(`LLMEngine.step`: forward, logits, sampling) both ways, interleaved in one engine, and
prints ms per step, median (min-max) over --repeat rounds, the ratio split / one, and JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

import torch

from inference.bench.spread import cell, spread
from inference.bench.step_profile import _prompt, _serve_like
from inference.engine import model_runner
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.sampling_params import SamplingParams
from inference.model_files import default_model_path

MODES = {"one": 0, "split": 1}


def _start_decodes(engine: LLMEngine, streams: int) -> None:
    """`streams` sequences past their prefill, decoding (replies long enough for the run)."""
    prompt = _prompt(engine)
    for i in range(streams):
        p = SamplingParams(max_tokens=100_000, temperature=0.7, top_p=0.95, ignore_eos=True)
        engine.add_request([*prompt, 100 + i], p)
    while any(s.num_uncomputed_tokens > 1 for s in engine.scheduler.running) or (
        engine.scheduler.waiting or engine._inbox
    ):
        engine.step()


def time_mixed_step(engine: LLMEngine, chunk: int, salt: int) -> float:
    """ms of the one step that prefills a fresh `chunk`-token prompt beside the decodes."""
    prompt = [(salt * 7919 + i * 31) % 40000 + 200 for i in range(chunk)]
    engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    engine._drain_inbox()  # the request joins the scheduler outside the timed step
    start = time.perf_counter()
    engine.step()
    ms = (time.perf_counter() - start) * 1e3
    while any(len(s.token_ids) == chunk for s in engine.scheduler.running):
        engine.step()  # a chunk the budget cut: let it finish untimed
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(default_model_path()))
    ap.add_argument("--decodes", type=int, nargs="+", default=[4, 8, 16, 32, 63])
    ap.add_argument("--chunks", type=int, nargs="+", default=[32, 128, 256])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default="bench_mixed_step.json")
    args = ap.parse_args()
    model_runner.SPLIT_MIN_ROWS = 1  # type: ignore[attr-defined]  # what splits pay is what this measures
    rows: list[dict[str, Any]] = []
    print(f"{platform.machine()}, torch {torch.__version__}")
    head = f"{'one forward ms':>22} | {'two forwards ms':>22}"
    print(f"{'decodes':>7} {'chunk':>5} | {head} | split/one")
    for streams in args.decodes:
        config = EngineConfig(
            model=args.model, kv_tier_url="", max_num_seqs=streams + 1,
            max_prefill_tokens_during_decode=max(args.chunks),
        )  # fmt: skip
        engine = LLMEngine(config)
        _serve_like(engine)
        _start_decodes(engine, streams)
        for chunk in args.chunks:
            times: dict[str, list[float]] = {m: [] for m in MODES}
            for r in range(args.repeat + 1):
                for mode in MODES:  # interleaved, the first round a warm-up
                    engine.runner.split_mixed = bool(MODES[mode])
                    ms = time_mixed_step(engine, chunk, salt=r * 2 + MODES[mode] + chunk)
                    if r:
                        times[mode].append(ms)
            row: dict[str, Any] = {"decodes": streams, "chunk": chunk}
            for mode, ts in times.items():
                row[mode] = spread(ts)
            row["ratio"] = row["split"]["median"] / row["one"]["median"]
            rows.append(row)

            print(
                f"{streams:>7} {chunk:>5} | {cell(row['one']):>22} | {cell(row['split']):>22} | "
                f"{row['ratio']:.2f}x",
                flush=True,
            )
        engine.close()
    with open(args.json, "w") as f:
        json.dump({"machine": platform.machine(), "torch": torch.__version__, "rows": rows}, f)


if __name__ == "__main__":
    main()
