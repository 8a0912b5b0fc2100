"""python -m inference.bench.speculative: speculative decoding (ngram) against plain decoding.

Three workloads, each run with speculation off and on, greedy (so both runs must produce the
same tokens, which the table checks):
  - grounded: one stream at a time repeats, rewrites or edits a passage given in its prompt,
    or refactors given code: the output quotes the prompt, prompt lookup guesses well;
  - chat: one stream at a time answers open-ended questions: few guesses stand;
  - streams: 32 concurrent streams (speculation switches itself off above
    speculative_max_batch decoding sequences).
Decode tok/s is output tokens after the first over the time after the first token.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Any

import torch

from inference.bench.driver import Arrival, drive
from inference.bench.targets import Target, checked, print_targets
from inference.bench.workloads import make_prompts
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.sampling_params import SamplingParams

PASSAGE = (
    "The old lighthouse stood at the end of the harbour wall for nearly two hundred years. "
    "Every evening the keeper climbed the one hundred and twelve steps to light the lamp, "
    "and every morning he climbed them again to put it out. Ships coming home in a storm "
    "looked for its beam before anything else, and the town grew up around the promise "
    "that someone would always be there to keep it burning."
)
CODE = """def total_price(items):
    total = 0
    for item in items:
        if item["quantity"] > 0:
            total = total + item["price"] * item["quantity"]
    return total


def average_price(items):
    count = 0
    total = 0
    for item in items:
        if item["quantity"] > 0:
            count = count + 1
            total = total + item["price"]
    return total / count
"""
GROUNDED = [
    f"Repeat the following passage exactly, word for word.\n\n{PASSAGE}",
    f"Rewrite the following passage, replacing 'lighthouse' with 'tower'.\n\n{PASSAGE}",
    f"Correct the spelling in this passage and return it in full.\n\n"
    f"{PASSAGE.replace('harbour', 'harbuor').replace('morning', 'mornig')}",
    f"Refactor this Python code: rename `items` to `products` and return the full code."
    f"\n\n```python\n{CODE}```",
]
CHAT = [
    "Write a short story about a robot who learns to paint.",
    "What are some good ways to stay focused while studying?",
    "Explain how a rainbow forms.",
    "Give me ideas for a birthday party for a ten year old.",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from inference.model_files import default_model_path

    p = argparse.ArgumentParser(prog="python -m inference.bench.speculative", description=__doc__)
    p.add_argument("--model", default=str(default_model_path()), help="HF model folder")
    p.add_argument("--tokens", type=int, default=192, help="max new tokens, single stream")
    p.add_argument("--streams", type=int, default=32, help="concurrent streams")
    p.add_argument("--stream-tokens", type=int, default=64, help="new tokens per stream")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--quantization", default="auto", help="auto|none|fp16|int8|int4|hybrid")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--quick", action="store_true", help="fewer prompts and tokens")
    p.add_argument("--json", default="bench_speculative.json", help="where to write figures")
    return p.parse_args(argv)


def chat_prompt(engine: LLMEngine, text: str) -> list[int]:
    tok = engine.tokenizer
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tok.encode(rendered)


def _greedy(max_tokens: int, ignore_eos: bool = False) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)


def _spec_counters(engine: LLMEngine) -> dict[str, int]:
    s = engine.speculator
    if s is None:
        return {"drafted": 0, "accepted": 0, "verifications": 0}
    return {"drafted": s.drafted, "accepted": s.accepted, "verifications": s.verifications}


def one_by_one(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """Each prompt alone, in turn: decode tok/s over all of them, and the tokens."""
    before = _spec_counters(engine)
    decode_tokens, decode_seconds, tokens = 0, 0.0, []
    for i, prompt in enumerate(prompts):
        engine.kv.reset_prefix_cache()
        res = drive(engine, [Arrival(0, f"q{i}", prompt, _greedy(max_tokens))])
        done = res.finished[f"q{i}"]
        m = done.figures
        decode_tokens += m.output_tokens - 1
        decode_seconds += m.finish_time - m.first_token_time
        tokens.append(done.token_ids)
    return {
        "decode_tok_s": decode_tokens / decode_seconds,
        "output_tokens": decode_tokens + len(prompts),
        **_acceptance(before, _spec_counters(engine)),
        "tokens": tokens,
    }


def concurrent(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    engine.kv.reset_prefix_cache()
    before = _spec_counters(engine)
    arrivals = [
        Arrival(0, f"c{i}", p, _greedy(max_tokens, ignore_eos=True)) for i, p in enumerate(prompts)
    ]
    res = drive(engine, arrivals)
    ms = [f.figures for f in res.finished.values()]
    produced = sum(m.output_tokens for m in ms)
    return {
        "tok_s": produced / res.wall,
        "output_tokens": produced,
        **_acceptance(before, _spec_counters(engine)),
        "tokens": [res.finished[f"c{i}"].token_ids for i in range(len(prompts))],
    }


def _acceptance(before: dict[str, int], after: dict[str, int]) -> dict[str, float | int]:
    drafted = after["drafted"] - before["drafted"]
    accepted = after["accepted"] - before["accepted"]
    checks = after["verifications"] - before["verifications"]
    return {
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        # Tokens each checking forward emits for a sequence: the kept guesses + 1.
        "tokens_per_check": 1 + accepted / checks if checks else 1.0,
    }


def run(
    model: str,
    quantization: str = "auto",
    threads: int = 1,
    k: int = 4,
    tokens: int = 192,
    streams: int = 32,
    stream_tokens: int = 64,
    quick: bool = False,
) -> dict[str, Any]:
    config = EngineConfig(
        model=model,
        quantization=quantization,
        num_threads=threads,
        speculative_mode="ngram",
        num_speculative_tokens=k,
    )
    engine = LLMEngine(config)
    spec = engine.speculator
    grounded = [chat_prompt(engine, t) for t in GROUNDED[: 2 if quick else None]]
    chat = [chat_prompt(engine, t) for t in CHAT[: 2 if quick else None]]
    many = make_prompts(engine, [40 + (i * 37) % 120 for i in range(streams)])
    if quick:
        tokens, stream_tokens = min(tokens, 96), min(stream_tokens, 32)
    drive(engine, [Arrival(0, "warm", chat[0], _greedy(8))])  # first-touch allocations
    out: dict[str, Any] = {"k": k, "quantization": engine.runner.quantization}
    for name, fn in (
        ("grounded", lambda: one_by_one(engine, grounded, tokens)),
        ("chat", lambda: one_by_one(engine, chat, tokens)),
        (f"streams{streams}", lambda: concurrent(engine, many, stream_tokens)),
    ):
        engine.speculator = None
        off = fn()
        engine.speculator = spec
        on = fn()
        same = off.pop("tokens") == on.pop("tokens")
        rate = "decode_tok_s" if "decode_tok_s" in on else "tok_s"
        out[name] = {"off": off, "ngram": on, "speedup": on[rate] / off[rate], "same": same}
    return out


def targets(r: dict[str, Any]) -> list[Target]:
    def speedup(key: str) -> float | None:
        v = r.get(key)
        return v.get("speedup") if isinstance(v, dict) else None

    streams = next((k for k in r if k.startswith("streams")), "streams32")
    return [
        ("ngram vs off, grounded single-stream tok/s", ">=", 2.5, speedup("grounded")),
        ("ngram vs off, open-ended chat tok/s", ">=", 0.95, speedup("chat")),
        (f"ngram vs off, {streams[7:]} streams aggregate tok/s", ">=", 0.95, speedup(streams)),
    ]


def print_section(r: dict[str, Any]) -> None:
    if "error" in r:
        print(f"\nspeculative decoding: {r['error']}")
        return
    print(f"\nspeculative decoding (ngram, k={r['k']}, weights {r['quantization']}):")
    head = (
        f"  {'workload':<14}{'off tok/s':>11}{'ngram tok/s':>13}{'speed-up':>10}"
        f"{'accepted':>10}{'tok/check':>11}{'same':>6}"
    )
    print(head)
    for name, v in r.items():
        if not isinstance(v, dict) or "ngram" not in v:
            continue
        rate = "decode_tok_s" if "decode_tok_s" in v["ngram"] else "tok_s"
        on = v["ngram"]
        print(
            f"  {name:<14}{v['off'][rate]:>11.1f}{on[rate]:>13.1f}{v['speedup']:>9.2f}x"
            f"{on['acceptance_rate']:>10.0%}{on['tokens_per_check']:>11.2f}"
            f"{'yes' if v['same'] else 'NO':>6}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    r = run(
        args.model,
        args.quantization,
        args.threads,
        args.k,
        args.tokens,
        args.streams,
        args.stream_tokens,
        args.quick,
    )
    r["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, {args.threads} torch threads"
    r["load_before"] = load
    r["seconds"] = time.perf_counter() - start
    print(f"\nmachine: {r['machine']}   load (1 min) before: {load:.2f}")
    print_section(r)
    r["targets"] = checked(targets(r))
    print_targets(r["targets"])
    with open(args.json, "w") as f:
        json.dump(r, f, indent=2)
    print(f"\njson: {args.json}")
    return r


if __name__ == "__main__":
    main()
