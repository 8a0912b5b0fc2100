"""A structured request's grammar compiles off the event loop: while one compiles (up to a
second or more for a schema with many patterned strings), other streams' deltas keep
arriving on the loop."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import torch

from inference.engine import AsyncEngine, EngineConfig, SamplingParams


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


def slow_schema() -> str:
    """40 strings, each with its own pattern: xgrammar takes most of a second on it."""
    props = {f"f{i}": {"type": "string", "pattern": f"[a-z]{{{i % 5 + 1},{i % 7 + 6}}}"}
             for i in range(40)}  # fmt: skip
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


@pytest.fixture
def engine(tiny_model_path):
    eng = AsyncEngine(
        EngineConfig(
            model=str(tiny_model_path), dtype="float32", quantization="none", kv_cache_memory_mb=8
        )
    )
    yield eng
    eng.shutdown()


async def test_other_streams_keep_flowing_while_a_schema_compiles(engine):
    arrivals: list[float] = []
    flowing = asyncio.Event()

    async def steady() -> None:
        plain = SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)
        async for _ in engine.generate(_prompt(16, 1), plain, request_id="steady"):
            arrivals.append(time.perf_counter())
            if len(arrivals) == 5:
                flowing.set()

    task = asyncio.create_task(steady())
    await flowing.wait()
    structured = SamplingParams(
        max_tokens=4, temperature=0.0, structured="json_schema", structured_spec=slow_schema()
    )
    start = time.perf_counter()
    stream = engine.generate(_prompt(8, 2), structured, request_id="schema")
    await stream.__anext__()  # after the compile (and the vocabulary read before it)
    ready = time.perf_counter()
    await stream.aclose()
    engine.abort("steady")
    await task
    during = [t for t in arrivals if start <= t <= ready]
    gaps = [b - a for a, b in zip([start, *during], [*during, ready], strict=True)]
    print(f"compile window {ready - start:.3f} s, largest gap {max(gaps):.3f} s, "
          f"{len(during)} deltas in it")  # fmt: skip
    # On the loop, the compile would hold every delta back until it ended: one gap as
    # long as the window. Off it, the steady stream keeps coming.
    assert len(during) >= 5
    assert max(gaps) < (ready - start) / 2
