"""Engine samples over time. The engine's stats() is a snapshot of now (queues, KV
blocks, its last step, running totals); the process that holds the engine client stores
one every OBS_SAMPLE_INTERVAL_S (the `inference.sample_engine` task, on the schedule of
chatapp/jobs/scheduler.py) and refreshes the Prometheus gauges from it.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from chatapp.observability.models import EngineSample
from chatapp.observability.recording import WORKER
from inference import metrics
from inference.catalog import model_name
from inference.client import (
    EngineClient,
    engine_ready,
    get_engine_client,
    loaded_clients,
    loaded_engine_stats,
)

log = logging.getLogger(__name__)
_lock = threading.Lock()
# The engine totals last fed to the Prometheus counters (counters only go up), by
# (worker, total's name).
_last_totals: dict[tuple[str, str], float] = {}
# The engines (`worker` label values) the gauges were last set for, by model.
_engines_seen: dict[str, set[str]] = {}

COUNTERS = {
    "prefix_cache_queries": metrics.prefix_cache_queries,
    "prefix_cache_hits": metrics.prefix_cache_hits,
    "preemptions": metrics.num_preemptions,
    "total_refused": metrics.refused_requests,
    "total_steps": metrics.engine_steps,
    "spec_verifications": metrics.spec_decode_drafts,
}


def sample_fields(s: dict[str, Any]) -> dict[str, Any]:
    total = int(s.get("kv_blocks_total") or 0)
    return {
        "running": int(s.get("running") or 0),
        "waiting": int(s.get("waiting") or 0),
        "batch_size": int(s.get("last_step_batch_size") or 0),
        "step_tokens": int(s.get("last_step_tokens") or 0),
        "step_seconds": float(s.get("last_step_seconds") or 0.0),
        "kv_usage": int(s.get("kv_blocks_used") or 0) / total if total else 0.0,
        "prefix_queries": int(s.get("prefix_cache_queries") or 0),
        "prefix_hits": int(s.get("prefix_cache_hits") or 0),
        "refused": int(s.get("total_refused") or 0),
        "steps": int(s.get("total_steps") or 0),
    }


def engines_of(
    s: dict[str, Any], client: EngineClient | None = None
) -> dict[str, dict[str, Any]] | None:
    """Each engine's own stats by its `worker` label: in distributed mode every live
    worker's, as read by the same stats() call of `client` (default: the default model's)
    that produced `s` (the summed stats); else the one engine's. None when the workers
    could not be read (Redis away)."""
    if s.get("mode") == "distributed":
        if "error" in s:
            return None
        if client is None and engine_ready():
            client = get_engine_client()
        engine = getattr(client, "engine", None)
        per_worker = getattr(engine, "last_worker_stats", None)
        if per_worker is not None:
            return dict(per_worker)
    if "upstream" in s:
        return {metrics.UPSTREAM_WORKER: s}
    return {metrics.EMBEDDED_WORKER: s}


def update_prometheus(
    s: dict[str, Any],
    by_worker: dict[str, dict[str, Any]] | None = None,
    model: str = "",
    client: EngineClient | None = None,
) -> None:
    """Refresh one model's engine gauges and counters (`model`, default: the default
    model's name; `s` from its `client`), one series per engine (`worker` label);
    `by_worker` defaults to engines_of(s, client)."""
    model = model or model_name(settings.ENGINE["MODEL"])
    engines = engines_of(s, client) if by_worker is None else by_worker
    if engines is None:
        return  # nothing known: the series keep their last values until the next sample
    with _lock:
        for worker, ws in engines.items():
            _update_engine(model, worker, ws)
        # A worker gone since the last sample: its queue gauges drop (its counters stay,
        # as counters do).
        for worker in _engines_seen.get(model, set()) - set(engines):
            for gauge in metrics.ENGINE_GAUGES:
                gauge.labels(model, worker).set(0)
                if not metrics.multiprocess():
                    gauge.remove(model, worker)
        _engines_seen[model] = set(engines)


def refresh_prometheus() -> None:
    """Refresh the gauges of every model whose client this process holds."""
    for name, client in loaded_clients().items():
        try:
            stats = client.stats()
        except Exception:
            log.exception("engine stats of %s failed", name)
            continue
        update_prometheus(stats, model=name, client=client)


def _update_engine(model: str, worker: str, s: dict[str, Any]) -> None:
    f = sample_fields(s)
    metrics.num_requests_running.labels(model, worker).set(f["running"])
    metrics.num_requests_waiting.labels(model, worker).set(f["waiting"])
    metrics.kv_cache_usage.labels(model, worker).set(f["kv_usage"])
    metrics.step_tokens.labels(model, worker).set(f["step_tokens"])
    metrics.step_batch_size.labels(model, worker).set(f["batch_size"])
    for key, counter in COUNTERS.items():
        counter.labels(model, worker).inc(_growth(worker, key, s))
    # The tokens-per-step histogram: add each bucket's new steps. prometheus_client
    # observes one value at a time, so the buckets are advanced directly.
    hist = metrics.iteration_tokens.labels(model, worker)
    keys = [f"step_tokens_le_{b}" for b in metrics.ITERATION_TOKEN_BUCKETS]
    for bucket, key in zip(hist._buckets, [*keys, "step_tokens_le_inf"], strict=True):
        bucket.inc(_growth(worker, key, s))
    hist._sum.inc(_growth(worker, "step_tokens_sum", s))
    for key in [k for k in s if k.startswith("step_seconds_")]:
        kind = key.removeprefix("step_seconds_")
        metrics.engine_step_seconds.labels(model, worker, kind).inc(_growth(worker, key, s))


def _growth(worker: str, key: str, s: dict[str, Any]) -> float:
    """How much an engine total grew since the last sample (a restarted engine starts
    its totals again from 0); counts and seconds."""
    now = float(s.get(key) or 0)
    before = _last_totals.get((worker, key), 0)
    _last_totals[(worker, key)] = now
    return now - before if now >= before else now


def take_sample() -> EngineSample | None:
    """Store the default model's engine stats (the dashboard's); refresh every model's
    gauges."""
    s = loaded_engine_stats()
    refresh_prometheus()
    if s is None:
        return None
    return EngineSample.objects.create(at=datetime.now(UTC), worker=WORKER, **sample_fields(s))
