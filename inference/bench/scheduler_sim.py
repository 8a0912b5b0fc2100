"""The scheduler and the KV pool alone, on many chats, with no model: preemptions and
recomputed prompts when the pool is smaller than the conversations.

    python -m inference.bench.scheduler_sim --chats 64 --blocks 0 1456 700

Drives `Scheduler` and `KVCacheManager` (the engine's own) step by step through chats
shaped as vs_llama's chat-mix (per 8 chats: 4 short questions, 3 with a paragraph, 1
pasting a document; every turn the whole history so far plus the next question; replies
of 40-256 tokens), each reply's tokens made up (distinct per chat, so no two chats share
blocks). Nothing is computed: a step "costs" `--decode-ms` per decoding row plus
`--prompt-ms` per prompt row plus a fixed part, an assumed cost model (its defaults are
round figures of the bundled model's steps at 64 streams), so its tok/s and TTFT are in
that model's seconds and only compare pool sizes and scheduling policies with each other
(run it from two checkouts to compare a change). What it counts exactly: the steps, the
preemptions, and the prompt rows computed (against the rows an unbounded pool computes:
the rest is history computed again after a preemption or an eviction). `--blocks 0` is
an unbounded pool. Prints a table (median over `--seeds`, min-max) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass

from inference.bench.spread import cell, pct, spread
from inference.engine.config import EngineConfig
from inference.engine.kv_cache import KVCacheManager
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Sequence

BLOCK_SIZE = 16
# Per 8 chats, as chat_workload.PATTERN: each kind's first question in tokens, then its
# follow-ups'.
KIND_TOKENS = {
    "short": ((10, 20), (8, 20)),
    "long": ((100, 250), (10, 120)),
    "document": ((500, 750), (10, 30)),
}
PATTERN = ("short", "long", "short", "document", "short", "long", "short", "long")
TEMPLATE_TOKENS = 40  # a system prompt and the chat template's markers
REPLY_TOKENS = (40, 256)
COLUMNS = {
    "steps": "steps",
    "preemptions": "preemptions",
    "prompt_rows": "prompt rows",
    "tok_s": "tok/s (model)",
    "ttft_p50_s": "TTFT p50 s",
    "ttft_p90_s": "TTFT p90 s",
}


@dataclass
class CostModel:
    fixed_ms: float = 5.0
    decode_ms: float = 1.1
    prompt_fixed_ms: float = 10.0
    prompt_ms: float = 0.5

    def step(self, decodes: int, prompt_rows: int) -> float:
        ms = self.fixed_ms + self.decode_ms * decodes
        if prompt_rows:
            ms += self.prompt_fixed_ms + self.prompt_ms * prompt_rows
        return ms / 1e3


@dataclass
class SimResult:
    blocks: int
    seed: int
    steps: int
    preemptions: int
    prompt_rows: int
    output_tokens: int
    seconds: float
    tok_s: float
    ttft_p50_s: float
    ttft_p90_s: float


class _Chat:
    def __init__(self, index: int, seed: int) -> None:
        self.kind = PATTERN[index % len(PATTERN)]
        # Its own draws: the same chat whatever order the scheduler serves it in.
        self.rng = random.Random(f"{seed}-{index}")
        self.next_token = 1_000_000 * (index + 1)
        self.history = self.tokens(TEMPLATE_TOKENS) + self.question(first=True)
        self.turn = 0

    def tokens(self, n: int) -> list[int]:
        out = list(range(self.next_token, self.next_token + n))
        self.next_token += n
        return out

    def question(self, first: bool) -> list[int]:
        low, high = KIND_TOKENS[self.kind][0 if first else 1]
        return self.tokens(self.rng.randint(low, high))


def simulate(
    num_blocks: int, chats: int = 64, turns: int = 3, seed: int = 0, cost: CostModel | None = None
) -> SimResult:
    """One run: every chat's turns to the end, on a pool of `num_blocks` (0: unbounded)."""
    cost = cost or CostModel()
    kv = KVCacheManager(num_blocks or 1 << 20, BLOCK_SIZE)
    scheduler = Scheduler(EngineConfig(max_num_seqs=max(chats, 1)), kv)
    convs = [_Chat(i, seed) for i in range(chats)]
    owner: dict[str, tuple[_Chat, int]] = {}
    now = 0.0

    def submit(chat: _Chat) -> None:
        rid = f"{id(chat)}-{chat.turn}"
        sampling = SamplingParams(max_tokens=REPLY_TOKENS[1])
        seq = Sequence(rid, list(chat.history), sampling, arrival_time=now)
        owner[rid] = (chat, chat.rng.randint(*REPLY_TOKENS))
        scheduler.add(seq)

    for chat in convs:
        submit(chat)
    steps = prompt_rows = output = 0
    ttfts: list[float] = []
    while scheduler.has_work:
        batch = scheduler.schedule()
        if not batch.seqs:
            raise RuntimeError("the scheduler made no progress: a sequence can never fit")
        steps += 1
        rows = batch.total_tokens - batch.num_decodes
        prompt_rows += rows
        now += cost.step(batch.num_decodes, rows)
        for seq, n in zip(batch.seqs, batch.num_tokens, strict=True):
            seq.num_computed_tokens += n
            kv.commit_full_blocks(seq)
            if seq.num_uncomputed_tokens:
                continue  # a prompt's chunk, more to come
            chat, reply = owner[seq.request_id]
            if seq.num_output_tokens == 0:
                ttfts.append(now - seq.figures.arrival_time)
            seq.append_token(chat.tokens(1)[0])
            output += 1
            if seq.num_output_tokens >= reply:
                scheduler.finish(seq)
                chat.history = list(seq.token_ids)
                chat.turn += 1
                if chat.turn < turns:
                    chat.history += chat.question(first=False)
                    submit(chat)
    return SimResult(
        blocks=num_blocks, seed=seed, steps=steps, preemptions=scheduler.num_preemptions,
        prompt_rows=prompt_rows, output_tokens=output, seconds=now, tok_s=output / now,
        ttft_p50_s=pct(ttfts, 0.5), ttft_p90_s=pct(ttfts, 0.9),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chats", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--blocks", type=int, nargs="+", default=[0, 1456, 700])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--decode-ms", type=float, default=CostModel.decode_ms)
    parser.add_argument("--prompt-ms", type=float, default=CostModel.prompt_ms)
    parser.add_argument("--json", default="/tmp/scheduler_sim.json")
    args = parser.parse_args()
    cost = CostModel(decode_ms=args.decode_ms, prompt_ms=args.prompt_ms)
    runs = [
        simulate(b, args.chats, args.turns, seed, cost)
        for b in args.blocks
        for seed in range(args.seeds)
    ]
    print(
        f"{args.chats} chats, {args.turns} turns; cost model {cost}; "
        f"median (min-max) over {args.seeds} seeds"
    )
    print("| pool blocks | " + " | ".join(COLUMNS.values()) + " |")
    print("|---:|" + "---|" * len(COLUMNS))
    for b in args.blocks:
        rs = [r for r in runs if r.blocks == b]
        cols = [cell(spread([float(getattr(r, k)) for r in rs])) for k in COLUMNS]
        print(f"| {b or 'unbounded'} | " + " | ".join(cols) + " |")
    with open(args.json, "w") as f:
        json.dump([asdict(r) for r in runs], f, indent=1)
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
