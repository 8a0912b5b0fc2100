"""Every registered architecture against transformers, on tiny random-weight models made
from a config: greedy tokens equal transformers' in exact mode (float32, no quantization,
no speculation), in a batch and across a second turn over the first's cached KV; the
default 4-bit mode stays close to exact; what the engine cannot serve is refused by name."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.errors import UnsupportedModelError
from inference.engine.layers.linear import BiasedLinear
from inference.engine.models import load_config, load_model, model_class
from inference.engine.models.reference import PAGE, render
from inference.engine.models.registry import FAMILIES
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence
from tests.architectures import ARCHITECTURES, WINDOW, build_tiny
from tests.engine.conftest import greedy, run_to_completion, token_ids_of

NEW_TOKENS = 32

Build = Callable[..., Path]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, real_model_path: Path) -> Build:
    """build(name, **overrides): a tiny model of that architecture, built once per settings."""
    built: dict[str, Path] = {}

    def build(name: str, **overrides: Any) -> Path:
        key = f"{name}{sorted(overrides.items())}"
        if key not in built:
            folder = tmp_path_factory.mktemp(f"tiny-{name}")
            built[key] = build_tiny(name, folder, real_model_path, **overrides)
        return built[key]

    return build


def _engine(folder: Path, **overrides: object) -> LLMEngine:
    settings: dict[str, object] = {
        "model": str(folder),
        "dtype": "float32",
        "quantization": "none",
        "speculative_mode": "",
        "kv_cache_memory_mb": 8,
        "block_size": 8,
    }
    settings.update(overrides)
    return LLMEngine(EngineConfig(**settings))  # type: ignore[arg-type]


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


def _hf_greedy(folder: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = model.generate(
                torch.tensor([p]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                pad_token_id=0,
            )  # fmt: skip
            out.append(ids[0, len(p) :].tolist())
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_greedy_tokens_equal_transformers_in_a_batch_and_across_a_second_turn(tiny, name):
    folder = tiny(name)
    # Longer than the sliding window (where the family has one), chunked by a small budget.
    prompts = [_prompt(n, seed=i) for i, n in enumerate((3 * WINDOW, 23, 2 * WINDOW + 5))]
    engine = _engine(folder, max_num_batched_tokens=32)
    for i, p in enumerate(prompts):
        engine.add_request(p, greedy(NEW_TOKENS, ignore_eos=True), request_id=f"r{i}")
    out = run_to_completion(engine)
    ours = [token_ids_of(out[f"r{i}"]) for i in range(len(prompts))]

    turn2 = prompts[0] + ours[0] + _prompt(7, seed=99)
    engine.add_request(turn2, greedy(NEW_TOKENS, ignore_eos=True), request_id="t2")
    second = run_to_completion(engine)["t2"]
    assert second[-1].figures.cached_tokens > len(prompts[0]), "turn 2 reused turn 1's KV"

    theirs = _hf_greedy(folder, [*prompts, turn2], NEW_TOKENS)
    assert ours == theirs[:-1]
    assert token_ids_of(second) == theirs[-1]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_an_int8_pool_serves_every_architectures_attention(tiny, name):
    """Windowed and soft-capped layers too (the torch paths' reads of the pool): over an
    int8 pool the first two greedy tokens after a chunked prompt longer than the window
    (the first reads the earlier chunks' K/V from the pool, the second a decode's) are the
    float32 pool's, but for a near-tie. These random models' attention is sharp, and their
    later tokens part at the int8 rows' rounding within a few steps; a misread pool would
    part at the first token of most prompts."""
    folder = tiny(name)
    prompts = [_prompt(3 * WINDOW + i, seed=i) for i in range(6)]
    tokens = {}
    for kv_dtype in ("float32", "int8"):
        engine = _engine(folder, max_num_batched_tokens=16, kv_dtype=kv_dtype)
        for i, p in enumerate(prompts):
            engine.add_request(p, greedy(2, ignore_eos=True), request_id=f"r{i}")
        out = run_to_completion(engine)
        tokens[kv_dtype] = [token_ids_of(out[f"r{i}"]) for i in range(len(prompts))]
    same = sum(a == b for a, b in zip(tokens["int8"], tokens["float32"], strict=True))
    assert same >= len(prompts) - 1, tokens


def test_the_registry_names_each_family_by_its_config(tiny):
    for name in ARCHITECTURES:
        family = model_class(load_config(str(tiny(name)))).family
        assert family == {"mistral": "llama"}.get(name, name)


# -- refusals ---------------------------------------------------------------------------


def _write_config(folder: Path, **fields: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


def test_an_unknown_architecture_is_refused_naming_it_and_the_supported_ones(tmp_path):
    folder = _write_config(
        tmp_path / "mamba", model_type="mamba", architectures=["MambaForCausalLM"]
    )
    with pytest.raises(UnsupportedModelError) as err:
        _engine(folder)
    msg = str(err.value)
    assert "'mamba' (MambaForCausalLM) is not supported" in msg
    assert "supported: gemma2, gemma3_text, llama, mistral, phi3, qwen2, qwen3" in msg


def test_a_model_type_transformers_does_not_know_is_refused_by_name(tmp_path):
    folder = _write_config(tmp_path / "x", model_type="frobnicator", architectures=["FrobLM"])
    with pytest.raises(UnsupportedModelError, match=r"'frobnicator' \(FrobLM\) is not supported"):
        _engine(folder)


def test_an_unknown_rope_type_is_refused_by_name(tiny):
    folder = tiny("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(UnsupportedModelError, match=r"rope type 'dynamic' .* not supported"):
        _engine(folder)


def _rewrite_weights(src: Path, dst: Path, change: Callable[[dict], None]) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    tensors = load_file(src / "model.safetensors")
    change(tensors)
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_a_missing_tensor_is_refused_naming_it(tiny, tmp_path):
    def drop(tensors: dict) -> None:
        del tensors["model.layers.1.self_attn.k_proj.weight"]

    folder = _rewrite_weights(tiny("llama"), tmp_path / "missing", drop)
    with pytest.raises(
        UnsupportedModelError, match=r"'layers.1.self_attn.k_proj.weight' is missing"
    ):
        _engine(folder)


def test_an_unknown_weight_type_is_refused_naming_it(tiny, tmp_path):
    def to_fp8(tensors: dict) -> None:
        name = "model.layers.0.mlp.up_proj.weight"
        tensors[name] = tensors[name].to(torch.float8_e4m3fn)

    folder = _rewrite_weights(tiny("llama"), tmp_path / "fp8", to_fp8)
    with pytest.raises(UnsupportedModelError, match=r"weight type float8_e4m3fn .* not supported"):
        _engine(folder)


# -- the default 4-bit mode against exact -----------------------------------------------


def _next_token_logits(engine: LLMEngine, prompt: list[int]) -> torch.Tensor:
    """The logits after `prompt`: all but its last token as a prompt, the last as a decode
    step (the native path's step, where the model has one)."""
    seq = Sequence("p", prompt, SamplingParams())
    assert engine.kv.allocate(seq, len(seq))
    engine.runner.run(ScheduledBatch([seq], [len(seq) - 1]))
    seq.num_computed_tokens = len(seq) - 1
    _, logits = engine.runner.run(ScheduledBatch([seq], [1]))
    engine.kv.free(seq)
    return logits[0]


# Random tiny models have near-ties everywhere, so 4-bit weights flip many of their next
# tokens: measured agreement with exact mode was 2/24 (phi3) to 17/24 (gemma2, gemma3) on
# these prompts, and mean KL(exact || 4-bit) 0.05 to 0.43 nats. A model that is wrong
# (another seed's weights, the same architecture) scores 2.4 to 2.6 nats and agrees on
# none: the KL bound is what separates a lossy product from a wrong one.
MIN_AGREEMENT = 1 / 24
MAX_MEAN_KL = 0.8
# Families whose every layer is Llama's: the default mode takes the native C path for them.
NATIVE = {"llama", "phi3", "qwen2", "qwen3"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_the_default_quantized_mode_stays_close_to_exact(tiny, name):
    folder = tiny(name)
    exact = _engine(folder)
    quantized = _engine(folder, dtype="auto", quantization="auto")
    assert quantized.runner.quantization == "hybrid"
    assert (quantized.runner.model.native is not None) == (name in NATIVE)
    prompts = [_prompt(5 + 3 * i, seed=100 + i) for i in range(24)]
    agree, kls = 0, []
    for p in prompts:
        a, b = _next_token_logits(exact, p), _next_token_logits(quantized, p)
        agree += int(a.argmax() == b.argmax())
        kls.append(F.kl_div(b.log_softmax(-1), a.log_softmax(-1), reduction="sum", log_target=True))
    assert agree / len(prompts) >= MIN_AGREEMENT
    assert float(torch.stack(kls).mean()) <= MAX_MEAN_KL


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_the_native_path_computes_what_the_torch_path_does(tiny, name):
    """The C layers (decode_layer.c) against the torch path on the same blocks: the same
    next-token logits but where an activation's 8-bit rounding flips (~1e-2 of the largest
    logit, measured), where a missing step (Qwen3's q/k norms, Qwen2's biases left out) is
    ~1 off."""
    quantized = _engine(tiny(name), dtype="auto", quantization="auto")
    model = quantized.runner.model
    native = model.native
    assert native is not None
    g = torch.Generator().manual_seed(0)
    for layer in model.layers:
        if isinstance(layer.qkv, BiasedLinear):
            # A tiny model's biases are zeros: made to count, in place (the C layer holds
            # their address).
            layer.qkv.bias.normal_(0, 1.0, generator=g)
    diffs = []
    for i in range(6):
        p = _prompt(5 + 3 * i, seed=100 + i)
        a = _next_token_logits(quantized, p)
        model.native = None
        b = _next_token_logits(quantized, p)
        model.native = native
        diffs.append(float((a - b).abs().max() / b.abs().max()))
    assert sorted(diffs)[len(diffs) // 2] <= 1e-4, diffs
    assert max(diffs) <= 0.05, diffs


def test_the_models_page_lists_what_the_registries_hold() -> None:
    """docs/models.md's tables are the registries' (python -m inference.engine.models.reference
    writes them): a family or weight type added or removed shows on the page."""
    page = PAGE.read_text()
    assert render(page) == page, (
        "docs/models.md is stale: python -m inference.engine.models.reference"
    )
    for family in FAMILIES:
        assert f"| {family.family} |" in page


def test_start_up_logs_one_line_per_model_saying_what_it_is_and_what_serves_it(
    tiny: Build, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tiny("qwen3")
    with caplog.at_level(logging.INFO, logger="inference.engine.models"):
        load_model(str(folder))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model ")]
    assert lines == [
        f"model {folder}: Qwen3ForCausalLM (qwen3), safetensors fp32, context 1024; "
        "served by quantization none, torch products"
    ]
