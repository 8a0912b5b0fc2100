"""Llama 2 and 3.x (rope scaling included), Mistral, SmolLM2: the reference shape, which
the native path (native_decode.py) runs in C."""

from __future__ import annotations

from transformers import PretrainedConfig

from inference.engine.models.base import DecoderModel, LayerSpec


class LlamaModel(DecoderModel):
    family = "llama"
    architectures = ("LlamaForCausalLM", "MistralForCausalLM")
    model_types = ("llama", "mistral")

    @classmethod
    def layer_specs(cls, config: PretrainedConfig) -> list[LayerSpec]:
        # Mistral's window applies to every layer where its config sets one.
        window = getattr(config, "sliding_window", None)
        if config.model_type != "mistral" or window is None:
            return super().layer_specs(config)
        return [LayerSpec(window)] * config.num_hidden_layers
