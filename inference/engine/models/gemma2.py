"""Gemma 2: norms scale by (1 + w), a norm after attention and after the MLP as well as
before each, embeddings times sqrt(hidden), gelu-tanh MLP, queries scaled by
query_pre_attn_scalar, soft-capped attention scores and logits, and sliding-window layers
alternating with global ones (config.layer_types)."""

from __future__ import annotations

from transformers import PretrainedConfig

from inference.engine.models.base import DecoderModel


class Gemma2Model(DecoderModel):
    family = "gemma2"
    architectures = ("Gemma2ForCausalLM",)
    model_types = ("gemma2",)
    norm_names = {
        "mlp_in": "pre_feedforward_layernorm",
        "attn_out": "post_attention_layernorm",
        "mlp_out": "post_feedforward_layernorm",
    }
    norm_offset = 1.0
    scale_embeddings = True

    @classmethod
    def activation(cls, config: PretrainedConfig) -> str:
        return str(getattr(config, "hidden_activation", None) or config.hidden_act)

    @classmethod
    def query_scale(cls, config: PretrainedConfig, head_dim: int) -> float:
        return float(config.query_pre_attn_scalar**-0.5)
