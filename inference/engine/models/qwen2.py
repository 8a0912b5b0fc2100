"""Qwen2 and Qwen2.5: Llama's layers with biases on q, k and v (which BiasedLinear adds;
the native C layers have none, so these models take the torch path)."""

from __future__ import annotations

from inference.engine.models.base import DecoderModel


class Qwen2Model(DecoderModel):
    family = "qwen2"
    architectures = ("Qwen2ForCausalLM",)
    model_types = ("qwen2",)
