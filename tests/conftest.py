"""Fixtures shared by the whole suite.

`tiny_model_dir` is a random-weight llama with the default model's tokenizer, built
once per test session: it runs the real engine code in milliseconds. Tests about
what the model says use the real default model and are marked slow.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.model_files import default_model_path, ensure_default_model

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def build_tiny_llama(folder: Path, source: Path, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=49152,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    return ensure_default_model(default_model_path())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, real_model_dir: Path) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), real_model_dir)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: Path) -> Iterator[Any]:
    """The real engine on the tiny model, installed as the web app's engine."""
    from inference.client import set_engine_client
    from tests.chat.conftest import make_engine_client

    client = make_engine_client(tiny_model_dir)
    set_engine_client(client)
    yield client
    set_engine_client(None)


@pytest.fixture(autouse=True)
def fresh_rate_limits(request: pytest.FixtureRequest) -> None:
    """Rate-limit counters live in the (in-process) cache: start every test at zero."""
    if "django_db_setup" not in request.fixturenames and "db" not in request.fixturenames:
        return
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def make_user(db: None) -> Any:
    def make(username: str = "alice", password: str = "a-long-test-password-1") -> Any:
        from django.contrib.auth import get_user_model

        return get_user_model().objects.create_user(username=username, password=password)

    return make
