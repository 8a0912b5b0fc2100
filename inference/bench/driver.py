"""Drive our engine through a workload step by step and collect per-request figures.

Requests arrive by step number (not wall time) so a run is repeatable: "the long prompt
arrives at step 10" means the same thing on a fast and a slow machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inference.engine.engine import LLMEngine
from inference.engine.errors import EngineBusyError
from inference.engine.outputs import RequestFigures
from inference.engine.sampling_params import SamplingParams


@dataclass
class Arrival:
    step: int
    request_id: str
    prompt: list[int]
    sampling: SamplingParams


@dataclass
class Finished:
    figures: RequestFigures
    token_ids: list[int]
    finish_reason: str | None
    arrival_step: int


@dataclass
class RunResult:
    finished: dict[str, Finished] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    wall: float = 0.0
    steps: int = 0
    peak_rss_mb: float = 0.0


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def drive(
    engine: LLMEngine,
    arrivals: list[Arrival],
    on_finish: Callable[[str, Finished, int], list[Arrival]] | None = None,
    watch_memory: bool = False,
) -> RunResult:
    """Run until every request is done. on_finish may queue follow-ups (next chat turn)."""
    pending = sorted(arrivals, key=lambda a: a.step)
    result = RunResult()
    tokens: dict[str, list[int]] = {}
    arrived_at: dict[str, int] = {}
    step = 0
    start = time.perf_counter()
    while pending or engine.has_work():
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            try:
                engine.add_request(a.prompt, a.sampling, request_id=a.request_id)
                tokens[a.request_id] = []
                arrived_at[a.request_id] = a.step
            except EngineBusyError:
                result.refused.append(a.request_id)
        if not engine.has_work():
            step = pending[0].step if pending else step
            continue
        for d in engine.step():
            tokens[d.request_id].extend(d.token_ids)
            if d.finished:
                assert d.figures is not None  # a finished delta carries its figures
                done = Finished(
                    d.figures, tokens.pop(d.request_id), d.finish_reason, arrived_at[d.request_id]
                )
                result.finished[d.request_id] = done
                if on_finish is not None:
                    for nxt in on_finish(d.request_id, done, step):
                        pending.append(nxt)
                    pending.sort(key=lambda a: a.step)
        step += 1
        if watch_memory:
            result.peak_rss_mb = max(result.peak_rss_mb, rss_mb())
    result.wall = time.perf_counter() - start
    result.steps = step
    return result
