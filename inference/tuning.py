"""Batching-settings tuning: replay a workload against the engine under each candidate
setting and pick the one with the best goodput.

Goodput (as in DistServe) is the number of requests per second that meet both latency
targets: TTFT <= OBS_TUNING_TTFT_S and TPOT <= OBS_TUNING_TPOT_S. The workload is the most
recent recorded requests (their prompt/output lengths and arrival gaps) or, with none, a
synthetic Poisson stream. Requests arrive on the wall clock, so every setting faces the
same offered load.

Swept: the step token budget (max_num_batched_tokens) and the sequence cap
(max_num_seqs). Not swept, because there is nothing to sweep yet: speculation (the
engine has none) and the chat flush interval (a web-side setting an engine replay does
not exercise).
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from inference import stats
from inference.models import RequestRecord

DEFAULT_GRID = {"MAX_NUM_BATCHED_TOKENS": [256, 512, 1024], "MAX_NUM_SEQS": [8, 32, 64]}


@dataclass
class Request:
    at: float  # seconds after the start
    prompt_len: int
    output_len: int


def recorded_workload(n: int) -> list[Request]:
    rows = list(
        RequestRecord.objects.filter(e2e__isnull=False, output_tokens__gt=0).order_by(
            "-finished_at"
        )[:n]
    )
    if len(rows) < max(4, n // 4):
        return []
    rows.reverse()
    arrivals = [r.finished_at.timestamp() - (r.e2e or 0) - (r.network_time or 0) for r in rows]
    t0 = min(arrivals)
    return sorted(
        (
            Request(a - t0, max(1, r.prompt_tokens), r.output_tokens)
            for a, r in zip(arrivals, rows, strict=True)
        ),
        key=lambda q: q.at,
    )


def synthetic_workload(n: int, rate: float, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        out.append(Request(t, rng.randint(30, 300), rng.randint(16, 64)))
        t += rng.expovariate(rate)
    return out


def replay(engine: Any, workload: list[Request], vocab: int) -> list[Any]:
    """Submit each request at its time, step the engine until all are done; the
    finished requests' RequestMetrics."""
    from inference.engine import EngineBusyError, SamplingParams

    rng = random.Random(1)
    pending = list(workload)
    done = []
    start = time.time()
    while pending or engine.has_work():
        now = time.time() - start
        while pending and pending[0].at <= now:
            q = pending.pop(0)
            ids = [rng.randrange(100, vocab) for _ in range(q.prompt_len)]
            sampling = SamplingParams(max_tokens=q.output_len, temperature=0.0, ignore_eos=True)
            try:
                engine.add_request(ids, sampling)
            except EngineBusyError:
                done.append(None)
        if not engine.has_work():
            if pending:
                time.sleep(max(0.0, min(0.05, pending[0].at - (time.time() - start))))
            continue
        for d in engine.step():
            if d.finished:
                done.append(d.metrics)
    return done


def score(finished: list[Any], wall: float, ttft_target: float, tpot_target: float) -> dict:
    ok = [
        m
        for m in finished
        if m is not None
        and m.ttft is not None
        and m.ttft <= ttft_target
        and (m.tpot is None or m.tpot <= tpot_target)
    ]
    ttfts = [m.ttft for m in finished if m is not None and m.ttft is not None]
    tpots = [m.tpot for m in finished if m is not None and m.tpot is not None]
    return {
        "requests": len(finished),
        "refused": sum(1 for m in finished if m is None),
        "met_targets": len(ok),
        "goodput_rps": len(ok) / wall if wall else 0.0,
        "throughput_tok_s": sum(m.output_tokens for m in finished if m) / wall if wall else 0.0,
        "ttft_p50": stats.percentile(ttfts, 50),
        "ttft_p99": stats.percentile(ttfts, 99),
        "tpot_p50": stats.percentile(tpots, 50),
        "tpot_p99": stats.percentile(tpots, 99),
        "wall_s": wall,
    }


def run(params: dict[str, Any]) -> dict[str, Any]:
    from inference.client import engine_config_from_settings
    from inference.engine.engine import LLMEngine

    n = int(params.get("requests", 24))
    workload = [] if params.get("synthetic") else recorded_workload(n)
    source = "recorded" if workload else "synthetic"
    if not workload:
        workload = synthetic_workload(n, float(params.get("rate", 4.0)))
    ttft_target = float(params.get("ttft_target_s", settings.OBS_TUNING_TTFT_S))
    tpot_target = float(params.get("tpot_target_s", settings.OBS_TUNING_TPOT_S))
    grid = params.get("grid") or DEFAULT_GRID
    keys = sorted(grid)
    rows = []
    for values in itertools.product(*(grid[k] for k in keys)):
        overrides = dict(zip(keys, values, strict=True))
        engine = LLMEngine(engine_config_from_settings(overrides))
        vocab = int(engine.runner.model.vocab_size)
        longest = engine.max_model_len - 1
        load = [
            Request(q.at, min(q.prompt_len, longest // 2), min(q.output_len, longest // 2))
            for q in workload
        ]
        start = time.time()
        finished = replay(engine, load, vocab)
        rows.append(
            {
                "settings": overrides,
                **score(finished, time.time() - start, ttft_target, tpot_target),
            }
        )
        del engine
    best = max(rows, key=lambda r: (r["goodput_rps"], r["throughput_tok_s"]))
    return {
        "workload": source,
        "requests": len(workload),
        "targets": {"ttft_s": ttft_target, "tpot_s": tpot_target},
        "rows": rows,
        "best": best["settings"],
        "env": " ".join(f"ENGINE_{k}={v}" for k, v in best["settings"].items()),
    }


def apply(best: dict[str, Any]) -> None:
    """Restart this process's embedded engine with the chosen settings (requests running
    on the old engine end as aborted). To keep them across restarts, set the env lines."""
    from inference.client import EngineClient, engine_config_from_settings, set_engine_client
    from inference.engine import AsyncEngine

    if settings.ENGINE["MODE"] != "embedded":
        raise RuntimeError("only an embedded engine can be retuned from the dashboard")
    set_engine_client(EngineClient(AsyncEngine(engine_config_from_settings(best))))
