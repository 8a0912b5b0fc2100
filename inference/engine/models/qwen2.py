"""Qwen2 and Qwen2.5: Llama's layers with biases on q, k and v (BiasedLinear adds them on
the torch path, the native C layer after its q/k/v product)."""

from __future__ import annotations

from inference.engine.models.base import DecoderModel


class Qwen2Model(DecoderModel):
    family = "qwen2"
    architectures = ("Qwen2ForCausalLM",)
    model_types = ("qwen2",)
