"""The MLP's gated activations over a fused gate_up product, and soft-capping."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


# config.hidden_act (hidden_activation in Gemma's) -> act(gate) * up of [T, 2 * inter].
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": silu_mul,
    "gelu_pytorch_tanh": gelu_tanh_mul,
}


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma's soft cap: values squashed smoothly into (-cap, cap)."""
    return torch.tanh(x / cap) * cap
