"""How closely each weight format follows the exact float32 model, next to llama.cpp.

    python -m inference.bench.quality [--llama-server PATH] [--prompts 16 --tokens 48]
    python -m inference.bench.quality --formats hybrid --kv-dtypes float16 float32

The reference is our engine with exact float32 weights (`none`). For a fixed set of chat
prompts it decodes a greedy continuation; every format is then fed that same text one token
per step (teacher forcing, so each position is a real decode step) and compared at each
position: greedy agreement (its argmax equals the reference's) and the mean KL(reference ||
format) of the next-token distribution, over the whole vocabulary and over the reference's
top 20 tokens; with `--kv-dtypes`, each format over each KV pool element type
(ENGINE_KV_DTYPE; the reference keeps its float32 pool). llama-server, when given or built
(make bench-baseline), answers the same prefixes greedily: its greedy agreement is reported
(its probabilities for a greedy request are post-sampling, so no KL).
"""

from __future__ import annotations

import argparse
import json
import statistics
import urllib.request
from pathlib import Path
from typing import Any

import torch

from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.model_runner import dtype_name
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence

TOPICS = [
    "the water cycle", "how to bake bread", "the history of Rome", "black holes",
    "learning a language", "why the sky is blue", "a healthy breakfast", "chess openings",
    "the French revolution", "how vaccines work", "saving money", "volcanoes",
    "writing a cover letter", "photosynthesis", "the moon landing", "sleep and memory",
]  # fmt: skip
TOP = 20


def prompts(engine: LLMEngine, n: int) -> list[list[int]]:
    tok = engine.tokenizer
    return [
        tok.encode(f"<|im_start|>user\nTell me about {t}.<|im_end|>\n<|im_start|>assistant\n")
        for t in (TOPICS * (n // len(TOPICS) + 1))[:n]
    ]


def greedy(engine: LLMEngine, prompt: list[int], tokens: int) -> list[int]:
    rid = engine.add_request(prompt, SamplingParams(max_tokens=tokens, temperature=0.0))
    out: list[int] = []
    while engine.has_work():
        for d in engine.step():
            if d.request_id == rid:
                out.extend(d.token_ids)
    return out


def forced_logprobs(engine: LLMEngine, prompt: list[int], cont: list[int]) -> torch.Tensor:
    """Next-token log-probabilities at each continuation position, fed one token a step."""
    seq = Sequence("forced", prompt + cont, SamplingParams())
    engine.kv.reset_prefix_cache()
    rows = []
    while seq.num_computed_tokens < len(seq) - 1:
        n = len(prompt) if seq.num_computed_tokens == 0 else 1
        assert engine.kv.allocate(seq, seq.num_computed_tokens + n)
        _, logits = engine.runner.run(ScheduledBatch([seq], [n]), all_logits=True)
        if seq.num_computed_tokens + n >= len(prompt):
            rows.append(logits[-1])
        seq.num_computed_tokens += n
    engine.kv.free(seq)
    return torch.log_softmax(torch.stack(rows).float(), dim=-1)


def compare(ref: torch.Tensor, got: torch.Tensor) -> dict[str, float]:
    """Agreement and KL(ref || got) per position: whole vocabulary, and on ref's top 20."""
    agree = (ref.argmax(-1) == got.argmax(-1)).float()
    kl = (ref.exp() * (ref - got)).sum(-1)
    idx = ref.topk(TOP, dim=-1).indices
    r, g = ref.gather(1, idx), got.gather(1, idx)
    r, g = r - r.logsumexp(-1, keepdim=True), g - g.logsumexp(-1, keepdim=True)
    kl_top = (r.exp() * (r - g)).sum(-1)
    return {"agree": agree.mean().item(), "kl": kl.mean().item(), "kl_top": kl_top.mean().item()}


def llama_logprobs(url: str, prompt: list[int], cont: list[int], vocab: int) -> torch.Tensor:
    """llama-server's top-20 log-probabilities at each position (the rest -inf)."""
    rows = []
    for i in range(len(cont)):
        body = {"prompt": prompt + cont[:i], "n_predict": 1, "n_probs": TOP,
                "temperature": 0.0, "cache_prompt": True}  # fmt: skip
        req = urllib.request.Request(
            f"{url}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        answer = json.loads(urllib.request.urlopen(req, timeout=60).read())
        entry = answer["completion_probabilities"][0]
        row = torch.full((vocab,), float("-inf"))
        for t in entry.get("top_logprobs") or entry.get("top_probs") or []:
            lp = t["logprob"] if "logprob" in t else torch.log(torch.tensor(t["prob"])).item()
            row[int(t["id"])] = lp
        rows.append(row)
    return torch.stack(rows)


def main() -> None:
    from inference.model_files import bundled_gguf, default_model_path

    ap = argparse.ArgumentParser(prog="python -m inference.bench.quality", description=__doc__)
    ap.add_argument("--model", default=str(default_model_path()))
    ap.add_argument("--formats", nargs="+", default=["hybrid", "int4", "fp16", "int8"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--kv-dtypes", nargs="+", default=["auto"], help="ENGINE_KV_DTYPE values")
    ap.add_argument("--llama-server", default="", help="binary; 'build' builds it; default none")
    ap.add_argument("--json", default="bench_quality.json")
    args = ap.parse_args()

    def engine(q: str, kv_dtype: str = "auto") -> LLMEngine:
        config = EngineConfig(model=args.model, dtype="float32", quantization=q,
                              num_threads=1, kv_tier_url="", kv_dtype=kv_dtype)  # fmt: skip
        return LLMEngine(config)

    ref_engine = engine("none")
    ps = prompts(ref_engine, args.prompts)
    conts = [greedy(ref_engine, p, args.tokens) for p in ps]
    refs = [forced_logprobs(ref_engine, p, c) for p, c in zip(ps, conts, strict=True)]
    vocab = refs[0].shape[1]
    del ref_engine
    results: dict[str, Any] = {"reference": "float32 (none)", "formats": {}}
    for q in args.formats:
        for kv in args.kv_dtypes:
            e = engine(q, kv)
            name = q if args.kv_dtypes == ["auto"] else f"{q}, KV {dtype_name(e.runner.kv_dtype)}"
            per = [
                compare(r, forced_logprobs(e, p, c))
                for p, c, r in zip(ps, conts, refs, strict=True)
            ]
            results["formats"][name] = {k: statistics.mean(x[k] for x in per) for k in per[0]}
            print(name, results["formats"][name], flush=True)
            del e
    if args.llama_server:
        from inference.bench.llama_server import LlamaServer, llama_server_binary

        binary = llama_server_binary("" if args.llama_server == "build" else args.llama_server)
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            server = LlamaServer(binary, bundled_gguf(), 1, 1, Path(tmp)).start()
            try:
                per = []
                for p, c, r in zip(ps, conts, refs, strict=True):
                    got = llama_logprobs(server.url, p, c, vocab)
                    # Greedy requests get llama-server's post-sampling probabilities (one
                    # token at 1.0), so only its choice, not its distribution, compares.
                    per.append({"agree": compare(r, got.clamp(min=-1e4))["agree"]})
            finally:
                server.stop()
        results["formats"]["llama.cpp Q4_1"] = {
            k: statistics.mean(x[k] for x in per) for k in per[0]
        }
    print(f"\nagainst float32, {args.prompts} prompts x {args.tokens} teacher-forced tokens")
    print("| weights | greedy agreement | mean KL (vocabulary) | mean KL (top 20) |")
    print("|---|---|---|---|")
    for name, f in results["formats"].items():
        kl, kl_top = (f"{f[k]:.4f}" if k in f else "-" for k in ("kl", "kl_top"))
        print(f"| {name} | {f['agree']:.3f} | {kl} | {kl_top} |")
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
