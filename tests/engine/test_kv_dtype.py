"""The KV pool's element type (EngineConfig.kv_dtype): what `auto` resolves to, the settings
refused, and a float16 pool against a float32 one on the default model, teacher-forced
through the native path's decode steps (K/V written by them, read by their attention)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from inference.engine import EngineConfig, SamplingParams
from inference.engine.engine import LLMEngine
from inference.engine.model_runner import resolve_kv_dtype
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence
from tests.engine.conftest import needs_kernels

CPU = torch.device("cpu")


@needs_kernels
def test_auto_is_float16_for_quantized_float32_models_on_a_cpu_with_the_kernels():
    for quantization in ("hybrid", "int4", "int8", "fp16"):
        assert resolve_kv_dtype("auto", CPU, torch.float32, quantization) == torch.float16


def test_auto_keeps_the_model_dtype_on_the_exact_path_and_elsewhere():
    assert resolve_kv_dtype("auto", CPU, torch.float32, "none") == torch.float32
    assert resolve_kv_dtype("auto", CPU, torch.bfloat16, "hybrid") == torch.bfloat16
    cuda = torch.device("cuda")
    assert resolve_kv_dtype("auto", cuda, torch.bfloat16, "none") == torch.bfloat16


def test_a_set_dtype_is_taken_and_the_ones_the_kernels_cannot_read_are_refused():
    assert resolve_kv_dtype("float32", CPU, torch.float32, "hybrid") == torch.float32
    assert resolve_kv_dtype("float16", CPU, torch.float32, "none") == torch.float16
    assert resolve_kv_dtype("bfloat16", CPU, torch.bfloat16, "none") == torch.bfloat16
    with pytest.raises(ValueError, match="bfloat16 needs a bfloat16 model"):
        resolve_kv_dtype("bfloat16", CPU, torch.float32, "hybrid")
    with pytest.raises(ValueError, match="kv_dtype must be auto"):
        resolve_kv_dtype("fp8", CPU, torch.float32, "hybrid")


@needs_kernels
def test_int8_is_taken_on_a_cpu_with_the_kernels_and_refused_elsewhere():
    assert resolve_kv_dtype("int8", CPU, torch.float32, "hybrid") == torch.int8
    assert resolve_kv_dtype("int8", CPU, torch.float32, "none") == torch.int8
    with pytest.raises(ValueError, match="int8 needs a CPU where the native kernels load"):
        resolve_kv_dtype("int8", torch.device("cuda"), torch.bfloat16, "none")


@needs_kernels
def test_the_engine_sizes_its_pool_by_the_element_type(tiny_model_path):
    def engine(kv_dtype: str) -> LLMEngine:
        return LLMEngine(
            EngineConfig(model=str(tiny_model_path), dtype="float32", quantization="none",
                         kv_cache_memory_mb=8, kv_dtype=kv_dtype)
        )  # fmt: skip

    wide, half, int8 = engine("float32"), engine("float16"), engine("int8")
    assert wide.runner.kv_caches[0].dtype == torch.float32
    assert half.runner.kv_caches[0].dtype == torch.float16
    # The same memory holds twice the blocks.
    assert half.runner.num_blocks == 2 * wide.runner.num_blocks
    assert half.stats()["kv_dtype"] == "float16"
    # int8: a row of head_dim values and its 4-byte scale, against 4 bytes a value.
    d = wide.runner.model.head_dim
    assert int8.runner.kv_caches[0].shape[-1] == d + 4
    assert int8.runner.num_blocks // (4 * d // (d + 4)) >= wide.runner.num_blocks
    assert int8.stats()["kv_dtype"] == "int8"


QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three fruits.",
]


# Mean KL(float32 pool || narrower pool) allowed, by pool and path (measured: float16 about
# 1e-6 and 3.3e-3, int8 2.1e-3 and 5.5e-3): the exact path's K/V differ by float16's
# rounding alone; on the native path each layer rounds its activations to 8 bits after it,
# and a value moved across a rounding edge moves a step of 1/254 of its block's largest, as
# two float32 runs differing in their last bits would (hybrid against float32 weights:
# ~2e-3, python -m inference.bench.quality). An int8 pool's rows are rounded to 1/127 of
# their largest value: about the error 4-bit weights add.
KL_LIMIT = {
    ("float16", "none"): 1e-5,
    ("float16", "hybrid"): 1e-2,
    ("int8", "none"): 1e-2,
    ("int8", "hybrid"): 2e-2,
}
# Top-two logit gaps below which a position counts as a near-tie, whose argmax may flip.
# The native path's 8-bit roundings move a logit by up to ~1.2 between the pools (on one AVX512
# CPU one of 72 positions flipped at a gap of 0.12, none past 0.2); the exact path's by
# ~0.02 with a float16 pool; an int8 pool flipped 1-2 of 72, at gaps up to 0.135.
NEAR_TIE = {
    ("float16", "none"): 0.1,
    ("float16", "hybrid"): 0.25,
    ("int8", "none"): 0.25,
    ("int8", "hybrid"): 0.25,
}


def _pool_logits(real_model_path: Path, quantization: str, kv_dtype: str) -> torch.Tensor:
    """Each question then a fixed reply, the four decoded together one token a step on a
    fresh engine with this pool: every step's logits, [steps, seqs, vocab]."""
    tok = AutoTokenizer.from_pretrained(real_model_path)
    reply = tok.encode(" The answer takes a few words, then a few more, and then it ends here.")
    seqs_tokens = []
    for q in QUESTIONS:
        text = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        seqs_tokens.append((tok.encode(text), reply))
    engine = LLMEngine(
        EngineConfig(model=str(real_model_path), dtype="float32", quantization=quantization,
                     kv_dtype=kv_dtype, kv_cache_memory_mb=64, kv_tier_url="")
    )  # fmt: skip
    runner = engine.runner
    assert (runner.model.native is not None) == (quantization == "hybrid")
    assert runner.kv_caches[0].dtype == getattr(torch, kv_dtype)
    seqs = [
        Sequence(f"s{i}", prompt + cont, SamplingParams())
        for i, (prompt, cont) in enumerate(seqs_tokens)
    ]
    for seq, (prompt, _) in zip(seqs, seqs_tokens, strict=True):
        assert engine.kv.allocate(seq, len(prompt))
        runner.run(ScheduledBatch([seq], [len(prompt)]))
        seq.num_computed_tokens = len(prompt)
    steps = []
    for _ in range(len(reply)):
        for seq in seqs:
            assert engine.kv.allocate(seq, seq.num_computed_tokens + 1)
        _, out = runner.run(ScheduledBatch(seqs, [1] * len(seqs)), all_logits=True)
        steps.append(out.float())
        for seq in seqs:
            seq.num_computed_tokens += 1
    return torch.stack(steps)


@pytest.fixture(scope="module")
def float32_pool_logits(real_model_path: Path) -> Callable[[str], torch.Tensor]:
    """The float32 pool's logits by path, computed once: the float16 and int8 cases of a
    path compare with the same reference (a fresh engine on the same inputs each time)."""
    made: dict[str, torch.Tensor] = {}

    def of(quantization: str) -> torch.Tensor:
        if quantization not in made:
            made[quantization] = _pool_logits(real_model_path, quantization, "float32")
        return made[quantization]

    return of


@pytest.mark.slow
@needs_kernels
@pytest.mark.parametrize("quantization", ["none", "hybrid"])
@pytest.mark.parametrize("narrow", ["float16", "int8"])
def test_a_narrower_pool_gives_the_float32_pools_next_tokens(
    real_model_path, float32_pool_logits, quantization, narrow
):
    """Each question then a fixed reply, the four decoded together one token a step (with
    hybrid the native path's steps, exact weights the torch path's paged kernel: their K/V
    written to the pool and attended over from it): the next-token distributions of the
    two pools agree (mean KL under KL_LIMIT) and so does their argmax wherever the float32
    pool's top two logits are more than a near-tie apart."""
    wide = float32_pool_logits(quantization)
    half = _pool_logits(real_model_path, quantization, narrow)
    kl = torch.nn.functional.kl_div(
        half.log_softmax(-1), wide.log_softmax(-1), log_target=True, reduction="none"
    ).sum(-1)
    assert float(kl.mean()) < KL_LIMIT[narrow, quantization], float(kl.mean())
    top2 = wide.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > NEAR_TIE[narrow, quantization]
    assert clear.float().mean() > 0.5  # the check below is about most positions
    assert torch.equal(half.argmax(-1)[clear], wide.argmax(-1)[clear])
