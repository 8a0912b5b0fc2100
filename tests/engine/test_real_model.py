"""The default model (SmolLM2-135M-Instruct) against transformers. Slow: loads real weights."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from inference.engine import EngineConfig, SamplingParams
from inference.engine.engine import LLMEngine

from .conftest import run_to_completion, text_of, token_ids_of

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three fruits.",
]
# Top-2 logit gaps below this are near-ties: float summation order can flip them.
NEAR_TIE = 0.1


@pytest.fixture(scope="module")
def tokenizer(real_model_path):
    return AutoTokenizer.from_pretrained(real_model_path)


@pytest.fixture(scope="module")
def engine(real_model_path):
    return LLMEngine(
        EngineConfig(
            model=str(real_model_path), dtype="float32", quantization="none", kv_cache_memory_mb=512
        )
    )


def _chat(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(text)


def test_capital_of_france_is_paris(engine, tokenizer):
    engine.add_request(
        _chat(tokenizer, QUESTIONS[0]), SamplingParams(max_tokens=30, temperature=0), "q"
    )
    out = run_to_completion(engine)["q"]
    assert text_of(out) == "The capital of France is Paris."
    assert out[-1].finish_reason == "stop"
    assert token_ids_of(out)[-1] == 2  # the raw eos id is returned, its text is not


def test_greedy_equals_transformers_up_to_the_first_near_tie(engine, tokenizer, real_model_path):
    hf = LlamaForCausalLM.from_pretrained(real_model_path, dtype=torch.float32).eval()
    prompts = {f"q{i}": _chat(tokenizer, q) for i, q in enumerate(QUESTIONS)}
    for rid, p in prompts.items():  # all four decode in one batch
        engine.add_request(p, SamplingParams(max_tokens=48, temperature=0), rid)
    out = run_to_completion(engine)
    for rid, p in prompts.items():
        ours = token_ids_of(out[rid])
        ref = hf.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            max_new_tokens=48,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
        theirs = ref.sequences[0, len(p) :].tolist()
        for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            if a != b:
                top2 = torch.topk(ref.scores[i][0], 2).values
                gap = float(top2[0] - top2[1])
                assert gap < NEAR_TIE, f"{rid}: token {i} differs with a clear gap {gap:.3f}"
                break
        else:
            assert ours == theirs, rid


def test_default_settings_also_answer_paris(real_model_path, tokenizer):
    """The default config: on this CPU 4-bit weights for small steps, fp16 for the rest."""
    fast = LLMEngine(EngineConfig(model=str(real_model_path), kv_cache_memory_mb=512))
    fast.add_request(
        _chat(tokenizer, QUESTIONS[0]), SamplingParams(max_tokens=30, temperature=0), "q"
    )
    assert text_of(run_to_completion(fast)["q"]) == "The capital of France is Paris."
