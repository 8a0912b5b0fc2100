"""Block-quantized weights, as GGUF stores them: Q4_1 (4-bit with a scale and a minimum per
32 weights) and Q8_0 (8-bit with a scale per 32), with their products with activations.

The bundled model is a Q4_1 GGUF (its tied embedding / lm_head Q8_0): `read_gguf` takes its
blocks as they are, so the engine multiplies by the very weights llama.cpp uses, with no
round trip through a float checkpoint. Any float weight can be quantized the same way at
load (`Q4_1.quantize`). The products run in inference/engine/kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from inference.engine import kernels

QK = 32  # weights per block


def _check_k(k: int) -> None:
    if k % QK:
        raise ValueError(f"block quantization needs a multiple of {QK} inputs, got {k}")


@dataclass
class Q4_1:
    """W[n, k] = d[n, k // 32] * q + m[n, k // 32]; q in [0, 15], two per byte of qs.

    GGUF's layout (paired=False): block byte j holds element j in its low nibble and element
    j + 16 in its high one; d and m float32. The kernel's layout (paired=True, from
    `for_kernel`): byte j of a pair of blocks holds element j of the first block low and of
    the second high, so one 32-byte load unpacks to 64 weights; d and m float16.
    """

    qs: torch.Tensor  # uint8 [N, K / 2]
    d: torch.Tensor  # [N, K / 32]
    m: torch.Tensor  # [N, K / 32]
    paired: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return self.qs.shape[0], self.qs.shape[1] * 2

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Q4_1:
        n, k = w.shape
        _check_k(k)
        blocks = w.float().reshape(n, k // QK, QK)
        lo, hi = blocks.amin(-1), blocks.amax(-1)
        d = (hi - lo) / 15.0
        inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        q = ((blocks - lo[..., None]) * inv[..., None]).round().clamp(0, 15).to(torch.uint8)
        qs = q[..., :16] | (q[..., 16:] << 4)
        return cls(qs.reshape(n, k // 2).contiguous(), d.contiguous(), lo.contiguous())

    def _values(self) -> torch.Tensor:
        """q as uint8 [N, K / 32, 32]."""
        n, k = self.shape
        if self.paired:
            b = self.qs.reshape(n, k // (2 * QK), 1, QK)
            return torch.cat((b & 0x0F, b >> 4), dim=2).reshape(n, k // QK, QK)
        b = self.qs.reshape(n, k // QK, 16)
        return torch.cat((b & 0x0F, b >> 4), dim=-1)

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        q = self._values().float()
        return (q * self.d.float()[..., None] + self.m.float()[..., None]).reshape(n, k)

    def for_kernel(self) -> Q4_1:
        """The same weights in the kernel's layout (needs K to be a multiple of 64)."""
        if self.paired:
            return self
        n, k = self.shape
        if k % (2 * QK):
            raise ValueError(f"the 4-bit kernel needs a multiple of 64 inputs, got {k}")
        q = self._values().reshape(n, k // (2 * QK), 2, QK)
        qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
        return Q4_1(qs, self.d.half().contiguous(), self.m.half().contiguous(), paired=True)

    def rows(self, start: int, stop: int) -> Q4_1:
        return Q4_1(self.qs[start:stop], self.d[start:stop], self.m[start:stop], self.paired)

    def cols(self, start: int, stop: int) -> Q4_1:
        if self.paired:
            raise ValueError("slice the columns of GGUF-layout blocks, before for_kernel()")
        _check_k(start)
        _check_k(stop)
        b0, b1 = start // QK, stop // QK
        return Q4_1(
            self.qs[:, b0 * 16 : b1 * 16].contiguous(),
            self.d[:, b0:b1].contiguous(),
            self.m[:, b0:b1].contiguous(),
        )

    def take_rows(self, index: torch.Tensor) -> Q4_1:
        return Q4_1(self.qs[index], self.d[index], self.m[index], self.paired)

    @staticmethod
    def cat(parts: list[Q4_1]) -> Q4_1:
        return Q4_1(
            torch.cat([p.qs for p in parts]),
            torch.cat([p.d for p in parts]),
            torch.cat([p.m for p in parts]),
            parts[0].paired,
        )

    def matmul_t(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, K] @ W.T in float32 (the kernel wants `for_kernel()` weights)."""
        lib = kernels.load()
        if lib is None or not self.paired:
            return x.float() @ self.dequantize().T
        return kernels.q4_1_gemm(lib, self.qs, self.d, self.m, x.float().contiguous())


@dataclass
class Q8_0:
    """W[n, k] = d[n, k // 32] * q; q in [-127, 127]. The GGUF's embedding / lm_head; its
    product takes the activations at 16 bits (kernels: q8_0_gemm), since 8-bit ones lost
    the head's answer to the final hidden state's outliers (see model.py)."""

    qs: torch.Tensor  # int8 [N, K]
    d: torch.Tensor  # float32 [N, K / 32]

    @property
    def shape(self) -> tuple[int, int]:
        return self.qs.shape[0], self.qs.shape[1]

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Q8_0:
        n, k = w.shape
        _check_k(k)
        blocks = w.float().reshape(n, k // QK, QK)
        d = blocks.abs().amax(-1) / 127.0
        inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        q = (blocks * inv[..., None]).round().clamp(-127, 127).to(torch.int8)
        return cls(q.reshape(n, k).contiguous(), d.contiguous())

    def for_kernel(self) -> Q8_0:
        return Q8_0(self.qs.contiguous(), self.d.float().contiguous())

    def matmul_t(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, K] @ W.T in float32."""
        lib = kernels.load()
        if lib is None:
            return x.float() @ self.dequantize().T
        return kernels.q8_0_gemm(lib, self.qs, self.d, x.float().contiguous())

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        return (self.qs.reshape(n, k // QK, QK).float() * self.d[..., None]).reshape(n, k)

    def take_rows(self, index: torch.Tensor) -> Q8_0:
        return Q8_0(self.qs[index], self.d[index])


BlockWeight = Q4_1 | Q8_0


def _f16(raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16).astype(np.float32))


def _unpermute_rows(n: int, heads: int) -> torch.Tensor:
    """llama.cpp's converter reorders q/k rows within each head for its rope; this index puts
    them back in Hugging Face order (rows[i] of the HF weight is GGUF row index[i])."""
    return torch.arange(n).reshape(heads, n // heads // 2, 2).transpose(1, 2).reshape(n)


_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def read_gguf(path: str | Path, num_heads: int, num_kv_heads: int) -> dict[str, BlockWeight]:
    """The Q4_1 and Q8_0 matrices of a llama GGUF, under Hugging Face names
    (`layers.0.self_attn.q_proj.weight`, `embed_tokens.weight`, `lm_head.weight`)."""
    from gguf import GGMLQuantizationType, GGUFReader

    out: dict[str, BlockWeight] = {}
    for t in GGUFReader(str(path)).tensors:
        name = t.name.removesuffix(".weight")
        if name == "token_embd":
            hf = "embed_tokens.weight"
        elif name == "output":
            hf = "lm_head.weight"
        elif name.startswith("blk.") and name.split(".")[2] in _GGUF_NAMES:
            _, layer, kind = name.split(".")
            hf = f"layers.{layer}.{_GGUF_NAMES[kind]}.weight"
        else:
            continue
        raw = np.asarray(t.data)
        n = raw.shape[0]
        if t.tensor_type == GGMLQuantizationType.Q4_1:
            b = raw.reshape(n, -1, 20)
            w: BlockWeight = Q4_1(
                torch.from_numpy(np.ascontiguousarray(b[..., 4:]).reshape(n, -1)),
                _f16(b[..., 0:2]).reshape(n, -1),
                _f16(b[..., 2:4]).reshape(n, -1),
            )
        elif t.tensor_type == GGMLQuantizationType.Q8_0:
            b = raw.reshape(n, -1, 34)
            w = Q8_0(
                torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(n, -1)),
                _f16(b[..., 0:2]).reshape(n, -1),
            )
        else:
            continue
        if name.endswith("attn_q"):
            w = w.take_rows(_unpermute_rows(n, num_heads))
        elif name.endswith("attn_k"):
            w = w.take_rows(_unpermute_rows(n, num_kv_heads))
        out[hf] = w
    if "lm_head.weight" not in out and "embed_tokens.weight" in out:
        out["lm_head.weight"] = out["embed_tokens.weight"]  # tied
    return out
