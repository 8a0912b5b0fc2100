"""The engine on a CUDA device: the same tokens as on the CPU. Skipped, with the reason
printed (-ra), where no CUDA device exists."""

from __future__ import annotations

import pytest
import torch

from inference.engine.sampling_params import SamplingParams
from tests.engine.conftest import run_to_completion, token_ids_of

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine"
)


def test_cuda_engine_gives_the_cpu_engines_greedy_tokens(make_engine):
    prompts = [[5 + i, 17, 300 + 7 * i, 42] * (3 + i) for i in range(4)]

    def generate(device: str) -> dict[str, list[int]]:
        engine = make_engine(device=device, quantization="none")
        for i, p in enumerate(prompts):
            engine.add_request(p, SamplingParams(max_tokens=16, temperature=0.0), f"r{i}")
        return {k: token_ids_of(v) for k, v in run_to_completion(engine).items()}

    assert generate("cuda") == generate("cpu")


def test_auto_settings_resolve_to_bfloat16_without_cpu_weight_formats(make_engine):
    engine = make_engine(device="cuda", dtype="auto", quantization="auto")
    assert engine.runner.dtype == torch.bfloat16
    assert engine.runner.quantization == "none"
    assert engine.runner.model.native is None


def test_cuda_graphs_replay_decode_steps_with_the_eager_greedy_tokens(make_engine):
    """Five streams: steps of 5 rows replay the 8-row graph, three rows of it padding."""
    from inference.engine.cuda_graphs import CudaGraphStep

    prompts = [[5 + i, 17, 300 + 7 * i, 42] * (3 + i) for i in range(5)]

    def generate(mode: str) -> tuple[dict[str, list[int]], object]:
        engine = make_engine(device="cuda", quantization="none", compile=mode)
        for i, p in enumerate(prompts):
            engine.add_request(p, SamplingParams(max_tokens=24, temperature=0.0), f"r{i}")
        return {k: token_ids_of(v) for k, v in run_to_completion(engine).items()}, engine

    graphed, engine = generate("on")
    step = engine.runner.compiled  # type: ignore[attr-defined]
    assert isinstance(step, CudaGraphStep) and step.steps > 0
    # The padding rows' block is past the ones the KV manager hands out.
    assert step.scratch == engine.kv.num_blocks  # type: ignore[attr-defined]
    assert engine.runner.kv_caches[0].shape[1] == engine.kv.num_blocks + 1  # type: ignore[attr-defined]
    assert graphed == generate("off")[0]


def test_auto_captures_cuda_graphs_on_cuda(make_engine):
    from inference.engine.cuda_graphs import CudaGraphStep

    engine = make_engine(device="cuda", quantization="auto", dtype="auto")
    assert isinstance(engine.runner.compiled, CudaGraphStep)
    assert engine.runner.compiled.graphs
