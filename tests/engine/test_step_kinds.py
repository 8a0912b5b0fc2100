"""A step's kind, which the engine's step seconds are counted by (stats'
step_seconds_<kind>, /metrics' chatapp:engine_step_seconds_total{kind})."""

from __future__ import annotations

from inference.engine.engine import STEP_KINDS, step_kind
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence


def batch(decodes: int, chunks: int) -> ScheduledBatch:
    seqs = [Sequence(f"r{i}", [1, 2, 3], SamplingParams()) for i in range(decodes + chunks)]
    return ScheduledBatch(seqs, [1] * decodes + [3] * chunks, num_decodes=decodes)


def test_decode_only_mixed_and_prompt_only_steps() -> None:
    assert step_kind(batch(4, 0)) == "decode"
    assert step_kind(batch(4, 1)) == "mixed"
    assert step_kind(batch(0, 2)) == "prompt"
    assert STEP_KINDS == ("decode", "mixed", "prompt")
