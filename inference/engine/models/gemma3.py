"""Gemma 3 (text): Gemma 2's layers without the score soft-cap, with (1 + w) norms over
each q and k head, and local layers with a rope base of their own (rope_parameters holds
one set per kind of layer)."""

from __future__ import annotations

from transformers import PretrainedConfig

from inference.engine.models.base import LayerSpec
from inference.engine.models.gemma2 import Gemma2Model


class Gemma3Model(Gemma2Model):
    family = "gemma3"
    architectures = ("Gemma3ForCausalLM",)
    model_types = ("gemma3_text",)
    qk_norm = True

    @classmethod
    def layer_specs(cls, config: PretrainedConfig) -> list[LayerSpec]:
        window = config.sliding_window
        return [
            LayerSpec(window if t == "sliding_attention" else None, t) for t in config.layer_types
        ]
