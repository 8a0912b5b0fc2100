"""Phi-3 and Phi-4: Llama's maths over fused qkv_proj and gate_up_proj, split at load into
the per-projection tensors the shared layers fuse again (so they shard and quantize alike);
longrope where the config asks for it, partial rotary where it sets a factor."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from inference.engine.models.base import DecoderModel


class Phi3Model(DecoderModel):
    family = "phi3"
    architectures = ("Phi3ForCausalLM",)
    model_types = ("phi3",)

    @classmethod
    def rename(
        cls, tensors: dict[str, torch.Tensor], config: PretrainedConfig
    ) -> dict[str, torch.Tensor]:
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        # The fused rows are [q heads; k heads; v heads].
        q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
        out: dict[str, torch.Tensor] = {}
        for name, t in super().rename(tensors, config).items():
            if name.endswith("self_attn.qkv_proj.weight"):
                parts = torch.split(t, [q, kv, kv])
                out.update(zip(_names(name, "qkv_proj", ("q", "k", "v")), parts, strict=True))
            elif name.endswith("mlp.gate_up_proj.weight"):
                out.update(
                    zip(_names(name, "gate_up_proj", ("gate", "up")), t.chunk(2), strict=True)
                )
            else:
                out[name] = t
        return out


def _names(name: str, fused: str, parts: tuple[str, ...]) -> list[str]:
    return [name.replace(fused, f"{p}_proj") for p in parts]
