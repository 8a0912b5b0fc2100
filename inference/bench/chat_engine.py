"""The engine alone on the served chat workload: many conversations of distinct histories.

    python -m inference.bench.chat_engine --streams 16 64 --turns 3 --repeat 2

step_profile decodes streams that share one prompt, so their KV blocks are shared too and
attention reads little memory. Here each of `--streams` conversations holds its own history,
as api_clients.py's chat clients do (the same questions and follow-ups, the chat template,
replies of `--max-tokens` sampled at temperature 0.7 / top-p 0.95, each turn sent as the
previous reply ends), driven straight through `LLMEngine.step` with no web side: the
engine's own throughput on that workload. Prints per stream count the output tok/s, the
engine's TTFT (arrival in the engine to first token: p50 and p90 over every turn, and p90 of
the first turns, which arrive together), the prompt tokens it computed (not found cached),
and the steps split into decode-only and mixed (a prompt's chunk beside decodes): count,
mean ms, mean rows, and the share of the running sequences' neighbouring block-table
entries that are neighbours in the KV pool too (where the decode attention reads runs);
median (min-max) over `--repeat` runs; writes JSON. Run it from two checkouts (`git
worktree add`) to compare a change, alternating, on a quiet machine.

Each run starts from an empty prefix cache; with `--fill` it starts instead from a pool
full of other conversations' cached blocks, as a long-running server's is: rounds of the
same conversations under other first questions run until (almost) no block is empty. A
small `--kv-mb` keeps that quick.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time
from typing import Any

from inference.bench.api_clients import FOLLOW_UPS, QUESTIONS
from inference.bench.spread import cell, pct, spread
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.heap import freeze_loaded
from inference.engine.model_runner import dtype_name
from inference.engine.sampling_params import SamplingParams
from inference.model_files import default_model_path


class Conversations:
    """`n` chats on one engine: each turn's prompt is the whole history, templated."""

    def __init__(
        self, engine: LLMEngine, n: int, turns: int, max_tokens: int, tag: str = ""
    ) -> None:
        self.engine, self.turns, self.max_tokens, self.tag = engine, turns, max_tokens, tag
        self.history: list[list[dict[str, str]]] = [[] for _ in range(n)]
        self.reply: list[list[str]] = [[] for _ in range(n)]
        self.turn = [0] * n
        self.output_tokens = 0
        self.prompt_rows = 0  # prompt tokens computed: neither memory- nor Redis-cached
        self.ttft: list[list[float]] = [[] for _ in range(turns)]  # by turn
        for c in range(n):
            self._ask(c)

    def _ask(self, c: int) -> None:
        turn = self.turn[c]
        question = (
            self.tag + QUESTIONS[c % len(QUESTIONS)]
            if turn == 0
            else FOLLOW_UPS[(c + turn) % len(FOLLOW_UPS)]
        )
        self.history[c].append({"role": "user", "content": question})
        tok: Any = self.engine.tokenizer
        text = tok.apply_chat_template(self.history[c], add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        params = SamplingParams(
            max_tokens=self.max_tokens, temperature=0.7, top_p=0.95, ignore_eos=True
        )
        self.engine.add_request(ids, params, f"c{c}-{turn}")
        self.reply[c] = []

    def take(self, deltas: list[Any]) -> None:
        for d in deltas:
            c = int(d.request_id[1:].split("-")[0])
            if d.text_job is not None:
                d.resolve_text()
            self.reply[c].append(d.text or "")
            if d.finished:
                fig = d.figures
                if fig is not None:
                    self.output_tokens += fig.output_tokens
                    self.prompt_rows += (
                        fig.prompt_tokens - fig.cached_tokens - fig.cached_tokens_redis
                    )
                    if fig.ttft is not None:
                        self.ttft[self.turn[c]].append(fig.ttft)
                self.history[c].append({"role": "assistant", "content": "".join(self.reply[c])})
                self.turn[c] += 1
                if self.turn[c] < self.turns:
                    self._ask(c)


def adjacency(engine: LLMEngine) -> float | None:
    """The share of running sequences' neighbouring block-table entries that are
    neighbours in the pool; None with no such pair."""
    pairs = [p for s in engine.scheduler.running for p in itertools.pairwise(s.block_table)]
    return sum(b == a + 1 for a, b in pairs) / len(pairs) if pairs else None


def fill_pool(engine: LLMEngine, streams: int, turns: int, max_tokens: int) -> int:
    """Run other conversations until under 2% of the pool's blocks are empty (20 rounds
    at most); the rounds run."""
    kv, rounds = engine.kv, 0
    while kv.num_empty >= kv.num_blocks // 50 and rounds < 20:
        rounds += 1
        run_once(engine, streams, turns, max_tokens, tag=f"(an earlier chat, {rounds}) ")
    return rounds


def run_once(
    engine: LLMEngine, streams: int, turns: int, max_tokens: int, tag: str = ""
) -> dict[str, Any]:
    chats = Conversations(engine, streams, turns, max_tokens, tag)
    steps: dict[str, list[tuple[float, int]]] = {"decode": [], "mixed": []}
    adjacent: list[float] = []
    start = time.perf_counter()
    while engine.has_work():
        t0 = time.perf_counter()
        deltas = engine.step()
        took = time.perf_counter() - t0
        last = engine.last_step
        rows, tokens = int(last["batch_size"]), int(last["tokens"])
        steps["decode" if tokens == rows else "mixed"].append((took, rows))
        share = adjacency(engine)
        if share is not None:
            adjacent.append(share)
        chats.take(deltas)
    wall = time.perf_counter() - start
    out: dict[str, Any] = {"tok_s": chats.output_tokens / wall, "seconds": wall}
    everyone = [t for ts in chats.ttft for t in ts]
    out["ttft_p50_ms"] = 1000 * statistics.median(everyone)
    out["ttft_p90_ms"] = 1000 * pct(everyone, 0.9)
    out["first_turn_ttft_p90_ms"] = 1000 * pct(chats.ttft[0], 0.9)
    out["prompt_rows"] = chats.prompt_rows
    out["adjacent"] = statistics.mean(adjacent) if adjacent else 0.0
    for kind, v in steps.items():
        out[f"{kind}_steps"] = len(v)
        out[f"{kind}_ms"] = 1000 * statistics.mean(t for t, _ in v) if v else 0.0
        out[f"{kind}_rows"] = statistics.mean(r for _, r in v) if v else 0.0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="")
    ap.add_argument("--streams", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--kv-dtype", default="auto", help="ENGINE_KV_DTYPE")
    ap.add_argument("--kv-mb", type=int, default=0, help="ENGINE_KV_CACHE_MEMORY_MB")
    ap.add_argument("--fill", action="store_true", help="start each run from a full pool")
    ap.add_argument("--json", default="bench_chat_engine.json")
    args = ap.parse_args()
    config = EngineConfig(
        model=args.model or str(default_model_path()),
        kv_dtype=args.kv_dtype,
        kv_cache_memory_mb=args.kv_mb,
    )
    engine = LLMEngine(config)
    engine.defer_text = True  # as the async front runs it
    freeze_loaded()
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in args.streams}
    for _ in range(args.repeat):
        for n in args.streams:
            engine.kv.reset_prefix_cache()  # each run's conversations start cold
            rounds = fill_pool(engine, n, args.turns, args.max_tokens) if args.fill else 0
            empty = engine.kv.num_empty
            runs[n].append(run_once(engine, n, args.turns, args.max_tokens))
            runs[n][-1].update(fill_rounds=rounds, empty_before=empty)
    runner = engine.runner
    pool = f"KV pool {dtype_name(runner.kv_dtype)}, {runner.num_blocks} blocks"
    start = "a full pool (--fill)" if args.fill else "an empty prefix cache"
    print(f"{platform.machine()}; {args.turns} turns of {args.max_tokens} tokens; {pool}; "
          f"each run from {start}; median (min-max) of {args.repeat}")  # fmt: skip
    print("| streams | tok/s | TTFT p50 ms | TTFT p90 ms | first turns' TTFT p90 ms | prompt "
          "rows computed | decode-only steps | ms | rows | mixed steps | ms | rows | "
          "neighbouring blocks adjacent |")  # fmt: skip
    print("|---:|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, rs in runs.items():
        cells = [cell(spread([r[k] for r in rs]), 2 if k == "adjacent" else 1) for k in (
            "tok_s", "ttft_p50_ms", "ttft_p90_ms", "first_turn_ttft_p90_ms", "prompt_rows",
            "decode_steps", "decode_ms", "decode_rows", "mixed_steps", "mixed_ms",
            "mixed_rows", "adjacent")]  # fmt: skip
        print(f"| {n} | " + " | ".join(cells) + " |")
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "runs": runs}, f, indent=1)
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
