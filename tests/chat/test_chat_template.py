"""Prompts are built from stored token ids so each turn extends the previous one exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from inference.chat_template import PromptBuilder, Turn


@pytest.fixture(scope="module")
def builder(real_model_dir: Path) -> PromptBuilder:
    return PromptBuilder(AutoTokenizer.from_pretrained(real_model_dir))


def test_template_is_split_exactly(builder: PromptBuilder) -> None:
    assert builder.exact


def test_prompt_equals_the_models_own_chat_template(builder: PromptBuilder) -> None:
    turns = [Turn("system", "Be brief."), Turn("user", "What is the capital of France?")]
    want = builder.tokenizer.apply_chat_template(
        [{"role": t.role, "content": t.text} for t in turns],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert builder.tokenizer.decode(builder.build(turns)) == want


def test_next_turn_prompt_is_an_exact_extension(builder: PromptBuilder) -> None:
    tok = builder.tokenizer
    turn1 = [Turn("user", "Name a colour.")]
    prompt1 = builder.build(turn1)
    # A reply whose ids would not survive a decode/encode round trip unchanged.
    reply_ids = [
        *tok.encode(" Blue", add_special_tokens=False),
        *tok.encode("!", add_special_tokens=False),
    ]
    reply_ids.append(tok.eos_token_id)
    turn2 = [
        *turn1,
        Turn("assistant", tok.decode(reply_ids[:-1]), reply_ids),
        Turn("user", "Another?"),
    ]
    prompt2 = builder.build(turn2)
    assert prompt2[: len(prompt1) + len(reply_ids)] == prompt1 + reply_ids


def test_a_reply_cut_short_gets_its_end_marker_added(builder: PromptBuilder) -> None:
    tok = builder.tokenizer
    cut = tok.encode("Once upon a", add_special_tokens=False)  # stopped: no end token
    ids = builder.build(
        [Turn("user", "Story"), Turn("assistant", "Once upon a", cut), Turn("user", "Go on")]
    )
    text = tok.decode(ids)
    assert "Once upon a<|im_end|>\n<|im_start|>user\nGo on" in text
