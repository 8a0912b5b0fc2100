"""The workloads of the engine issue, run on our engine; each returns a dict of figures."""

from __future__ import annotations

import itertools
import random
import statistics

from inference.bench.driver import Arrival, Finished, drive, rss_mb
from inference.bench.spread import pct
from inference.engine.engine import LLMEngine
from inference.engine.sampling_params import SamplingParams

TEXT = (
    "The history of the city begins with a small fishing village on the river bank. "
    "Over the centuries merchants, scholars and builders arrived, and the village grew "
    "into a town with markets, bridges, libraries and a harbour full of ships. "
)


def make_prompts(engine: LLMEngine, lengths: list[int]) -> list[list[int]]:
    """Chat-formatted prompts of roughly the given token lengths, all different."""
    tok = engine.tokenizer
    filler = tok.encode(TEXT * 40)
    prompts = []
    for i, n in enumerate(lengths):
        head = tok.encode(f"<|im_start|>user\nRequest {i}: continue the story. ")
        tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n")
        body = filler[i % 7 : i % 7 + max(1, n - len(head) - len(tail))]
        prompts.append(head + body + tail)
    return prompts


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def single_stream(engine: LLMEngine, prompt: list[int], max_tokens: int) -> dict[str, float]:
    engine.kv.reset_prefix_cache()
    res = drive(engine, [Arrival(0, "s", prompt, greedy(max_tokens))])
    m = res.finished["s"].figures
    return {"ttft": m.ttft, "decode_tok_s": 1.0 / m.tpot, "tpot": m.tpot}


def concurrent(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    engine.kv.reset_prefix_cache()
    arrivals = [Arrival(0, f"c{i}", p, greedy(max_tokens)) for i, p in enumerate(prompts)]
    res = drive(engine, arrivals)
    ms = [f.figures for f in res.finished.values()]
    span = max(m.finish_time for m in ms) - min(m.arrival_time for m in ms)
    produced = sum(m.output_tokens for m in ms)
    return {
        "seconds": span,
        "tok_s": produced / span,
        "ttft_p50": pct([m.ttft for m in ms], 0.5),
        "tpot_p50": pct([m.tpot for m in ms if m.tpot], 0.5),
    }


def multi_turn(
    engine: LLMEngine, conversations: int, turns: int, max_tokens: int, prefix_cache: bool
) -> dict[str, object]:
    """Each turn sends the whole history (prompt + reply + a new user message)."""
    engine.kv.reset_prefix_cache()
    engine.kv.enable_prefix_caching = prefix_cache
    tok = engine.tokenizer
    rng = random.Random(0)
    words = TEXT.split()

    def user_msg(c: int, t: int) -> list[int]:
        text = " ".join(rng.choice(words) for _ in range(20))
        return tok.encode(f"<|im_start|>user\nConversation {c}, turn {t}: {text}<|im_end|>\n")

    assistant = tok.encode("<|im_start|>assistant\n")
    system = tok.encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    history = {c: system + user_msg(c, 1) + assistant for c in range(conversations)}
    ttft: dict[int, list[float]] = {t: [] for t in range(1, turns + 1)}
    cached: dict[int, list[int]] = {t: [] for t in range(1, turns + 1)}

    def on_finish(rid: str, done: Finished, step: int) -> list[Arrival]:
        c, t = (int(x) for x in rid.split("-"))
        ttft[t].append(done.figures.ttft)
        cached[t].append(done.figures.cached_tokens)
        if t == turns:
            return []
        history[c] = history[c] + done.token_ids + tok.encode("<|im_end|>\n")
        history[c] += user_msg(c, t + 1) + assistant
        return [Arrival(step + 1, f"{c}-{t + 1}", history[c], greedy(max_tokens))]

    first = [Arrival(0, f"{c}-1", history[c], greedy(max_tokens)) for c in range(conversations)]
    drive(engine, first, on_finish=on_finish)
    engine.kv.enable_prefix_caching = engine.config.enable_prefix_caching
    return {
        "ttft_p50_by_turn": {t: statistics.median(v) for t, v in ttft.items()},
        "cached_tokens_by_turn": {t: statistics.mean(v) for t, v in cached.items()},
    }


def busy_streams(
    engine: LLMEngine,
    streams: int,
    stream_tokens: int,
    probe_prompt: list[int],
    long_prompt: list[int],
) -> dict[str, float]:
    """Probes and a long prompt arriving while `streams` streams decode."""
    engine.kv.reset_prefix_cache()
    stream_prompts = make_prompts(engine, [40 + 10 * i for i in range(streams)])

    def streams_at_zero() -> list[Arrival]:
        return [Arrival(0, f"s{i}", p, greedy(stream_tokens)) for i, p in enumerate(stream_prompts)]

    # A short request alone, three times (no prefix hits: each differs in its last token).
    alone = []
    for i in range(3):
        prompt = [*probe_prompt[:-1], 100 + i]
        res = drive(engine, [Arrival(0, "alone", prompt, greedy(4))])
        alone.append(res.finished["alone"].figures.ttft)
    ttft_alone = statistics.median(alone)

    # The same short request arriving every few steps while the streams decode.
    probes = [
        Arrival(6 + 3 * i, f"p{i}", [*probe_prompt[:-1], 200 + i], greedy(4)) for i in range(8)
    ]
    res = drive(engine, streams_at_zero() + probes)
    probe_ttft = [res.finished[f"p{i}"].figures.ttft for i in range(8)]

    # A long prompt arriving while the streams decode: their gaps while it prefills.
    res = drive(engine, [*streams_at_zero(), Arrival(8, "long", long_prompt, greedy(4))])
    long_m = res.finished["long"].figures
    during, before = [], []
    for i in range(streams):
        m = res.finished[f"s{i}"].figures
        times = m.token_times
        for a, b in itertools.pairwise(times):
            if long_m.arrival_time <= b <= long_m.first_token_time:
                during.append(b - a)
            elif b < long_m.arrival_time:
                before.append(b - a)
    itl_median = statistics.median(before) if before else float("nan")
    return {
        "ttft_alone": ttft_alone,
        "ttft_busy_p50": pct(probe_ttft, 0.5),
        "ttft_busy_p99": pct(probe_ttft, 0.99),
        "ttft_ratio_p99": pct(probe_ttft, 0.99) / ttft_alone,
        "long_prompt_tokens": len(long_prompt),
        "long_prompt_ttft": long_m.ttft,
        "itl_median_before": itl_median,
        "itl_p99_during_long_prefill": pct(during, 0.99),
        "itl_ratio": pct(during, 0.99) / itl_median,
    }


def flood(engine: LLMEngine, n: int, max_tokens: int, prompt_len: int) -> dict[str, float]:
    """n requests submitted at once: each completes or is refused as busy; memory stays put."""
    engine.kv.reset_prefix_cache()
    prompts = make_prompts(engine, [prompt_len + i % 8 for i in range(n)])
    before = rss_mb()
    arrivals = [Arrival(0, f"f{i}", p, greedy(max_tokens)) for i, p in enumerate(prompts)]
    res = drive(engine, arrivals, watch_memory=True)
    completed = sum(1 for f in res.finished.values() if f.finish_reason == "length")
    return {
        "submitted": n,
        "completed": completed,
        "refused_busy": len(res.refused),
        "other": n - completed - len(res.refused),
        "rss_before_mb": before,
        "rss_peak_mb": res.peak_rss_mb,
        "kv_budget_mb": engine.runner.kv_cache_mb,
        "seconds": res.wall,
    }
