"""Text deltas never split a UTF-8 character and never show any part of a stop string."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from inference.engine.detokenizer import IncrementalDetokenizer

TEXT = "Hi 😀 there! 世界你好, café — 🎉🎉 done."


@pytest.fixture(scope="module")
def tokenizer(real_model_path):
    return AutoTokenizer.from_pretrained(real_model_path)


def _stream(tokenizer, text: str, stop: list[str]) -> tuple[list[str], IncrementalDetokenizer]:
    prompt = tokenizer.encode("<|im_start|>assistant\n")
    detok = IncrementalDetokenizer(tokenizer, prompt, stop)
    deltas = []
    for token in tokenizer.encode(text):
        deltas.append(detok.add_token(token))
        if detok.stopped:
            return deltas, detok
    deltas.append(detok.flush())
    return deltas, detok


def test_emoji_and_cjk_are_never_split(tokenizer):
    ids = tokenizer.encode(TEXT)
    # The premise: some characters span several tokens.
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    deltas, _ = _stream(tokenizer, TEXT, stop=[])
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT


def test_stop_string_is_never_leaked(tokenizer):
    deltas, detok = _stream(tokenizer, "The capital is Paris. It is big.", stop=["Paris."])
    assert detok.stopped
    assert "".join(deltas) == "The capital is "
    assert not any("Par" in d for d in deltas)


def test_text_that_only_looks_like_a_stop_string_is_released(tokenizer):
    deltas, detok = _stream(tokenizer, "Pa Par Pari Paris", stop=["Paris."])
    assert not detok.stopped
    assert "".join(deltas) == "Pa Par Pari Paris"


def test_stop_string_inside_a_multibyte_run(tokenizer):
    deltas, detok = _stream(tokenizer, "ok 世界你好 more", stop=["你好"])
    assert detok.stopped
    assert "".join(deltas) == "ok 世界"
