"""Fixtures: a tiny random-weight llama (built once per session) and engines over it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from inference.engine import kernels
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.kernels import build
from inference.engine.outputs import Delta
from inference.engine.sampling_params import SamplingParams
from inference.model_files import default_model_path
from tests.tiny_model import build_tiny_llama

# What a C edit left unbuilt is built before the tests ask for the kernels (a setup step, as
# in scripts/setup.sh: the engine itself never compiles).
build.build(say=lambda _: None)
_NO_KERNELS = (
    "the native kernels are not built here (python -m inference.engine.kernels.build says why)"
)


def _needs_kernels() -> pytest.MarkDecorator:
    """Skips a test of the kernels where they are not built; in CI (CI=true) that fails it:
    a run that compiled nothing must not pass."""
    if kernels.load() is not None:
        return pytest.mark.skipif(False, reason="the kernels are built")
    if os.environ.get("CI") == "true":
        return pytest.mark.usefixtures("fail_without_kernels")
    return pytest.mark.skip(reason=_NO_KERNELS)


needs_kernels = _needs_kernels()


@pytest.fixture
def fail_without_kernels() -> None:
    pytest.fail(f"CI: {_NO_KERNELS}")


def skip_without_kernels() -> None:
    """needs_kernels inside a test, for one case of a parametrized one."""
    if kernels.load() is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: {_NO_KERNELS}")
        pytest.skip(_NO_KERNELS)


@pytest.fixture(scope="session")
def real_model_path() -> Path:
    path = default_model_path()
    if not (path / "config.json").is_file():
        pytest.skip(f"the default model is not converted at {path}")
    return path


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory, real_model_path: Path) -> Path:
    """A 2-layer llama with random weights and the real tokenizer.

    A larger init range than the default keeps its next-token distributions peaked, so
    greedy decoding has clear winners and float32 rounding cannot flip them.
    """
    return build_tiny_llama(
        tmp_path_factory.mktemp("tiny-llama"),
        real_model_path,
        max_position_embeddings=1024,
        initializer_range=0.2,
    )


@pytest.fixture(scope="session")
def hf_tiny(tiny_model_path: Path) -> LlamaForCausalLM:
    model = LlamaForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    return model.eval()


@pytest.fixture
def make_engine(tiny_model_path: Path) -> Callable[..., LLMEngine]:
    def make(**overrides: object) -> LLMEngine:
        settings: dict[str, object] = {
            "model": str(tiny_model_path),
            "dtype": "float32",
            "quantization": "none",  # the exact path: compared with transformers
            "kv_cache_memory_mb": 8,
        }
        settings.update(overrides)
        return LLMEngine(EngineConfig(**settings))  # type: ignore[arg-type]

    return make


def run_to_completion(engine: LLMEngine, max_steps: int = 10_000) -> dict[str, list[Delta]]:
    """Step until idle; the deltas of every request, by request id."""
    out: dict[str, list[Delta]] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return out
        for delta in engine.step():
            out.setdefault(delta.request_id, []).append(delta)
    raise AssertionError("the engine did not go idle")


def token_ids_of(deltas: list[Delta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


def greedy(max_tokens: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)  # type: ignore[arg-type]


def run_in_avx2_build(code: str) -> None:
    """Runs `code` in a Python process whose native kernels are built for AVX2 alone
    (ENGINE_KERNELS_AVX512=0): the kernels' 256-bit paths, which a CPU with AVX512 builds
    only when asked, checked wherever the suite runs. The code prints 'agreed' at its end."""
    env = {**os.environ, "ENGINE_KERNELS_AVX512": "0"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0 and "agreed" in done.stdout, done.stderr[-2000:]
