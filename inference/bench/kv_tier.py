"""python -m inference.bench.kv_tier: the Redis KV tier on the default model.

TTFT of the next turn of a ~2,000-token conversation when its KV is (a) hot in memory,
(b) restored from Redis by a freshly started engine, (c) recomputed (tier off, cold); and
what the write-back costs streams that decode while other conversations finish. Needs a
Redis (--redis-url); it writes under a namespace of its own and deletes it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from collections.abc import Mapping
from typing import Any

import redis
import torch

from inference.bench.driver import Arrival, drive
from inference.bench.targets import Target, checked, print_targets
from inference.bench.workloads import greedy, make_prompts
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine

# ENGINE_KV_TIER_URL's own default (chatapp/settings/base.py): used only when it is unset.
DEFAULT_URL = "redis://127.0.0.1:6379/4"


def tier_url(given: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The Redis this section uses: --kv-tier-url, else ENGINE_KV_TIER_URL (the tier the
    server uses), else DEFAULT_URL. "" means the tier is off: the section is skipped. The
    bench writes only under a namespace of its own, which it deletes afterwards, so pointing
    it at the serving tier leaves that tier's entries alone."""
    if given is not None:
        return given.strip()
    env = os.environ if environ is None else environ
    return env.get("ENGINE_KV_TIER_URL", DEFAULT_URL).strip()


def _config(model: str, quantization: str, threads: int, **kw: Any) -> EngineConfig:
    return EngineConfig(model=model, quantization=quantization, num_threads=threads, **kw)


def _turn(engine: LLMEngine, prompt: list[int], max_tokens: int) -> tuple[list[int], Any]:
    rid = uuid.uuid4().hex
    done = drive(engine, [Arrival(0, rid, prompt, greedy(max_tokens))]).finished[rid]
    return done.token_ids, done.figures


def restore_ttft(
    model: str, url: str, quantization: str = "auto", threads: int = 1, tokens: int = 2000,
    reps: int = 3, max_tokens: int = 8,
) -> dict[str, Any]:  # fmt: skip
    namespace = f"bench-kvtier-{uuid.uuid4().hex[:8]}"
    try:
        return _restore_ttft(model, url, namespace, quantization, threads, tokens, reps,
                             max_tokens)  # fmt: skip
    finally:
        drop_namespace(url, namespace)


def _restore_ttft(
    model: str, url: str, namespace: str, quantization: str, threads: int, tokens: int,
    reps: int, max_tokens: int,
) -> dict[str, Any]:  # fmt: skip
    tier = {"kv_tier_url": url, "kv_tier_namespace": namespace}
    hot = LLMEngine(_config(model, quantization, threads, **tier))
    if hot.kv_tier is None or not hot.kv_tier.available:
        raise RuntimeError(f"no Redis answers at {url}")
    tok = hot.tokenizer
    turn1 = _long_prompt(tok, tokens - 40)
    reply, _ = _turn(hot, turn1, max_tokens)
    history = turn1 + reply + tok.encode("<|im_end|>\n")
    nexts = [
        history + tok.encode(f"<|im_start|>user\nQuestion {r}: and then?<|im_end|>\n")
        + tok.encode("<|im_start|>assistant\n")
        for r in range(reps)
    ]  # fmt: skip
    assert hot.kv_tier.flush(60)
    out: dict[str, Any] = {"prompt_tokens": len(nexts[0]), "reps": reps, "namespace": namespace}

    a = [_turn(hot, p, max_tokens)[1].ttft for p in nexts]
    hot.close()
    del hot

    b, restored_tokens, restore_s, mb_read, b_out = [], [], [], [], []
    warmup = make_prompts_like(tok, 40)
    for p in nexts:
        engine = LLMEngine(_config(model, quantization, threads, **tier))
        _turn(engine, warmup, 2)  # a started engine has served something: torch is warm
        before = engine.stats()
        ids, m = _turn(engine, p, max_tokens)
        after = engine.stats()
        b.append(m.ttft)
        b_out.append(ids)
        restored_tokens.append(m.cached_tokens_redis)
        restore_s.append(
            after["kv_tier_restore_seconds_total"] - before["kv_tier_restore_seconds_total"]  # type: ignore[operator]
        )
        mb_read.append((after["kv_tier_bytes_read"] - before["kv_tier_bytes_read"]) / 2**20)  # type: ignore[operator]
        engine.close()
        del engine

    cold = LLMEngine(_config(model, quantization, threads, enable_prefix_caching=False))
    _turn(cold, warmup, 2)
    c, c_out = [], []
    for p in nexts:
        ids, m = _turn(cold, p, max_tokens)
        c.append(m.ttft)
        c_out.append(ids)
    del cold

    med = statistics.median
    out.update({
        "ttft_hot_s": med(a),
        "ttft_restored_s": med(b),
        "ttft_cold_s": med(c),
        "restored_tokens": med(restored_tokens),
        "restore_seconds": med(restore_s),
        "restore_mb_read": med(mb_read),
        "restored_over_cold": med(b) / med(c),
        "restored_minus_hot_ms": (med(b) - med(a)) * 1000,
        "restored_output_equals_cold": b_out == c_out,
        "all_ttft": {"hot": a, "restored": b, "cold": c},
    })  # fmt: skip
    return out


def _long_prompt(tok: Any, n: int) -> list[int]:
    """A chat-formatted user message of about n tokens."""
    facts = " ".join(
        f"Fact {i}: the harbour town of Vell traded salt, wool and timber in year {1200 + i}."
        for i in range(n // 10)
    )
    head = tok.encode("<|im_start|>user\nRemember these facts. ")
    tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n")
    return head + tok.encode(facts)[: n - len(head) - len(tail)] + tail


def make_prompts_like(tok: Any, n: int) -> list[int]:
    ids = tok.encode("<|im_start|>user\nWarm up: say hello. " + "hello " * n)
    return ids[:n] + tok.encode("<|im_end|>\n<|im_start|>assistant\n")


def write_back_cost(
    model: str, url: str, quantization: str = "auto", threads: int = 1, streams: int = 8,
    stream_tokens: int = 64, finishing: int = 12, finishing_len: int = 400, reps: int = 3,
) -> dict[str, Any]:  # fmt: skip
    """Decode tok/s of `streams` streams while `finishing` other conversations arrive, finish
    and (tier on) are written back; the same engine with the tier on and off, alternately."""
    namespace = f"bench-kvtier-{uuid.uuid4().hex[:8]}"
    try:
        return _write_back_cost(model, url, namespace, quantization, threads, streams,
                                stream_tokens, finishing, finishing_len, reps)  # fmt: skip
    finally:
        drop_namespace(url, namespace)


def _write_back_cost(
    model: str, url: str, namespace: str, quantization: str, threads: int, streams: int,
    stream_tokens: int, finishing: int, finishing_len: int, reps: int,
) -> dict[str, Any]:  # fmt: skip
    engine = LLMEngine(_config(model, quantization, threads, kv_tier_url=url,
                               kv_tier_namespace=namespace))  # fmt: skip
    tier = engine.kv_tier
    if tier is None or not tier.available:
        raise RuntimeError(f"no Redis answers at {url}")
    rates: dict[str, list[float]] = {"on": [], "off": []}
    written: list[int] = []
    run = 0
    for _ in range(reps):
        for mode in ("off", "on"):
            run += 1
            engine.kv_tier = tier if mode == "on" else None
            engine.kv.reset_prefix_cache()
            # The same work in every run (only the tag differs): on and off compare fairly.
            lengths = [30 + 5 * i for i in range(streams)]
            lengths += [finishing_len + i for i in range(finishing)]
            # A tag per run: no run finds another's blocks, in memory or in Redis.
            tag = engine.tokenizer.encode(f"Run {run}. ")
            prompts = [tag + p for p in make_prompts(engine, lengths)]
            arrivals = [Arrival(0, f"s{i}", p, greedy(stream_tokens))
                        for i, p in enumerate(prompts[:streams])]  # fmt: skip
            arrivals += [Arrival(4 + 4 * i, f"f{i}", p, greedy(2))
                         for i, p in enumerate(prompts[streams:])]  # fmt: skip
            before = tier.stats()["kv_tier_bytes_written"]
            res = drive(engine, arrivals)
            tier.flush(60)
            ms = [res.finished[f"s{i}"].figures for i in range(streams)]
            span = max(m.finish_time for m in ms) - min(m.first_token_time for m in ms)
            rates[mode].append(sum(m.output_tokens - 1 for m in ms) / span)
            if mode == "on":
                written.append(tier.stats()["kv_tier_bytes_written"] - before)  # type: ignore[operator]
    engine.kv_tier = tier
    engine.close()
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    return {
        "streams": streams,
        "finishing_conversations": finishing,
        "decode_tok_s_tier_off": off,
        "decode_tok_s_tier_on": on,
        "cost": 1 - on / off,
        "mb_written_per_run": statistics.median(written) / 2**20,
        "all_tok_s": rates,
    }


def drop_namespace(url: str, namespace: str) -> None:
    """Delete a benchmark run's keys (a KV tier's or an engine workers' namespace), and only
    those: never FLUSHDB, Redis may be shared. Every benchmark that writes there calls it
    when done: left behind, each run's
    KV blocks (up to ENGINE_KV_TIER_MAX_MB a namespace) piled up in Redis until a day of
    runs held ~19 GB and the kernel's OOM killer stopped Redis."""
    if not namespace.startswith("bench-"):
        raise ValueError(f"refusing to drop {namespace!r}: not a namespace of the bench's")
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(f"{namespace}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    except redis.RedisError:
        pass  # Redis away: nothing was written there either, or it expires under its TTL
    finally:
        client.close()


def run(model: str, url: str, quantization: str = "auto", threads: int = 1) -> dict[str, Any]:
    if not url:
        return {"error": "skipped: the KV tier is off (ENGINE_KV_TIER_URL is empty)"}
    return {
        "restore": restore_ttft(model, url, quantization, threads),
        "write_back": write_back_cost(model, url, quantization, threads),
    }


def print_section(r: dict[str, Any]) -> None:
    if "restore" not in r:
        print(f"\nKV tier: {r.get('error', 'not run')}")
        return
    s, w = r["restore"], r["write_back"]
    print(f"\nKV tier (Redis): next turn of a {s['prompt_tokens']}-token conversation, "
          f"TTFT median of {s['reps']}:")  # fmt: skip
    print(f"  (a) hot in memory              {s['ttft_hot_s']:8.3f} s")
    print(
        f"  (b) restored from Redis        {s['ttft_restored_s']:8.3f} s   "
        f"({s['restored_tokens']:.0f} tokens, {s['restore_mb_read']:.0f} MB read, "
        f"restore {s['restore_seconds'] * 1000:.0f} ms)"
    )
    print(f"  (c) recomputed (tier off)      {s['ttft_cold_s']:8.3f} s")
    print(f"  restored output == cold output (greedy): {s['restored_output_equals_cold']}")
    print(
        f"write-back: {w['streams']} streams decode {w['decode_tok_s_tier_off']:.1f} tok/s tier "
        f"off, {w['decode_tok_s_tier_on']:.1f} on, while {w['finishing_conversations']} "
        f"conversations finish ({w['mb_written_per_run']:.0f} MB written): "
        f"cost {w['cost'] * 100:.1f}%"
    )


def targets(r: dict[str, Any]) -> list[Target]:
    s, w = r.get("restore", {}), r.get("write_back", {})
    return [
        ("KV tier: TTFT restored / recomputed", "<=", 0.3, s.get("restored_over_cold")),
        ("KV tier: TTFT restored - hot, ms", "<", 100.0, s.get("restored_minus_hot_ms")),
        ("KV tier: write-back cost to decode", "<", 0.05, w.get("cost")),
    ]


def main() -> None:
    from inference.model_files import default_model_path

    p = argparse.ArgumentParser(prog="python -m inference.bench.kv_tier", description=__doc__)
    p.add_argument("--model", default=str(default_model_path()), help="HF model folder")
    p.add_argument(
        "--redis-url",
        default=None,
        help=f"the Redis to use (default: ENGINE_KV_TIER_URL, else {DEFAULT_URL})",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument(
        "--quantization",
        default="auto",
        help="engine weights: auto|none|fp16|int8|int4|hybrid",
    )
    p.add_argument("--json", default="bench_kv_tier.json", help="where to write the figures")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    results = run(args.model, tier_url(args.redis_url), args.quantization, args.threads)
    results["started"] = started
    results["targets"] = checked(targets(results))
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print_section(results)
    print_targets(results["targets"])
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
