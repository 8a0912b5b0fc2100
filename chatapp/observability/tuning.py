"""Serving-settings tuning: replay one workload under the current settings and a few
neighbours of them, several times each, and name a winner only when it beats the current
settings by more than the runs' own spread.

Goodput (as in DistServe) is the number of requests per second that meet both latency
targets: TTFT <= OBS_TUNING_TTFT_S and TPOT <= OBS_TUNING_TPOT_S, both as a chat client
sees them. The workload is the most recent recorded requests (their prompt/output lengths
and arrival gaps, compressed to span at most `max_span_s`: recorded traffic may spread 24
requests over ten minutes, and a trial would idle through them) or, with none, a synthetic
Poisson stream. Requests arrive on the wall clock, so every trial faces the same offered
load, with the same prompt ids. Each trial is cut at `trial_limit_s`: what had not finished
by then counts as missing the targets.

Swept (a coordinate sweep: one setting changes at a time, the others stay current):
  - MAX_NUM_BATCHED_TOKENS, the step token budget;
  - MAX_NUM_SEQS, the sequence cap;
  - SPECULATIVE_MODE, speculative decoding: "" (off), "ngram" or "auto"
    (inference/engine/speculative.py);
  - CHAT_FLUSH_INTERVAL_MS, how often the chat socket sends a reply's coalesced deltas:
    every trial streams its replies through the chat consumer's coalescing rule into a
    real local socket, so frames cost what they cost, and TTFT/TPOT are taken from the
    frames, not from the engine.

Trials are independent of each other and of the serving engine: one engine is loaded for
the whole sweep with the Redis KV tier off (so nothing is restored from, or written to,
the real tier), its memory prefix cache is emptied before every trial, and each trial
gets a fresh scheduler and speculator. Settings run interleaved (A B C A B C A B C), so a
neighbour's load or a warming CPU touches them all alike. The winner rule is `decide`.
"""

from __future__ import annotations

import dataclasses
import json
import random
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from chatapp.observability import percentiles
from chatapp.observability.models import RequestRecord
from inference.backends.embedded import EmbeddedClient
from inference.client import engine_config_from_settings, set_engine_client
from inference.engine import EngineBusyError, SamplingParams

# The dashboard's tuning form takes these; `manage.py run_job tune --params` takes any.
PARAMS = ("requests", "rate", "synthetic", "ttft_target_s", "tpot_target_s", "repeats", "axes",
          "max_span_s", "trial_limit_s")  # fmt: skip

# The swept settings: ENGINE keys, except the chat flush interval (a settings name).
ENGINE_AXES = ("MAX_NUM_BATCHED_TOKENS", "MAX_NUM_SEQS", "SPECULATIVE_MODE")
FLUSH_AXIS = "CHAT_FLUSH_INTERVAL_MS"
AXES = (*ENGINE_AXES, FLUSH_AXIS)
SPECULATIVE_MODES = ("", "ngram", "auto")

# Each axis's values; those equal to the current setting are not run twice. With the
# current settings among them this is 1 + 2 + 2 + 2 + 2 = 9 settings.
DEFAULT_AXES: dict[str, list[Any]] = {
    "MAX_NUM_BATCHED_TOKENS": [256, 512, 1024],
    "MAX_NUM_SEQS": [8, 32, 64],
    "SPECULATIVE_MODE": ["", "ngram", "auto"],
    FLUSH_AXIS: [15, 30, 60],
}
DEFAULT_REPEATS = 3
MIN_REPEATS = 3  # fewer runs give no spread to judge a difference by
MAX_TRIALS = 60  # settings x repeats: keeps one job within minutes on the real model
# A winner's worst run must beat the current settings' best run by this fraction too: with
# 3 runs each, a setting no better than the current one still has its 3 runs all above the
# current 3 one time in 20, and the sweep tries 8 of them.
DEFAULT_MARGIN = 0.05
KEEP_CURRENT = "no clear winner: keep the current settings"
# A recorded workload's arrivals are squeezed into this many seconds (order and relative
# gaps kept), and a trial is cut this long after its first arrival: with MAX_TRIALS trials
# a run stays within the job's time limit (chatapp/jobs/queue.py TIME_LIMIT_S).
DEFAULT_MAX_SPAN_S = 30.0
DEFAULT_TRIAL_LIMIT_S = 90.0


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


def compress(workload: list[Request], max_span_s: float) -> tuple[list[Request], float]:
    """The workload with its arrival gaps scaled down so it spans at most `max_span_s`
    (never stretched), and the factor it was scaled by."""
    span = max((q.at for q in workload), default=0.0)
    factor = min(1.0, max_span_s / span) if span > 0 else 1.0
    return [dataclasses.replace(q, at=q.at * factor) for q in workload], factor


def synthetic_workload(n: int, rate: float, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        out.append(Request(t, rng.randint(30, 300), rng.randint(16, 64)))
        t += rng.expovariate(rate)
    return out


# --- the sweep ---------------------------------------------------------------------------


def current_settings() -> dict[str, Any]:
    """The swept settings as this process runs them."""
    return {
        **{k: settings.ENGINE.get(k, "") for k in ENGINE_AXES},
        FLUSH_AXIS: int(settings.CHAT_FLUSH_INTERVAL_MS),
    }


def _checked_value(axis: str, value: Any) -> Any:
    if axis == "SPECULATIVE_MODE":
        mode = "" if value in ("off", None) else value
        if mode not in SPECULATIVE_MODES:
            raise ValueError(f"SPECULATIVE_MODE values must be off, ngram or auto; got {value!r}")
        return mode
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{axis} values must be integers; got {value!r}")
    if value < (0 if axis == FLUSH_AXIS else 1):
        raise ValueError(f"{axis} values must be {'>= 0' if axis == FLUSH_AXIS else '>= 1'}")
    return value


def sweep_settings(current: dict[str, Any], axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The current settings first, then each axis's other values with the rest current."""
    unknown = set(axes) - set(AXES)
    if unknown:
        raise ValueError(f"unknown tuning axes {sorted(unknown)}; known: {list(AXES)}")
    out = [dict(current)]
    for axis in AXES:
        values = axes.get(axis)
        if values is None:
            continue
        if not isinstance(values, list) or not values:
            raise ValueError(f"axis {axis} needs a non-empty list of values")
        for value in values:
            setting = {**current, axis: _checked_value(axis, value)}
            if setting not in out:
                out.append(setting)
    return out


def trial_order(num_settings: int, repeats: int) -> list[tuple[int, int]]:
    """(setting, repeat) pairs, interleaved: every setting's first run, then every
    setting's second run, and so on."""
    return [(s, r) for r in range(repeats) for s in range(num_settings)]


def beats(runs: list[float], others: list[float], margin: float) -> bool:
    """Whether `runs` is ahead of `others` beyond the noise: its worst run above their best
    by more than `margin` (a fraction of it), so the min-max ranges do not overlap, with
    room to spare."""
    return min(runs) > max(others) * (1 + margin)


def contenders(
    goodputs: list[list[float]], current: int = 0, margin: float = DEFAULT_MARGIN
) -> list[int]:
    """The settings that beat the current one beyond the noise."""
    if not 0 <= current < len(goodputs):
        raise ValueError("current must index one of the settings")
    if any(not runs for runs in goodputs):
        raise ValueError("every setting needs at least one run")
    if margin < 0:
        raise ValueError("margin must be >= 0")
    return [
        i
        for i, runs in enumerate(goodputs)
        if i != current and beats(runs, goodputs[current], margin)
    ]


def decide(
    goodputs: list[list[float]], current: int = 0, margin: float = DEFAULT_MARGIN
) -> int | None:
    """The index of the setting that beats the current one beyond the noise, or None.

    A winner beats the current settings (`beats`) and every other setting that does too.
    When two settings beat the current ones but not each other, which is ahead is the
    noise's choice, and a second run would name the other: no clear winner then.
    """
    return clear_winner(goodputs, contenders(goodputs, current, margin), margin)


def clear_winner(goodputs: list[list[float]], ahead: list[int], margin: float) -> int | None:
    """The one of `ahead` (the `contenders`) that beats all the others, or None."""
    for i in ahead:
        if all(beats(goodputs[i], goodputs[j], margin) for j in ahead if j != i):
            return i
    return None


def env_lines(setting: dict[str, Any]) -> str:
    """The environment that keeps `setting` after a restart."""
    return " ".join(
        f"{k}={v}" if k == FLUSH_AXIS else f"ENGINE_{k}={v}" for k, v in setting.items()
    )


def describe(setting: dict[str, Any], current: dict[str, Any]) -> str:
    changed = [k for k in AXES if setting.get(k) != current.get(k)]
    if not changed:
        return "current"
    return ", ".join(f"{k}={setting[k] if setting[k] != '' else 'off'}" for k in changed)


# --- one trial -----------------------------------------------------------------------------


@dataclass
class Seen:
    """A reply as the chat client sees it (the fields `score` reads)."""

    ttft: float | None
    tpot: float | None
    output_tokens: int
    cached_tokens: int


class ChatSocket:
    """The chat consumer's coalescing (chatapp/chat/consumers.py `_pump`) in front of a real
    local socket: a reply's first text goes out at once, later text at most once per
    interval, everything held meanwhile in one frame; the done frame follows its last
    text at once. The time a frame is written is the time the client sees it."""

    def __init__(self, interval_s: float) -> None:
        self.interval = interval_s
        self._out, self._in = socket.socketpair()
        self._reader = threading.Thread(target=self._drain, name="tuning-socket", daemon=True)
        self._reader.start()
        self.held: dict[str, list[str]] = {}  # unsent text, by request
        self.last_sent: dict[str, float] = {}
        self.first_seen: dict[str, float] = {}
        self.last_seen: dict[str, float] = {}
        self.ending: dict[str, Any] = {}  # finished requests' figures, until their done frame
        self.seen: list[Seen] = []
        self.frames = 0
        self.cut: set[str] = set()  # stopped at the trial's time limit: targets missed

    def _drain(self) -> None:
        while self._in.recv(65536):
            pass

    def _send(self, request_id: str, frame: dict[str, Any]) -> None:
        self._out.sendall(json.dumps(frame).encode() + b"\n")
        now = time.time()
        self.frames += 1
        self.first_seen.setdefault(request_id, now)
        self.last_seen[request_id] = now

    def due(self, request_id: str) -> float:
        return self.last_sent.get(request_id, 0.0) + self.interval

    def add(self, delta: Any) -> None:
        if delta.text:
            self.held.setdefault(delta.request_id, []).append(delta.text)
        if delta.finished:
            self.ending[delta.request_id] = delta.figures

    def flush(self, now: float) -> None:
        for rid in [r for r, parts in self.held.items() if parts and self.due(r) <= now]:
            self._send(rid, {"type": "delta", "message_id": rid, "text": "".join(self.held[rid])})
            self.held[rid] = []
            self.last_sent[rid] = time.time()
        for rid in [r for r in self.ending if not self.held.get(r)]:
            self._send(rid, {"type": "done", "message_id": rid})
            self._close(rid, self.ending.pop(rid))

    def _close(self, rid: str, m: Any) -> None:
        self.held.pop(rid, None)
        if m is None or rid in self.cut:
            self.seen.append(Seen(None, None, 0, 0))
            return
        first, last = self.first_seen[rid], self.last_seen[rid]
        n = m.output_tokens
        self.seen.append(
            Seen(
                ttft=first - m.arrival_time,
                tpot=(last - first) / (n - 1) if n > 1 else None,
                output_tokens=n,
                cached_tokens=m.cached_tokens + m.cached_tokens_redis,
            )
        )

    def next_due(self) -> float | None:
        times = [self.due(r) for r, parts in self.held.items() if parts]
        return min(times) if times else None

    @property
    def busy(self) -> bool:
        return bool(self.ending) or any(self.held.values())

    def close(self) -> None:
        self._out.close()
        self._reader.join(timeout=2)
        self._in.close()


def replay(
    engine: Any,
    workload: list[Request],
    vocab: int,
    flush_ms: int = 0,
    limit_s: float = DEFAULT_TRIAL_LIMIT_S,
) -> list[Any]:
    """Submit each request at its time, step the engine until all are done and the chat
    socket has sent every frame; what the client saw of each request (None: refused).
    At `limit_s` the requests still running are aborted and those not yet sent are
    dropped: both count as missing the targets (`Seen` with no TTFT)."""
    rng = random.Random(1)  # the same prompt ids in every trial
    pending = list(workload)
    refused: list[Any] = []
    running: list[str] = []
    sock = ChatSocket(flush_ms / 1000.0)
    start = time.time()
    stopped = False
    try:
        while pending or engine.has_work() or sock.busy:
            now = time.time() - start
            if now > limit_s and not stopped:
                stopped = True
                refused += [Seen(None, None, 0, 0) for _ in pending]
                pending = []
                sock.cut.update(running)
                for rid in running:
                    engine.abort_request(rid)
            while pending and pending[0].at <= now:
                q = pending.pop(0)
                ids = [rng.randrange(100, vocab) for _ in range(q.prompt_len)]
                sampling = SamplingParams(max_tokens=q.output_len, temperature=0.0, ignore_eos=True)
                try:
                    running.append(engine.add_request(ids, sampling))
                except EngineBusyError:
                    refused.append(None)
            if engine.has_work():
                for d in engine.step():
                    sock.add(d)
                sock.flush(time.time())
                continue
            sock.flush(time.time())
            waits = [0.05]
            if pending:
                waits.append(pending[0].at - (time.time() - start))
            due = sock.next_due()
            if due is not None:
                waits.append(due - time.time())
            time.sleep(max(0.0, min(waits)))
    finally:
        sock.close()
    return sock.seen + refused


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
        "cut": sum(1 for m in finished if m is not None and m.ttft is None),
        "met_targets": len(ok),
        "goodput_rps": len(ok) / wall if wall else 0.0,
        "throughput_tok_s": sum(m.output_tokens for m in finished if m) / wall if wall else 0.0,
        "ttft_p50": percentiles.percentile(ttfts, 50),
        "ttft_p99": percentiles.percentile(ttfts, 99),
        "tpot_p50": percentiles.percentile(tpots, 50),
        "tpot_p99": percentiles.percentile(tpots, 99),
        "cached_tokens": sum(getattr(m, "cached_tokens", 0) for m in finished if m),
        "wall_s": wall,
    }


def configure(engine: Any, base: Any, setting: dict[str, Any]) -> None:
    """Give the engine `setting`'s batching limits and speculation, starting cold: a fresh
    scheduler and speculator, and an empty memory prefix cache.

    These settings live only in the scheduler and the speculator (the model and the KV
    pool do not depend on them), so one loaded model serves the whole sweep."""
    engine.reconfigure(
        dataclasses.replace(
            base,
            max_num_batched_tokens=int(setting["MAX_NUM_BATCHED_TOKENS"]),
            max_num_seqs=int(setting["MAX_NUM_SEQS"]),
            speculative_mode=setting["SPECULATIVE_MODE"],
        )
    )


def _spread(values: list[float | None]) -> dict[str, float | None]:
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(known), "min": min(known), "max": max(known)}


def summarize(setting: dict[str, Any], current: dict[str, Any], runs: list[dict]) -> dict:
    """One setting's row: its runs, and the median with min-max of the main numbers."""
    return {
        "settings": setting,
        "label": describe(setting, current),
        "current": setting == current,
        **{
            k: _spread([r[k] for r in runs])
            for k in ("goodput_rps", "ttft_p50", "tpot_p50", "throughput_tok_s")
        },
        "requests": runs[0]["requests"],
        "runs": runs,
    }


def _params(params: dict[str, Any]) -> tuple[int, int, float, dict[str, list[Any]]]:
    if "grid" in params:
        raise ValueError("'grid' is gone: give 'axes' (each axis's values; one varies at a time)")
    n = int(params.get("requests", 24))
    repeats = int(params.get("repeats", DEFAULT_REPEATS))
    margin = float(params.get("margin", DEFAULT_MARGIN))
    axes = params.get("axes") or DEFAULT_AXES
    if n < 1:
        raise ValueError("requests must be >= 1")
    if repeats < MIN_REPEATS:
        raise ValueError(f"repeats must be >= {MIN_REPEATS}: the winner rule needs a spread")
    if not isinstance(axes, dict):
        raise ValueError("axes must map setting names to lists of values")
    return n, repeats, margin, axes


def run(
    params: dict[str, Any], progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """The sweep's report. `progress` is told before each trial and after the last
    ({"trials_done", "trials", "elapsed_s"}); an exception it raises stops the sweep."""
    from inference.engine.engine import LLMEngine  # torch: only when a tuning job runs

    n, repeats, margin, axes = _params(params)
    current = current_settings()
    candidates = sweep_settings(current, axes)
    order = trial_order(len(candidates), repeats)
    if len(order) > MAX_TRIALS:
        raise ValueError(
            f"{len(candidates)} settings x {repeats} runs is more than {MAX_TRIALS} trials"
        )
    workload = [] if params.get("synthetic") else recorded_workload(n)
    source = "recorded" if workload else "synthetic"
    if not workload:
        workload = synthetic_workload(n, float(params.get("rate", 4.0)))
    workload, compressed = compress(workload, float(params.get("max_span_s", DEFAULT_MAX_SPAN_S)))
    trial_limit = float(params.get("trial_limit_s", DEFAULT_TRIAL_LIMIT_S))
    ttft_target = float(params.get("ttft_target_s", settings.OBS_TUNING_TTFT_S))
    tpot_target = float(params.get("tpot_target_s", settings.OBS_TUNING_TPOT_S))

    # The tier off: a trial must neither restore what an earlier one computed nor fill
    # the real tier with test prompts.
    base = engine_config_from_settings({**{k: current[k] for k in ENGINE_AXES}, "KV_TIER_URL": ""})
    engine = LLMEngine(base)
    started = time.time()
    try:
        vocab = int(engine.runner.model.vocab_size)
        longest = engine.max_model_len - 1
        load = [
            Request(q.at, min(q.prompt_len, longest // 2), min(q.output_len, longest // 2))
            for q in workload
        ]
        # First-touch allocations and kernel set-up, so the first trial does not pay them.
        engine.add_request([100] * 8, SamplingParams(max_tokens=4, temperature=0.0))
        while engine.has_work():
            engine.step()
        runs: list[list[dict]] = [[] for _ in candidates]
        trials: list[dict[str, int]] = []  # as they ran
        for index, repeat in order:
            if progress is not None:
                progress(_progress(len(trials), len(order), started))
            setting = candidates[index]
            trials.append({"setting": index, "repeat": repeat})
            configure(engine, base, setting)
            t0 = time.time()
            seen = replay(engine, load, vocab, int(setting[FLUSH_AXIS]), trial_limit)
            runs[index].append(score(seen, time.time() - t0, ttft_target, tpot_target))
        if progress is not None:
            progress(_progress(len(trials), len(order), started))
    finally:
        engine.close()
    return {
        "workload": source,
        "requests": len(workload),
        "arrivals_compressed_by": compressed,
        "trial_limit_s": trial_limit,
        "targets": {"ttft_s": ttft_target, "tpot_s": tpot_target},
        **verdict_of(current, candidates, runs, margin),
        "trials": trials,
        "wall_s": time.time() - started,
    }


def _progress(done: int, total: int, started: float) -> dict[str, Any]:
    return {"trials_done": done, "trials": total, "elapsed_s": round(time.time() - started, 1)}


def verdict_of(
    current: dict[str, Any],
    candidates: list[dict[str, Any]],
    runs: list[list[dict[str, Any]]],
    margin: float = DEFAULT_MARGIN,
) -> dict[str, Any]:
    """The report's judgement from each setting's runs (`candidates[0]` is the current
    settings; `runs[i]` the `score` of each of its runs)."""
    if not candidates or candidates[0] != current or len(runs) != len(candidates):
        raise ValueError("candidates must start with the current settings, one runs list each")
    repeats = min(len(r) for r in runs)
    rows = [summarize(s, current, r) for s, r in zip(candidates, runs, strict=True)]
    goodputs = [[r["goodput_rps"] for r in row["runs"]] for row in rows]
    ahead = contenders(goodputs, 0, margin)
    won = clear_winner(goodputs, ahead, margin)
    winner = None if won is None else candidates[won]
    if won is None:
        verdict = KEEP_CURRENT
    else:
        w, c = rows[won]["goodput_rps"], rows[0]["goodput_rps"]
        verdict = (
            f"{rows[won]['label']} beats the current settings: goodput {w['min']:.2f}-"
            f"{w['max']:.2f} req/s against {c['min']:.2f}-{c['max']:.2f}"
        )
    return {
        "method": {
            "sweep": "coordinate: one setting changes at a time, the others stay current",
            "repeats": repeats,
            "order": "interleaved",
            "kv_tier": "off",
            "memory_prefix_cache": "emptied before each trial",
            "rule": (
                "a winner's worst goodput run beats the best run of the current settings, "
                f"and of every other setting that beats them, by more than {margin:.0%}"
            ),
            "margin": margin,
        },
        "current": current,
        "rows": rows,
        "winner": winner,
        "verdict": verdict,
        # Every setting that beat the current ones; several and no winner means they tied.
        "contenders": [rows[i]["label"] for i in ahead],
        # What *Apply* applies: the winner, None when the current settings stay.
        "best": winner,
        "env": env_lines(winner) if winner is not None else "",
    }


def apply(best: dict[str, Any] | None) -> None:
    """Restart this process's embedded engine with the chosen settings (requests running
    on the old engine end as aborted) and use its chat flush interval from now on. To keep
    them across restarts, set the env lines."""
    from inference.engine.async_engine import AsyncEngine  # torch: only when applied

    if not best:
        raise RuntimeError("this tuning run named no winner: the current settings stay")
    if settings.ENGINE["MODE"] != "embedded":
        raise RuntimeError("only an embedded engine can be retuned from the dashboard")
    engine_keys = {k: v for k, v in best.items() if k != FLUSH_AXIS}
    set_engine_client(EmbeddedClient(AsyncEngine(engine_config_from_settings(engine_keys))))
    # The next tuning run compares against what now runs.
    settings.ENGINE = {**settings.ENGINE, **engine_keys}
    if FLUSH_AXIS in best:
        settings.CHAT_FLUSH_INTERVAL_MS = int(best[FLUSH_AXIS])
