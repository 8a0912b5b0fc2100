"""Where our server's step time goes, read from its /metrics: the engine's step seconds by
kind (`chatapp:engine_step_seconds_total{kind=...}`, docs/observability.md) summed over
models and engine workers, before and after a run; their difference split into shares of
decode-only steps, mixed steps (decodes beside prompt chunks) and prompt-only chunks."""

from __future__ import annotations

from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

METRIC = "chatapp:engine_step_seconds"
KINDS = ("decode", "mixed", "prompt")


def step_seconds(text: str) -> dict[str, float]:
    """The step seconds by kind in a /metrics text (summed over the other labels); {}
    where the server reports none (a checkout from before the metric)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != METRIC:
            continue
        for sample in family.samples:
            if sample.name == f"{METRIC}_total":
                kind = sample.labels.get("kind", "")
                out[kind] = out.get(kind, 0.0) + sample.value
    return out


def read(url: str, token: str) -> dict[str, float]:
    """step_seconds() of the server at `url` (its base URL), read with a bearer token."""
    answer = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    answer.raise_for_status()
    return step_seconds(answer.text)


def shares(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What each kind took of the step time between two readings, and that time
    (`step_s`); {} when none passed or the server reports none."""
    grown = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in KINDS}
    total = sum(grown.values())
    if not after or total <= 0:
        return {}
    return {**{k: v / total for k, v in grown.items()}, "step_s": total}
