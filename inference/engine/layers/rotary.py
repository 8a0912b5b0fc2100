"""Rotary position embeddings as transformers computes them, as one cos/sin table per set
of rope parameters (a model with local and global layers, Gemma 3, has two)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from inference.engine.errors import UnsupportedModelError

# rope types whose frequencies are fixed for every position. "dynamic" (NTK) rescales them
# with the sequence's length as it grows, which a table made once cannot follow.
ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")


def check_rope_type(params: Mapping[str, Any], model: str) -> str:
    """The rope type of these parameters, or an UnsupportedModelError naming it."""
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope type {rope_type!r} of {model} is not supported; "
            f"supported: {', '.join(ROPE_TYPES)}"
        )
    return rope_type


def rope_tables(
    config: PretrainedConfig,
    max_len: int,
    head_dim: int,
    layer_type: str | None = None,
) -> torch.Tensor:
    """cos and sin for every position: [2, max_len, rotary_dim] float32. `layer_type`: the
    key of config.rope_parameters where it holds one set per kind of layer.

    longrope's frequencies depend on the sequence's length in transformers (short factors
    while it fits original_max_position_embeddings, long ones past it); here each position
    takes the long factors from that length on, which is what transformers computes for a
    token decoded there, and the same for every shorter prompt."""
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None:
        params = params[layer_type]
    rope_type = check_rope_type(params, config.model_type)
    rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
        inv_freq = 1.0 / (theta**exponents)
        # A GGUF's rope_freqs (Llama 3's scaling as its per-frequency divisors).
        if (divisors := params.get("freq_factors")) is not None:
            inv_freq = inv_freq / torch.tensor(divisors, dtype=torch.float32)
        return _table(inv_freq, 1.0, torch.arange(max_len))
    init = ROPE_INIT_FUNCTIONS[rope_type]
    cpu = torch.device("cpu")
    kw = {"layer_type": layer_type} if layer_type is not None else {}
    inv_freq, scaling = init(config, cpu, **kw)
    if rope_type != "longrope":
        return _table(inv_freq, scaling, torch.arange(max_len))
    short = params["original_max_position_embeddings"]
    long_freq, long_scaling = init(config, cpu, seq_len=short + 1, **kw)
    positions = torch.arange(max_len)
    return torch.cat(
        (
            _table(inv_freq, scaling, positions[:short]),
            _table(long_freq, long_scaling, positions[short:]),
        ),
        dim=1,
    )


def _table(inv_freq: torch.Tensor, scaling: float, positions: torch.Tensor) -> torch.Tensor:
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return torch.stack((emb.cos() * scaling, emb.sin() * scaling))


def rope_rotation_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with the first half negated, so that rope(x) = x * cos + roll(x, d/2) * this.

    HF rotates with cat(-x2, x1); roll gives cat(x2, x1), and the sign moves into sin.
    """
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rope_partial(qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotates the first cos.shape[-1] dims of the first `heads` heads of qkv in place, the
    rest of each head unrotated (partial_rotary_factor < 1); sin as rope_rotation_sin's."""
    rd = cos.shape[-1]
    part = qkv[:, :heads, :rd]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    part.copy_(torch.addcmul(part * cos, part.roll(rd // 2, dims=-1), sin))
