"""python -m inference.bench.structured: what a structured output's grammar costs per token.

For 1 and 16 streams decoding under a JSON schema together, the time per step to fill the
grammar masks (xgrammar, on the mask thread: overlapped with the model's forward in the
engine), to apply them to the logits (on the step's path), and to advance the matchers by
the sampled tokens. Tokens are picked greedily from random logits under the mask, so the
walk covers the schema as a real reply would. Prints a table and writes a JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from transformers import AutoTokenizer

from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence
from inference.engine.structured import StructuredOutputs

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 8},
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "items": {
            "type": "array",
            "maxItems": 6,
            "items": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
                "required": ["id", "ok"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["name", "tags", "score", "items"],
    "additionalProperties": False,
}


def measure(grammars: StructuredOutputs, streams: int, steps: int, seed: int) -> dict[str, Any]:
    spec = json.dumps(SCHEMA)
    params = SamplingParams(structured="json_schema", structured_spec=spec)
    seqs = [Sequence(f"s{i}", [0], params) for i in range(streams)]
    for seq in seqs:
        seq.grammar = grammars.start("json_schema", spec)
    g = torch.Generator().manual_seed(seed)
    fill = apply = accept = 0.0
    tokens = 0
    rows = list(range(streams))
    for _ in range(steps):
        live = [s for s in seqs if s.grammar is not None and not s.grammar.done]
        if not live:
            break
        logits = torch.randn(len(live), grammars.vocab_size, generator=g)
        t0 = time.perf_counter()
        mask = grammars.fill(live)
        t1 = time.perf_counter()
        grammars.apply(logits, rows[: len(live)], mask)
        picks = logits.argmax(-1).tolist()
        t2 = time.perf_counter()
        for seq, token in zip(live, picks, strict=True):
            assert seq.grammar is not None
            seq.grammar.accept(token)
        t3 = time.perf_counter()
        fill, apply, accept = fill + t1 - t0, apply + t2 - t1, accept + t3 - t2
        tokens += len(live)
    per = 1e6 / max(tokens, 1)
    return {
        "streams": streams,
        "tokens": tokens,
        "fill_us_per_token": fill * per,
        "apply_us_per_token": apply * per,
        "accept_us_per_token": accept * per,
        "serial_us_per_step": (apply + accept) * 1e6 / max(steps, 1),
        "fill_us_per_step": fill * 1e6 / max(steps, 1),
    }


def main() -> None:
    from inference.model_files import default_model_path

    p = argparse.ArgumentParser(prog="python -m inference.bench.structured", description=__doc__)
    p.add_argument("--model", default=str(default_model_path()), help="HF model folder")
    p.add_argument("--streams", default="1,16", help="comma-separated stream counts")
    p.add_argument("--steps", type=int, default=120, help="decode steps per measurement")
    p.add_argument("--json", default="bench_structured.json", help="where to write results")
    args = p.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    vocab = max(len(tokenizer), int(getattr(tokenizer, "vocab_size", 0)))
    t0 = time.perf_counter()
    grammars = StructuredOutputs(tokenizer, vocab, [tokenizer.eos_token_id])
    setup_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    grammars.start("json_schema", json.dumps(SCHEMA))
    compile_ms = (time.perf_counter() - t0) * 1e3
    counts = [int(n) for n in args.streams.split(",")]
    results = [measure(grammars, n, args.steps, seed=n) for n in counts]
    print(f"tokenizer info {setup_ms:.0f} ms, schema compile {compile_ms:.1f} ms, vocab {vocab}")
    print(
        f"{'streams':>7} {'tokens':>7} {'fill us/tok':>12} {'apply us/tok':>13} "
        f"{'accept us/tok':>14} {'fill us/step':>13} {'on-path us/step':>16}"
    )
    for r in results:
        print(
            f"{r['streams']:>7} {r['tokens']:>7} {r['fill_us_per_token']:>12.1f} "
            f"{r['apply_us_per_token']:>13.1f} {r['accept_us_per_token']:>14.1f} "
            f"{r['fill_us_per_step']:>13.0f} {r['serial_us_per_step']:>16.0f}"
        )
    out = {"setup_ms": setup_ms, "compile_ms": compile_ms, "vocab": vocab, "results": results}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
