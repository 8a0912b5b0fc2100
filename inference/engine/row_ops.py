"""The torch path's work between a layer's products: the residual add with the next RMS
norm, rope on q and k, and the MLP's SiLU(gate) * up.

`TorchRowOps` does it in torch ops: every device and dtype, and the compiled step and CUDA
graphs trace it. `PoolRowOps` does the same in the native kernels' pool (kernels/
row_ops.c), for a float32 model on a CPU whose kernels load, in the eager forward: there a
large step's products already run in that pool while torch keeps one thread
(ModelRunner._set_threads), so these ops ran on that one thread, one memory pass each
(~15% of a 384-token prompt's step); in C each is one fused pass, spread over
the pool's threads. Same maths; float sums in another order (within float32 rounding).
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import torch
import torch.nn.functional as F

from inference.engine import kernels


class RowOps(Protocol):
    def add_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, RMSNorm(x + delta) * weight); delta None: nothing to add."""
        ...

    def rope(self, qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotates the first `heads` heads of qkv [T, all heads, head_dim] in place; cos
        and sin [T, head_dim], sin with its first half negated (model.rope_rotation_sin)."""
        ...

    def act(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up of gate_up [T, 2 * inter] -> [T, inter]."""
        ...


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # As transformers computes it: in float32, scaled by the weight in the model dtype.
    if x.dtype == torch.float32:
        # One fused kernel; bit-identical to the three-step form in float32.
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class TorchRowOps:
    def __init__(self, eps: float) -> None:
        self.eps = eps

    def add_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if delta is not None:
            x = x + delta
        return x, rms_norm(x, weight, self.eps)

    def rope(self, qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
        # q and k are adjacent heads of the fused projection: rotated together, in place.
        qk = qkv[:, :heads]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        qk.copy_(torch.addcmul(qk * cos, qk.roll(qkv.shape[-1] // 2, dims=-1), sin))

    def act(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class PoolRowOps:
    """The same in kernels/row_ops.c; takes float32 CPU tensors, contiguous where it writes
    in place (the forward's own x and the products' outputs are)."""

    def __init__(self, lib: ctypes.CDLL, eps: float) -> None:
        self.lib = lib
        self.eps = eps

    @staticmethod
    def usable(device: torch.device, dtype: torch.dtype, tp_size: int) -> bool:
        return device.type == "cpu" and dtype == torch.float32 and tp_size == 1

    def add_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.contiguous()
        if delta is not None:
            delta = delta.contiguous()
        rows, n = x.shape
        out = torch.empty_like(x)
        self.lib.add_rms_norm(
            x.data_ptr(), delta.data_ptr() if delta is not None else None, weight.data_ptr(),
            rows, n, self.eps, out.data_ptr(), kernels.threads(),
        )  # fmt: skip
        return x, out

    def rope(self, qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
        if not qkv.is_contiguous():
            raise ValueError("PoolRowOps.rope rotates a contiguous qkv in place")
        rows, width, d = qkv.shape
        cos, sin = cos.contiguous(), sin.contiguous()  # held: C reads them
        self.lib.rope_rows(
            qkv.data_ptr(), rows, width * d, heads, d, cos.data_ptr(), sin.data_ptr(),
            kernels.threads(),
        )  # fmt: skip

    def act(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate_up = gate_up.contiguous()
        rows, n = gate_up.shape[0], gate_up.shape[1] // 2
        out = gate_up.new_empty(rows, n)
        self.lib.silu_mul(gate_up.data_ptr(), rows, n, out.data_ptr(), kernels.threads())
        return out
