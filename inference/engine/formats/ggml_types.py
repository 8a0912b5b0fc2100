"""GGUF's weight types: one registry line each, with its dequantization to float32.

A type packs `block_elems` weights into `block_bytes` bytes. The layouts are ggml's
(ggml-common.h); each dequantization below is written from them, vectorised over blocks,
and rounds as `gguf.quants.dequantize` does (same operations, same order, in float32), so
the two agree bit for bit. A type not listed here is refused by name (`ggml_type`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from inference.engine.errors import UnsupportedModelError
from inference.engine.quantized import nibbles, q6_values

QK_K = 256  # weights per k-quant super-block
K_SCALE_BYTES = 12  # a k-quant's eight 6-bit scales and eight 6-bit minimums


Int8Blocks = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class GGMLType:
    name: str
    id: int  # ggml_type's value, as a GGUF stores it
    block_elems: int
    block_bytes: int
    # uint8 [..., block_bytes] -> float32 [..., block_elems]
    dequantize_blocks: Callable[[torch.Tensor], torch.Tensor]
    # Where each block of 32 is a scale times an int8 a weight: uint8 [..., block_bytes] ->
    # (d float32 [...], q int8 [..., 32]); Q8_0's blocks hold such a type's values exactly.
    int8_blocks: Int8Blocks | None = None

    def row_bytes(self, elems: int) -> int:
        if elems % self.block_elems:
            raise ValueError(
                f"{self.name} rows are whole blocks of {self.block_elems}, not {elems}"
            )
        return elems // self.block_elems * self.block_bytes

    def dequantize(self, raw: torch.Tensor, elems: int) -> torch.Tensor:
        """uint8 [rows, row_bytes(elems)] -> float32 [rows, elems]."""
        blocks = raw.reshape(raw.shape[0], -1, self.block_bytes)
        return self.dequantize_blocks(blocks).reshape(raw.shape[0], elems)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 2] (little-endian float16) -> float32 [...]."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _f32(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32)


def _f16_values(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _bf16_values(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.bfloat16).float()


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    """d f16, 16 bytes of nibbles: x = d * (q - 8)."""
    d = _f16(b[..., 0:2])
    q = nibbles(b[..., 2:]).float() - 8
    return d[..., None] * q


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    """d f16, m f16, 16 bytes of nibbles: x = d * q + m."""
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    return d[..., None] * nibbles(b[..., 4:]).float() + m[..., None]


def _scaled(int8_blocks: Int8Blocks) -> Callable[[torch.Tensor], torch.Tensor]:
    """The dequantization of a type whose weights are d * q, q an int8 (GGMLType.int8_blocks)."""

    def dequantize(b: torch.Tensor) -> torch.Tensor:
        d, q = int8_blocks(b)
        return d[..., None] * q.float()

    return dequantize


def _q8_0_int8(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d f16, 32 int8: x = d * q."""
    return _f16(b[..., 0:2]), b[..., 2:].contiguous().view(torch.int8)


_BITS_32 = torch.arange(32, dtype=torch.int64)


def _fifth_bits(b: torch.Tensor) -> torch.Tensor:
    """Q5_0's and Q5_1's 4 bytes (a little-endian uint32 whose bit j tops weight j) ->
    uint8 [..., 32], each 0 or 16."""
    qh = b.to(torch.int64)
    word = qh[..., 0] | qh[..., 1] << 8 | qh[..., 2] << 16 | qh[..., 3] << 24
    return (((word[..., None] >> _BITS_32) & 1) << 4).to(torch.uint8)


def _q5_0_int8(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d f16, 4 bytes of fifth bits, 16 bytes of nibbles: x = d * (q - 16), q 0..31."""
    q = nibbles(b[..., 6:22]) | _fifth_bits(b[..., 2:6])
    return _f16(b[..., 0:2]), q.to(torch.int8) - 16


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    """d f16, m f16, 4 bytes of fifth bits, 16 bytes of nibbles: x = d * q + m, q 0..31."""
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    q = nibbles(b[..., 8:24]) | _fifth_bits(b[..., 4:8])
    return d[..., None] * q.float() + m[..., None]


# IQ4_NL's 16 values, which its nibbles index (ggml-common.h's kvalues_iq4nl).
_IQ4_NL_VALUES = torch.tensor(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=torch.int8
)


def _iq4_nl_int8(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d f16, 16 bytes of nibbles indexing _IQ4_NL_VALUES: x = d * value."""
    return _f16(b[..., 0:2]), _IQ4_NL_VALUES[nibbles(b[..., 2:18]).long()]


def k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A k-quant's 12 scale bytes -> (scales, minimums), each uint8 [..., 8] in 0..63.

    Sub-blocks 0-3 keep theirs in the low 6 bits of bytes 0-3 (scales) and 4-7 (minimums);
    sub-blocks 4-7 in the nibbles of bytes 8-11, topped by the spare 2 bits of bytes 0-7.
    """
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    scales = torch.cat((a & 63, (c & 0x0F) | ((a >> 6) << 4)), dim=-1)
    mins = torch.cat((b & 63, (c >> 4) | ((b >> 6) << 4)), dim=-1)
    return scales, mins


def k_low_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """128 bytes -> uint8 [..., 8, 32]: each run of 32 bytes holds sub-block 2i in its low
    nibbles and 2i + 1 in its high ones."""
    runs = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return nibbles(runs, dim=-2).reshape(*qs.shape[:-1], 8, 32)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    """d f16, dmin f16, 12 scale bytes, 128 bytes of nibbles; 8 sub-blocks of 32:
    x = (d * scale) * q - dmin * min."""
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = k_scales(b[..., 4:16])
    q = k_low_nibbles(b[..., 16:144]).float()
    scale = (d[..., None] * sc.float())[..., None]
    offset = (dmin[..., None] * mn.float())[..., None]
    return (scale * q - offset).flatten(-2)


_BITS_8 = torch.arange(8, dtype=torch.uint8)[:, None]


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    """As Q4_K with a fifth bit per weight: 32 bytes whose bit i tops sub-block i."""
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = k_scales(b[..., 4:16])
    high = (b[..., None, 16:48] >> _BITS_8) & 1  # [..., 8, 32]: bit i of byte l
    q = (k_low_nibbles(b[..., 48:176]) | (high << 4)).float()
    scale = (d[..., None] * sc.float())[..., None]
    offset = (dmin[..., None] * mn.float())[..., None]
    return (scale * q - offset).flatten(-2)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    """q6_values' 192 bytes, 16 int8 scales, d f16: x = (d * scale) * (q - 32), a scale
    per 16."""
    lead = b.shape[:-1]
    q = q6_values(b[..., 0:192]).reshape(*lead, 16, 16).float()
    sc = b[..., 192:208].contiguous().view(torch.int8).float()
    d = _f16(b[..., 208:210])
    return ((d[..., None] * sc)[..., None] * q).flatten(-2)


# name, ggml_type id, weights per block, bytes per block, dequantization[, int8 blocks]
TYPES: tuple[GGMLType, ...] = (
    GGMLType("F32", 0, 1, 4, _f32),
    GGMLType("F16", 1, 1, 2, _f16_values),
    GGMLType("BF16", 30, 1, 2, _bf16_values),
    GGMLType("Q4_0", 2, 32, 18, _q4_0),
    GGMLType("Q4_1", 3, 32, 20, _q4_1),
    GGMLType("Q5_0", 6, 32, 22, _scaled(_q5_0_int8), _q5_0_int8),
    GGMLType("Q5_1", 7, 32, 24, _q5_1),
    GGMLType("Q8_0", 8, 32, 34, _scaled(_q8_0_int8), _q8_0_int8),
    GGMLType("Q4_K", 12, QK_K, 144, _q4_k),
    GGMLType("Q5_K", 13, QK_K, 176, _q5_k),
    GGMLType("Q6_K", 14, QK_K, 210, _q6_k),
    GGMLType("IQ4_NL", 20, 32, 18, _scaled(_iq4_nl_int8), _iq4_nl_int8),
)
_BY_ID = {t.id: t for t in TYPES}
SUPPORTED = ", ".join(t.name for t in TYPES)


class UnsupportedWeightType(UnsupportedModelError):
    pass


def ggml_type(type_id: int, tensor: str, type_name: str = "") -> GGMLType:
    """The registry's entry for `type_id`, or a refusal naming the tensor and its type."""
    found = _BY_ID.get(int(type_id))
    if found is None:
        name = type_name or f"ggml type {int(type_id)}"
        raise UnsupportedWeightType(
            f"tensor {tensor} has type {name}, which is not supported; supported: {SUPPORTED}"
        )
    return found
