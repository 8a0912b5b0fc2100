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
