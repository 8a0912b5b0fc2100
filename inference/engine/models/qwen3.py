"""Qwen3 (dense): Llama's layers with an RMS norm over each q and k head before rope."""

from __future__ import annotations

from inference.engine.models.base import DecoderModel


class Qwen3Model(DecoderModel):
    family = "qwen3"
    architectures = ("Qwen3ForCausalLM",)
    model_types = ("qwen3",)
    qk_norm = True
