"""python -m inference.bench.model_switch: what switching models mid-conversation costs.

A conversation of about --tokens tokens has had its first turn on model A. Its second turn:
  - same model: A again, which holds the conversation's KV in memory;
  - switched: model B, which never saw the conversation: the earlier reply goes as text
    (re-tokenized, as for a model with another tokenizer) and B prefills all of it;
  - switched back: turn 3 on A after B wrote turn 2: A finds its own turn 1 again, B's
    reply and the new question are new to it.
B is a second engine of --other (default: the same folder as --model, so both sides cost
the same and the difference is the cache alone). Each repeat uses fresh text; the arms
are interleaved. The Redis KV tier is off. Prints a table (TTFT medians with min-max,
cached tokens) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

from inference.bench.driver import Arrival, drive
from inference.bench.spread import cell, spread
from inference.chat_template import PromptBuilder, Turn
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.sampling_params import SamplingParams

WORDS = [
    "harbour", "lighthouse", "keeper", "storm", "ship", "evening", "morning", "lamp",
    "steps", "town", "promise", "beam", "river", "bridge", "market", "winter", "summer",
    "garden", "letter", "window", "kitchen", "table", "story", "music",
]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from inference.model_files import default_model_path

    p = argparse.ArgumentParser(prog="python -m inference.bench.model_switch", description=__doc__)
    p.add_argument("--model", default=str(default_model_path()), help="model A (HF folder)")
    p.add_argument("--other", default="", help="model B (default: the same folder as A)")
    p.add_argument("--tokens", type=int, default=2000, help="conversation length before turn 2")
    p.add_argument("--reply-tokens", type=int, default=32, help="tokens each reply writes")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="engine threads (0: the default)")
    p.add_argument("--json", default="bench_model_switch.json", help="where to write figures")
    return p.parse_args(argv)


def make_engine(model: str, threads: int) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model, num_threads=threads, kv_tier_url=""))


def question(words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(words)) + "?"


def ask(engine: LLMEngine, ids: list[int], max_tokens: int, rid: str) -> tuple[list[int], Any]:
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    done = drive(engine, [Arrival(0, rid, ids, greedy)]).finished[rid]
    return done.token_ids, done.figures


def one_repeat(a: LLMEngine, b: LLMEngine, args: argparse.Namespace, r: int) -> dict[str, Any]:
    builder = PromptBuilder(a.tokenizer)
    words = max(8, args.tokens - 40)  # a token a word, and the template's own ~40
    out: dict[str, Any] = {}
    for arm, seed in (("same", 2 * r), ("switched", 2 * r + 1)):
        turns = [Turn("user", question(words, seed))]
        reply, _ = ask(a, builder.build(turns), args.reply_tokens, f"{arm}-{r}-1")
        text = str(a.tokenizer.decode(reply, skip_special_tokens=True))
        turns += [Turn("assistant", text, reply), Turn("user", "And what came after that?")]
        started = time.perf_counter()
        with_ids = builder.build(turns)
        out["build_ids_ms"] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        as_text = builder.build([Turn(t.role, t.text) for t in turns])
        out["build_text_ms"] = (time.perf_counter() - started) * 1000
        if arm == "same":
            _, m = ask(a, with_ids, args.reply_tokens, f"same-{r}-2")
            out["same"] = m
            continue
        reply2, m = ask(b, as_text, args.reply_tokens, f"switched-{r}-2")
        out["switched"] = m
        out["prompt_tokens"] = len(as_text)
        turns += [
            Turn("assistant", str(b.tokenizer.decode(reply2, skip_special_tokens=True))),
            Turn("user", "Thank you."),
        ]
        _, out["back"] = ask(a, builder.build(turns), args.reply_tokens, f"back-{r}-3")
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    a = make_engine(args.model, args.threads)
    b = make_engine(args.other or args.model, args.threads)
    try:
        ask(a, [1, 2, 3, 4], 2, "warm-a")
        ask(b, [1, 2, 3, 4], 2, "warm-b")
        runs = [one_repeat(a, b, args, r) for r in range(args.repeat)]
    finally:
        a.close()
        b.close()
    rows: dict[str, dict[str, Any]] = {}
    for arm, label in (
        ("same", "turn 2, same model (its KV in memory)"),
        ("switched", "turn 2, switched to a model that never saw it"),
        ("back", "turn 3, switched back (its own turn 1 still cached)"),
    ):
        rows[arm] = {
            "label": label,
            "ttft_ms": spread([run[arm].ttft * 1000 for run in runs]),
            "cached_tokens": spread([float(run[arm].cached_tokens) for run in runs]),
        }
    ratio = spread([run["switched"].ttft / run["same"].ttft for run in runs])
    building = {
        "ids_kept_ms": spread([run["build_ids_ms"] for run in runs]),
        "re_tokenized_ms": spread([run["build_text_ms"] for run in runs]),
    }
    prompt_tokens = int(statistics.median(run["prompt_tokens"] for run in runs))
    print(f"A conversation of {prompt_tokens} prompt tokens at turn 2 ({args.repeat} repeats)")
    print(f"{'':54} {'TTFT ms median (min-max)':>26} {'cached':>8}")
    for row in rows.values():
        t, c = row["ttft_ms"], row["cached_tokens"]
        print(f"{row['label']:54} {cell(t, digits=0):>26} {c['median']:>8.0f}")
    ratio_text = f"{ratio['median']:.1f}x ({ratio['min']:.1f}-{ratio['max']:.1f})"
    print(f"switched / same, per repeat: {ratio_text}")
    print(
        "building the prompt: ids kept {:.2f} ms, replies re-tokenized {:.2f} ms (medians)".format(
            building["ids_kept_ms"]["median"], building["re_tokenized_ms"]["median"]
        )
    )
    report = {
        "model": args.model,
        "other": args.other or args.model,
        "prompt_tokens": prompt_tokens,
        "repeat": args.repeat,
        "rows": rows,
        "switched_over_same": ratio,
        "prompt_building": building,
        "machine": platform.platform(),
    }
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
