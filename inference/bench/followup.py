"""python -m inference.bench.followup: a follow-up question about a long document.

The chat puts an attached document into its user turn, before the person's words, and
the next turn's prompt extends that one token for token, so the engine finds the
document's KV in its cache. This measures what the second turn costs:

  (a) turn 2 after a turn 1 that carried a ~4,000-token document,
  (b) turn 2 after a turn 1 without one (the same questions),
  (c) turn 2 of (a) with the prefix cache emptied first: what reading the document again
      would cost.

Runs are interleaved (a, b, c, a, b, c, ...) on one engine, each with a tag of its own so
no run finds another's blocks; the table gives the medians and the spread of the a/b
ratio over the runs. Turn-2 TTFT is the engine's own figure (arrival to first token).
"""

from __future__ import annotations

import argparse
import json
import statistics
import uuid
from typing import Any

from inference.bench.driver import Arrival, drive
from inference.bench.spread import spread
from inference.bench.workloads import greedy
from inference.chat_template import PromptBuilder, Turn
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.outputs import RequestFigures
from inference.model_files import default_model_path, ensure_default_model

QUESTION_1 = "What does item 7 weigh?"
QUESTION_2 = "And which colour is item 12?"
COLOURS = ("red", "green", "blue", "amber", "violet", "grey", "white")


def document(tokenizer: Any, tokens: int, tag: str) -> str:
    """An inventory of about `tokens` tokens, different for each `tag`."""
    lines = [f"Inventory {tag}."]
    i = 0
    while len(tokenizer.encode("\n".join(lines), add_special_tokens=False)) < tokens:
        lines += [
            f"Item {i + k}: a {COLOURS[(i + k) % 7]} crate that weighs {3 + (i + k) * 7 % 40} kg."
            for k in range(20)
        ]
        i += 20
    return "\n".join(lines)


def wrapped(name: str, text: str) -> str:
    """The chat's wrapping of a document in a user turn (chatapp/chat/attachments.py)."""
    return f'<document name="{name}">\n{text}\n</document>\n\n'


def two_turns(
    engine: LLMEngine, builder: PromptBuilder, first_user: str, tag: str, cold_turn2: bool
) -> tuple[RequestFigures, RequestFigures]:
    turn1 = [Turn("user", first_user)]
    ids1 = builder.build(turn1)
    rid = f"{tag}-1-{uuid.uuid4().hex[:6]}"
    first = drive(engine, [Arrival(0, rid, ids1, greedy(8))]).finished[rid]
    history = [
        *turn1,
        Turn("assistant", "", first.token_ids),
        Turn("user", f"{QUESTION_2} ({tag})"),
    ]
    ids2 = builder.build(history)
    assert ids2[: len(ids1)] == ids1, "turn 2 must extend turn 1 token for token"
    if cold_turn2:
        engine.kv.reset_prefix_cache()
    rid = f"{tag}-2-{uuid.uuid4().hex[:6]}"
    second = drive(engine, [Arrival(0, rid, ids2, greedy(8))]).finished[rid]
    return first.figures, second.figures


def run(
    model: str, doc_tokens: int = 4000, reps: int = 5, threads: int = 0, quantization: str = "auto"
) -> dict[str, Any]:
    engine = LLMEngine(
        EngineConfig(
            model=model, quantization=quantization, num_threads=threads, kv_cache_memory_mb=1024
        )
    )
    builder = PromptBuilder(engine.tokenizer)
    two_turns(engine, builder, "Warm up: say hello.", "warm", False)  # torch warmed once
    rows: dict[str, list[dict[str, Any]]] = {
        "with_document": [],
        "without": [],
        "document_reread": [],
    }
    for r in range(reps):
        for case in rows:
            tag = f"run{r}-{case}"
            words = f"{QUESTION_1} ({tag})"
            first_user = (
                words
                if case == "without"
                else wrapped("inventory.txt", document(engine.tokenizer, doc_tokens, tag)) + words
            )
            m1, m2 = two_turns(
                engine, builder, first_user, tag, cold_turn2=case == "document_reread"
            )
            rows[case].append(
                {
                    "turn1_prompt_tokens": m1.prompt_tokens,
                    "turn2_prompt_tokens": m2.prompt_tokens,
                    "turn2_cached_tokens": m2.cached_tokens,
                    "turn2_ttft_s": m2.ttft,
                }
            )
    engine.close()
    med = statistics.median

    def ttft(case: str) -> list[float]:
        return [float(x["turn2_ttft_s"]) for x in rows[case]]

    ratios = [a / b for a, b in zip(ttft("with_document"), ttft("without"), strict=True)]
    return {
        "model": model,
        "reps": reps,
        "doc_tokens": med([x["turn1_prompt_tokens"] for x in rows["with_document"]]),
        "turn2_ttft_s": {case: med(ttft(case)) for case in rows},
        "turn2_uncached_tokens": {
            case: med([x["turn2_prompt_tokens"] - x["turn2_cached_tokens"] for x in rows[case]])
            for case in rows
        },
        "with_over_without": spread(ratios),
        "reread_over_without": med(ttft("document_reread")) / med(ttft("without")),
        "runs": rows,
    }


def print_table(r: dict[str, Any]) -> None:
    t, u = r["turn2_ttft_s"], r["turn2_uncached_tokens"]
    print(f"\nFollow-up question, turn 2 (turn 1: a {r['doc_tokens']}-token prompt)")
    print(f"  {r['reps']} interleaved runs of each case, medians")
    print(f"  {'case':34} {'TTFT ms':>9} {'tokens computed':>16}")
    for case, label in (
        ("with_document", "(a) after a document, cache kept"),
        ("without", "(b) no document"),
        ("document_reread", "(c) after a document, cache empty"),
    ):
        print(f"  {label:34} {t[case] * 1000:9.1f} {u[case]:16.0f}")
    w = r["with_over_without"]
    spread = f"runs {w['min']:.2f}-{w['max']:.2f}"
    print(f"  a/b TTFT: {w['median']:.2f}x ({spread}); c/b: {r['reread_over_without']:.1f}x")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m inference.bench.followup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--model", default=None, help="model folder (default: the bundled model)")
    p.add_argument("--doc-tokens", type=int, default=4000, help="size of the document in turn 1")
    p.add_argument("--reps", type=int, default=5, help="interleaved runs of each case")
    p.add_argument("--threads", type=int, default=0, help="engine threads (0: cores - 1)")
    p.add_argument("--quantization", default="auto")
    p.add_argument("--json", default="bench_followup.json", help="where to write the figures")
    args = p.parse_args()
    model = args.model or str(ensure_default_model(default_model_path()))
    results = run(model, args.doc_tokens, args.reps, args.threads, args.quantization)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print_table(results)
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
