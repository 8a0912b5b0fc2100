"""Block-quantized weights, as GGUF stores them: Q4_1 (4-bit with a scale and a minimum per
32 weights) and Q8_0 (8-bit with a scale per 32), and the k-quants Q4_K, Q5_K and Q6_K held
in their own blocks, with their products with activations.

The bundled model is a Q4_1 GGUF (its tied embedding / lm_head Q8_0): `read_gguf` takes its
blocks as they are, so the engine multiplies by the very weights llama.cpp uses, with no
round trip through a float checkpoint. Any float weight can be quantized the same way at
load (`Q4_1.quantize`). The products run in inference/engine/kernels.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, TypeVar, cast

import numpy as np
import torch

from inference.engine import kernels

QK = 32  # weights per block
QK_K = 256  # weights per k-quant super-block


# Where Q6_K's four 2-bit tops sit in their byte.
_TOP_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)


def nibbles(b: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """uint8 bytes -> their low nibbles, then their high ones, joined along `dim` (twice
    its length there)."""
    return torch.cat((b & 0x0F, b >> 4), dim=dim)


def q6_values(b: torch.Tensor) -> torch.Tensor:
    """Q6_K's 128 bytes of low nibbles and 64 of 2-bit tops -> int8 [..., 256], q - 32.

    In each half of 128 weights, low-nibble byte j serves weights j (its low nibble) and
    j + 64 (its high); top byte j serves weights j, j + 32, j + 64, j + 96 (bits 0-1, 2-3,
    4-5, 6-7)."""
    lead = b.shape[:-1]
    low = nibbles(b[..., 0:128].reshape(*lead, 2, 64))  # [..., 2, 128]
    tops = b[..., 128:192].reshape(*lead, 2, 1, 32)
    high = ((tops >> _TOP_SHIFTS.view(4, 1)) & 3).reshape(*lead, 2, 128)
    return ((low | (high << 4)).to(torch.int8) - 32).reshape(*lead, QK_K)


class _KQuant(Protocol):
    # The block tensors that run along the rows, in the constructor's names.
    ROW_PARTS: ClassVar[tuple[str, ...]]

    def _gguf_layout(self, what: str) -> None: ...


_K = TypeVar("_K", bound=_KQuant)


def _take_rows(w: _K, index: torch.Tensor | slice) -> _K:
    """Rows `index` of a K-quant's GGUF-layout blocks, every part of them."""
    w._gguf_layout("rows")
    return type(w)(**{f: getattr(w, f)[index] for f in w.ROW_PARTS})


def _join(cls: type[_K], parts: Sequence[object]) -> _K:
    """`parts`, GGUF-layout blocks of exactly `cls`, joined along the rows: another
    format's would be joined without what it holds beyond cls's (a Q5_K's fifth bits in a
    Q4_K), or not at all."""
    name = cls.__name__
    if any(type(p) is not cls for p in parts):
        raise ValueError(f"{name} joins {name} blocks only (gguf_model.layer_formats)")
    ks = cast(list[_K], list(parts))
    for p in ks:
        p._gguf_layout("rows")
    return cls(**{f: torch.cat([getattr(p, f) for p in ks]) for f in cls.ROW_PARTS})


def _check_k(k: int) -> None:
    if k % QK:
        raise ValueError(f"block quantization needs a multiple of {QK} inputs, got {k}")


GROUP = 8  # the kernel layout's columns side by side (quant_gemm.c)
# Weights converted to the kernel layout at once (for_kernel): 1M, ~5 MB of temporaries.
KERNEL_CHUNK_WEIGHTS = 1 << 20


def _groups(t: torch.Tensor, n: int) -> torch.Tensor:
    """t [n, ...] zero-padded to whole groups and split: [n / 8, 8, ...]."""
    pad = -n % GROUP
    if pad:
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])])
    return t.reshape(-1, GROUP, *t.shape[1:])


def _unpacked(qs: torch.Tensor) -> torch.Tensor:
    """GGUF-layout Q4_1 bytes [n, K / 2] as their values, uint8 [n, K / 32, 32]: byte j of
    a block holds value j in its low nibble and value j + 16 in its high one."""
    return nibbles(qs.reshape(qs.shape[0], -1, 16))


def _scales_to_kernel(s: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Per-block scales [n, blocks] as the kernel reads them: [group][block][8]."""
    g = _groups(s.to(dtype), n)  # [G, 8, nb]
    return g.permute(0, 2, 1).contiguous().reshape(-1, s.shape[1])


def _scales_from_kernel(s: torch.Tensor, n: int) -> torch.Tensor:
    nb = s.shape[1]
    return s.reshape(-1, nb, GROUP).permute(0, 2, 1).reshape(-1, nb)[:n]


@dataclass
class Q4_1:
    """W[n, k] = d[n, k // 32] * q + m[n, k // 32]; q in [0, 15], two per byte of qs.

    GGUF's layout (kernel=False): block byte j holds element j in its low nibble and element
    j + 16 in its high one; d and m float32. The kernel's layout (kernel=True, from
    `for_kernel`): columns in groups of 8 (the last zero-padded; `n` is the true count), and
    per group and block 128 bytes, 4 vectors of 32: vector j holds k 8j..8j+3 of each column
    (4 bytes a column) in its low nibbles and k 8j+4..8j+7 in its high ones; d and m float16
    [group][block][8]. See quant_gemm.c for why.
    """

    qs: torch.Tensor  # uint8 [N, K / 2]
    d: torch.Tensor  # [N, K / 32]
    m: torch.Tensor  # [N, K / 32]
    kernel: bool = False
    n: int = 0  # columns, where the kernel layout pads them to whole groups

    def __post_init__(self) -> None:
        if not self.n:
            self.n = self.qs.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.qs.shape[1] * 2

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
        if self.kernel:
            # [G, nb, j, c, t] bytes: low nibble k = 8j + t, high k = 8j + 4 + t.
            b = self.qs.reshape(-1, k // QK, 4, GROUP, 4)
            v = torch.stack((b & 0x0F, b >> 4), dim=3)  # [G, nb, j, half, c, t]
            v = v.permute(0, 4, 1, 2, 3, 5)  # [G, c, nb, j, half, t]
            return v.reshape(-1, k // QK, QK)[:n]
        return _unpacked(self.qs)

    def _scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kernel:
            return _scales_from_kernel(self.d, self.n), _scales_from_kernel(self.m, self.n)
        return self.d, self.m

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        q = self._values().float()
        d, m = self._scales()
        return (q * d.float()[..., None] + m.float()[..., None]).reshape(n, k)

    def for_kernel(self) -> Q4_1:
        """The same weights in the kernel's layout, made a few whole groups of rows at a
        time straight into place: unpacking a whole matrix at once took ~5 bytes of
        temporaries per weight, the largest part of a GGUF load's peak memory."""
        if self.kernel:
            return self
        n = self.n
        d = _scales_to_kernel(self.d, n, torch.float16)
        m = _scales_to_kernel(self.m, n, torch.float16)
        return Q4_1(self._kernel_qs(), d, m, kernel=True, n=n)

    def _kernel_qs(self) -> torch.Tensor:
        n, k = self.shape
        qs = torch.empty(-(-n // GROUP) * GROUP, k // 2, dtype=torch.uint8)
        step = max(GROUP, KERNEL_CHUNK_WEIGHTS // k // GROUP * GROUP)
        for lo in range(0, n, step):
            rows = min(step, n - lo)
            q = _groups(_unpacked(self.qs[lo : lo + rows]), rows)  # [G, 8, nb, 32]
            q = q.reshape(q.shape[0], GROUP, k // QK, 4, 2, 4)  # [G, c, nb, j, half, t]
            q = q.permute(0, 2, 3, 1, 5, 4)  # [G, nb, j, c, t, half]
            packed = (q[..., 0] | (q[..., 1] << 4)).reshape(-1, k // 2)
            qs[lo : lo + packed.shape[0]] = packed
        return qs

    def rows(self, start: int, stop: int) -> Q4_1:
        self._gguf_layout("rows")
        return Q4_1(self.qs[start:stop], self.d[start:stop], self.m[start:stop])

    def cols(self, start: int, stop: int) -> Q4_1:
        self._gguf_layout("columns")
        _check_k(start)
        _check_k(stop)
        b0, b1 = start // QK, stop // QK
        return Q4_1(
            self.qs[:, b0 * 16 : b1 * 16].contiguous(),
            self.d[:, b0:b1].contiguous(),
            self.m[:, b0:b1].contiguous(),
        )

    def take_rows(self, index: torch.Tensor) -> Q4_1:
        self._gguf_layout("rows")
        return Q4_1(self.qs[index], self.d[index], self.m[index])

    @classmethod
    def from_values(cls, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> Q4_1:
        """Blocks of 4-bit values q (uint8 [N, K / 32, 32], 0..15) with x = d * q + m:
        what Q4_0 (m = -8d) and Q4_K (d and m per 32 from its scales) are, exactly."""
        n, nb = q.shape[0], q.shape[1]
        qs = q[..., :16] | (q[..., 16:] << 4)
        return cls(qs.reshape(n, nb * 16).contiguous(), d.contiguous(), m.contiguous())

    def _gguf_layout(self, what: str) -> None:
        if self.kernel:
            raise ValueError(f"slice the {what} of GGUF-layout blocks, before for_kernel()")

    @staticmethod
    def cat(parts: list[Q4_1]) -> Q4_1:
        for p in parts:
            p._gguf_layout("rows")
        return Q4_1(
            torch.cat([p.qs for p in parts]),
            torch.cat([p.d for p in parts]),
            torch.cat([p.m for p in parts]),
        )

    def k_parts(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Q4_K's per-block 6-bit scales and minimums (the kernels' sc and mn), and Q5_K's
        fifth bits (qh); none here."""
        return None, None, None

    def matmul_t(self, x: torch.Tensor, kind: str = "int8") -> torch.Tensor:
        """x [rows, K] @ W.T in float32 (the kernel wants `for_kernel()` weights); x at 8
        bits a block, or rounded to bf16 (kinds "bf16" and "amx": kernels.q4_1_gemm)."""
        lib = kernels.load()
        if lib is None or not self.kernel:
            return x.float() @ self.dequantize().T
        x = x.float().contiguous()
        sc, mn, qh = self.k_parts()
        return kernels.q4_1_gemm(lib, self.qs, self.d, self.m, x, self.n, kind, sc, mn, qh)


def _uint8() -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


@dataclass
class Q4_K(Q4_1):
    """GGUF's Q4_K, held as it is: Q4_1's nibbles (either layout, as Q4_1 lays them out),
    and each block of 32's scale and offset in two parts, its 6-bit scale `sc` and minimum
    `mn` (uint8 [N, K / 32]) times its super-block's (256 k) `d` and `m` = -dmin (float16
    [N, K / 256]): w = (d * sc) * q + (m * mn), the file's values exactly. 4.625 bits a
    weight, against 5 as Q4_1 with float16 scales. In the kernel layout d, m, sc and mn are
    [group][block][8] as Q4_1's scales; every product of Q4_1 takes it (common.h's
    q4_block_scales makes a block's scales)."""

    sc: torch.Tensor = field(default_factory=_uint8)
    mn: torch.Tensor = field(default_factory=_uint8)
    ROW_PARTS: ClassVar[tuple[str, ...]] = ("qs", "d", "m", "sc", "mn")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shape[1] % QK_K:
            raise ValueError(f"Q4_K rows are whole super-blocks of {QK_K}, not {self.shape[1]}")

    def _scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        d, m, sc, mn = self.d, self.m, self.sc, self.mn
        if self.kernel:
            d, m, sc, mn = (_scales_from_kernel(t, self.n) for t in (d, m, sc, mn))
        per = QK_K // QK
        return (
            d.float().repeat_interleave(per, dim=1) * sc.float(),
            m.float().repeat_interleave(per, dim=1) * mn.float(),
        )

    def for_kernel(self) -> Q4_K:
        if self.kernel:
            return self
        n = self.n
        d, m, sc, mn = (
            _scales_to_kernel(t, n, t.dtype) for t in (self.d, self.m, self.sc, self.mn)
        )
        return Q4_K(self._kernel_qs(), d, m, kernel=True, n=n, sc=sc, mn=mn)

    def rows(self, start: int, stop: int) -> Q4_K:
        return self.take_rows(slice(start, stop))

    def take_rows(self, index: torch.Tensor | slice) -> Q4_K:
        return _take_rows(self, index)

    def cols(self, start: int, stop: int) -> Q4_K:
        self._gguf_layout("columns")
        if start % QK_K or stop % QK_K:
            raise ValueError(f"Q4_K columns split at whole super-blocks of {QK_K}")
        s0, s1, b0, b1 = start // QK_K, stop // QK_K, start // QK, stop // QK
        return Q4_K(
            self.qs[:, b0 * 16 : b1 * 16].contiguous(),
            self.d[:, s0:s1].contiguous(),
            self.m[:, s0:s1].contiguous(),
            sc=self.sc[:, b0:b1].contiguous(),
            mn=self.mn[:, b0:b1].contiguous(),
        )

    @staticmethod
    def cat(parts: list[Q4_1]) -> Q4_K:
        return _join(Q4_K, parts)

    def k_parts(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        return self.sc, self.mn, None


Q5_HIGH_BYTES = 32  # a Q5_K super-block's fifth bits: bit i of byte l tops its 32's value l


@dataclass
class Q5_K(Q4_K):
    """GGUF's Q5_K, held as it is: Q4_K's nibbles, scales and minimums, and each weight's
    fifth bit in `qh`: w = (d * sc) * q + (m * mn), q = nibble + 16 * bit in 0..31, the
    file's values exactly. 5.625 bits a weight held, against 8.5 as Q8_0 (9 held, its d
    float32).

    GGUF's layout (kernel=False): qh uint8 [N, K / 8], each super-block's 32 bytes as the
    file has them (bit i of byte l: value l of its block i). The kernel's layout: 32 bytes
    a group of 8 columns and block of 32, byte 4c + t's bit i topping column c's k = 4i + t,
    which is the byte of Q4_1's nibble vector i that holds that weight (common.h): the
    kernels OR bit i into vector i's nibbles. Values 0..31 stay within every product of
    Q4_1 (u8 x s8 and 16-bit multiply-adds, bf16's exact integers), so each takes it."""

    qh: torch.Tensor = field(default_factory=_uint8)
    ROW_PARTS: ClassVar[tuple[str, ...]] = (*Q4_K.ROW_PARTS, "qh")

    def _values(self) -> torch.Tensor:
        """q as uint8 [N, K / 32, 32], 0..31."""
        return super()._values() | (self._high_bits() << 4)

    def _high_bits(self) -> torch.Tensor:
        """Each weight's fifth bit, uint8 [N, K / 32, 32] (0 or 1)."""
        n, k = self.shape
        if self.kernel:
            # [G, nb, c, t] bytes -> bits [G, nb, c, t, i] -> [G, c, nb, i, t]
            b = self.qh.reshape(-1, k // QK, GROUP, 4, 1) >> _BIT_SHIFTS
            bits = (b & 1).permute(0, 2, 1, 4, 3)
            return bits.reshape(-1, k // QK, QK)[:n]
        b = self.qh.reshape(n, k // QK_K, 1, Q5_HIGH_BYTES) >> _BIT_SHIFTS.view(8, 1)
        return (b & 1).reshape(n, k // QK, QK)

    def for_kernel(self) -> Q5_K:
        if self.kernel:
            return self
        q4 = Q4_K.for_kernel(self)
        return Q5_K(
            q4.qs, q4.d, q4.m, kernel=True, n=self.n, sc=q4.sc, mn=q4.mn, qh=self._kernel_qh()
        )

    def _kernel_qh(self) -> torch.Tensor:
        """The fifth bits in the kernel's layout, a few whole groups of rows at a time."""
        n, k = self.shape
        qh = torch.empty(-(-n // GROUP) * GROUP, k // 8, dtype=torch.uint8)
        step = max(GROUP, KERNEL_CHUNK_WEIGHTS // k // GROUP * GROUP)
        for lo in range(0, n, step):
            part = self.take_rows(slice(lo, lo + step))
            rows = part.shape[0]
            h = _groups(part._high_bits(), rows)  # [G, c, nb, 32]
            h = h.reshape(h.shape[0], GROUP, k // QK, 8, 4).permute(0, 2, 1, 4, 3)
            packed = (h << _BIT_SHIFTS).sum(dim=-1, dtype=torch.uint8)  # [G, nb, c, t]
            qh[lo : lo + GROUP * packed.shape[0]] = packed.reshape(-1, k // 8)
        return qh

    def take_rows(self, index: torch.Tensor | slice) -> Q5_K:
        return _take_rows(self, index)

    def rows(self, start: int, stop: int) -> Q5_K:
        return self.take_rows(slice(start, stop))

    def cols(self, start: int, stop: int) -> Q5_K:
        q4 = Q4_K.cols(self, start, stop)
        s0, s1 = start // QK_K, stop // QK_K
        qh = self.qh[:, s0 * Q5_HIGH_BYTES : s1 * Q5_HIGH_BYTES].contiguous()
        return Q5_K(q4.qs, q4.d, q4.m, sc=q4.sc, mn=q4.mn, qh=qh)

    @staticmethod
    def cat(parts: list[Q4_1]) -> Q5_K:
        return _join(Q5_K, parts)

    @classmethod
    def of_q4_k(cls, w: Q4_K) -> Q5_K:
        """Q4_K's blocks as Q5_K's, every fifth bit 0: the same values exactly (a fused
        product joining the two: gguf_model.layer_formats)."""
        w._gguf_layout("rows")
        qh = torch.zeros(w.n, w.shape[1] // 8, dtype=torch.uint8)
        return cls(w.qs, w.d, w.m, sc=w.sc, mn=w.mn, qh=qh)

    def k_parts(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        return self.sc, self.mn, self.qh


_BIT_SHIFTS = torch.arange(8, dtype=torch.uint8)  # bit i of a byte, for i in 0..7


@dataclass
class Q8_0:
    """W[n, k] = d[n, k // 32] * q; q in [-127, 127]. The GGUF's embedding / lm_head, and
    a GGUF's Q8_0 layer matrices, and K-quant ones fused with a Q6_K or Q8_0 matrix of
    another type (gguf_model.layer_formats: q with k, gate with up); its product takes
    the activations at 16 bits (kernels: q8_0_gemm), since 8-bit ones lost the head's
    answer to the final hidden state's outliers (see model.py).

    The kernel's layout (kernel=True): columns in groups of 8 (the last zero-padded), per
    group and block 16 pairs of k, each 16 bytes (k and k + 1 of each column); d float32
    [group][block][8]."""

    qs: torch.Tensor  # int8 [N, K]
    d: torch.Tensor  # float32 [N, K / 32]
    kernel: bool = False
    n: int = 0

    def __post_init__(self) -> None:
        if not self.n:
            self.n = self.qs.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.qs.shape[1]

    @classmethod
    def quantize(cls, w: torch.Tensor, divisors: tuple[int, ...] = (127,)) -> Q8_0:
        """Each block's scale its largest magnitude over one of `divisors`: of several, the
        one of least squared error in that block (K_QUANT_DIVISORS)."""
        n, k = w.shape
        _check_k(k)
        blocks = w.float().reshape(n, k // QK, QK)
        amax = blocks.abs().amax(-1)
        best: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        for m in divisors:
            d = amax / float(m)
            inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
            q = (blocks * inv[..., None]).round().clamp(-127, 127)
            if len(divisors) == 1:
                return cls(q.to(torch.int8).reshape(n, k).contiguous(), d.contiguous())
            err = (q * d[..., None] - blocks).square().sum(-1)
            if best is None:
                best = (err, q, d)
                continue
            better = err < best[0]
            best = (
                torch.minimum(err, best[0]),
                torch.where(better[..., None], q, best[1]),
                torch.where(better, d, best[2]),
            )
        assert best is not None, "no divisors"
        q8 = best[1].to(torch.int8).reshape(n, k).contiguous()
        return cls(q8, best[2].contiguous())

    def for_kernel(self) -> Q8_0:
        if self.kernel:
            return self
        n, k = self.shape
        q = _groups(self.qs, n).reshape(-1, GROUP, k // QK, 16, 2)  # [G, c, nb, p, t]
        qs = q.permute(0, 2, 3, 1, 4).contiguous().reshape(-1, k)  # [G, nb, p, c, t]
        return Q8_0(qs, _scales_to_kernel(self.d, n, torch.float32), kernel=True, n=n)

    def _values(self) -> torch.Tensor:
        """q as int8 [N, K]."""
        if not self.kernel:
            return self.qs
        n, k = self.shape
        q = self.qs.reshape(-1, k // QK, 16, GROUP, 2).permute(0, 3, 1, 2, 4)
        return q.reshape(-1, k)[:n]

    def matmul_t(
        self, x: torch.Tensor, kind: str = "q8_0", as_rows: int | None = None
    ) -> torch.Tensor:
        """x [rows, K] @ W.T in float32: x at 16 bits a block, by kernels.q8_0_gemm (kind
        "q8_0": on AMX's tiles, both in bf16, from the head's AMX rows where they run, picked
        for a step of `as_rows` rows), or "i16", never on the tiles (a GGUF's Q8_0 layers:
        q8_0_layers_gemm.c says why); or at 8 bits a block where the kernels have
        AVX512-VNNI ("int8": the native path's product of a layer, q8_0_layers_gemm)."""
        lib = kernels.load()
        if lib is None or not self.kernel:
            return x.float() @ self.dequantize().T
        x = x.float().contiguous()
        sc = self.k_parts()
        if kind == "i16":
            return _q8_0_gemm_i16(lib, self.qs, self.d, x, self.n, sc)
        if kind == "int8":
            return kernels.q8_0_layers_gemm(lib, self.qs, self.d, x, self.n, sc)
        return kernels.q8_0_gemm(lib, self.qs, self.d, x, self.n, as_rows, sc)

    def k_parts(self) -> torch.Tensor | None:
        """Q6_K's int8 scale per 16 weights (the kernels' sc); none here."""
        return None

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        d = _scales_from_kernel(self.d, n) if self.kernel else self.d
        return (self._values().reshape(n, k // QK, QK).float() * d.float()[..., None]).reshape(n, k)

    def take_rows(self, index: torch.Tensor) -> Q8_0:
        self._gguf_layout("rows")
        return Q8_0(self.qs[index], self.d[index])

    def rows(self, start: int, stop: int) -> Q8_0:
        self._gguf_layout("rows")
        return Q8_0(self.qs[start:stop], self.d[start:stop])

    def cols(self, start: int, stop: int) -> Q8_0:
        self._gguf_layout("columns")
        _check_k(start)
        _check_k(stop)
        return Q8_0(
            self.qs[:, start:stop].contiguous(), self.d[:, start // QK : stop // QK].contiguous()
        )

    def _gguf_layout(self, what: str) -> None:
        if self.kernel:
            raise ValueError(f"slice the {what} of GGUF-layout blocks, before for_kernel()")

    @staticmethod
    def cat(parts: list[Q8_0]) -> Q8_0:
        if any(p.kernel for p in parts):
            raise ValueError("join the rows of GGUF-layout blocks, before for_kernel()")
        return Q8_0(torch.cat([p.qs for p in parts]), torch.cat([p.d for p in parts]))

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of W in float32: an embedding lookup from the blocks (either layout),
        so that a tied embedding and head share one 8-bit copy and no float one."""
        k = self.shape[1]
        nb = k // QK
        if not self.kernel:
            q, d = self.qs[ids], self.d[ids]
        else:
            group, col = ids // GROUP, ids % GROUP
            q = self.qs.view(-1, nb, 16, GROUP, 2)[group, :, :, col, :]
            d = self.d.view(-1, nb, GROUP)[group, :, col]
        values = q.reshape(-1, nb, QK).float() * d.float()[..., None]
        return values.reshape(*ids.shape, k)


def _int8() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int8)


Q6_BYTES = 192  # a Q6_K super-block's 6-bit values: 128 bytes of low nibbles, 64 of tops


@dataclass
class Q6_K(Q8_0):
    """GGUF's Q6_K, held as it is: w = (d * sc) * (q - 32), q 6-bit, `sc` int8 per 16 k
    and `d` float16 per 256 (a super-block), the file's values exactly: 6.5625 bits a
    weight, against 8.5 as Q8_0 (9 held, its d float32).

    GGUF's layout (kernel=False): qs uint8 [N, K * 3 / 4], each super-block's 192 bytes
    of values as the file has them (q6_values), sc [N, K / 16], d [N, K / 256].
    The kernel's layout: Q8_0's pairs of k at 6 bits, 192 bytes a group of 8 columns and
    block of 32 (common.h says how), sc and d [group][K / 16 or K / 256][8]. Every product
    of Q8_0 takes it (kernels.q8_0_gemm's sc), and the embedding lookup reads it."""

    sc: torch.Tensor = field(default_factory=_int8)
    ROW_PARTS: ClassVar[tuple[str, ...]] = ("qs", "d", "sc")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shape[1] % QK_K:
            raise ValueError(f"Q6_K rows are whole super-blocks of {QK_K}, not {self.shape[1]}")

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.qs.shape[1] * 4 // 3

    def _values(self) -> torch.Tensor:
        """q - 32 as int8 [N, K]."""
        n, k = self.shape
        if not self.kernel:
            return q6_values(self.qs.reshape(n, k // QK_K, Q6_BYTES)).reshape(n, k)
        return _kernel_q6_values(self.qs.reshape(-1, k * 6)).reshape(-1, k)[:n]

    def _scales(self) -> torch.Tensor:
        """d * sc per 16 weights, float32 [N, K / 16], as gguf's dequantization rounds it."""
        d, sc = self.d, self.sc
        if self.kernel:
            d, sc = _scales_from_kernel(d, self.n), _scales_from_kernel(sc, self.n)
        return _q6_scales(d, sc)

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        q = self._values().reshape(n, k // 16, 16).float()
        return (self._scales()[..., None] * q).reshape(n, k)

    def for_kernel(self) -> Q6_K:
        """The kernel's layout, made a few whole groups of rows at a time straight into
        place (as Q4_1.for_kernel)."""
        if self.kernel:
            return self
        n, k = self.shape
        qs = torch.empty(-(-n // GROUP) * GROUP, k * 3 // 4, dtype=torch.uint8)
        step = max(GROUP, KERNEL_CHUNK_WEIGHTS // k // GROUP * GROUP)
        for lo in range(0, n, step):
            part = self.qs[lo : lo + step]
            rows = part.shape[0]
            q = (q6_values(part.reshape(rows, -1, Q6_BYTES)).reshape(rows, k) + 32).to(torch.uint8)
            packed = _kernel_q6_bytes(_groups(q, rows)).reshape(-1, k * 3 // 4)
            qs[lo : lo + packed.shape[0]] = packed
        d = _scales_to_kernel(self.d, n, torch.float16)
        sc = _scales_to_kernel(self.sc, n, torch.int8)
        return Q6_K(qs, d, kernel=True, n=n, sc=sc)

    def rows(self, start: int, stop: int) -> Q6_K:
        return self.take_rows(slice(start, stop))

    def take_rows(self, index: torch.Tensor | slice) -> Q6_K:
        return _take_rows(self, index)

    def cols(self, start: int, stop: int) -> Q6_K:
        self._gguf_layout("columns")
        if start % QK_K or stop % QK_K:
            raise ValueError(f"Q6_K columns split at whole super-blocks of {QK_K}")
        s0, s1 = start // QK_K, stop // QK_K
        return Q6_K(
            self.qs[:, s0 * Q6_BYTES : s1 * Q6_BYTES].contiguous(),
            self.d[:, s0:s1].contiguous(),
            sc=self.sc[:, s0 * 16 : s1 * 16].contiguous(),
        )

    @staticmethod
    def cat(parts: list[Q8_0]) -> Q6_K:
        return _join(Q6_K, parts)

    def k_parts(self) -> torch.Tensor | None:
        return self.sc

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of W in float32, from the blocks in either layout (Q8_0.embedding)."""
        k = self.shape[1]
        flat = ids.reshape(-1)
        if not self.kernel:
            return self.take_rows(flat).dequantize().reshape(*ids.shape, k)
        group, col = flat // GROUP, flat % GROUP
        q = _kernel_q6_values(self.qs.view(-1, k * 6)[group])  # [rows, 8, K]
        q = q[torch.arange(len(flat)), col].reshape(-1, k // 16, 16).float()
        d = self.d.view(-1, k // QK_K, GROUP)[group, :, col]
        sc = self.sc.view(-1, k // 16, GROUP)[group, :, col]
        return (_q6_scales(d, sc)[..., None] * q).reshape(*ids.shape, k)


def _q6_scales(d: torch.Tensor, sc: torch.Tensor) -> torch.Tensor:
    """Each 16's scale d * sc, float32 [rows, K / 16], from d per 256 and sc per 16."""
    return d.float().repeat_interleave(QK_K // 16, dim=1) * sc.float()


def _kernel_q6_bytes(q: torch.Tensor) -> torch.Tensor:
    """Values q (0..63) uint8 [G, 8, K] -> the kernel layout's bytes [G, K / 32, 192]."""
    g, _, k = q.shape
    p = q.reshape(g, GROUP, k // QK, 16, 2).permute(0, 2, 3, 1, 4).reshape(g, k // QK, 16, 16)
    low = (p[:, :, :8] & 0x0F) | ((p[:, :, 8:] & 0x0F) << 4)  # run i: pairs i and i + 8
    tops = (p >> 4).reshape(g, k // QK, 4, 4, 16)  # [.., j, i, 16]: pair 4j + i
    high = (tops << _TOP_SHIFTS.view(1, 1, 4, 1, 1)).sum(dim=2, dtype=torch.uint8)
    return torch.cat((low.reshape(g, -1, 128), high.reshape(g, -1, 64)), dim=-1)


def _kernel_q6_values(b: torch.Tensor) -> torch.Tensor:
    """The kernel layout's bytes [G, K * 6] (a group's 8 rows) -> q - 32, int8 [G, 8, K]."""
    g = b.shape[0]
    nb = b.shape[1] // Q6_BYTES
    b = b.reshape(g, nb, Q6_BYTES)
    lo, hi = b[..., :128].reshape(g, nb, 8, 16), b[..., 128:].reshape(g, nb, 1, 4, 16)
    low = nibbles(lo, dim=2)  # [G, nb, pair, 16]
    high = ((hi >> _TOP_SHIFTS.view(1, 1, 4, 1, 1)) & 3).reshape(g, nb, 16, 16)
    q = (low | (high << 4)).to(torch.int8) - 32
    return q.reshape(g, nb, 16, GROUP, 2).permute(0, 3, 1, 2, 4).reshape(g, GROUP, nb * QK)


def _q8_0_gemm_i16(
    lib: ctypes.CDLL,
    qs: torch.Tensor,
    d: torch.Tensor,
    x: torch.Tensor,
    n: int,
    sc: torch.Tensor | None,
) -> torch.Tensor:
    """q8_0_layers_gemm.c's product (declared here, beside its one caller): the panels from
    the head's panel rows, as q8_0_gemm takes them."""
    fn = lib.q8_0_gemm_i16
    if fn.argtypes is None:
        p, i = ctypes.c_void_p, ctypes.c_int
        fn.argtypes = [p, p, i, i, p, i, p, i, i, p]
        fn.restype = i
    rows, k = x.shape
    y = torch.empty(rows, n, dtype=torch.float32)
    rc = fn(
        qs.data_ptr(), d.data_ptr(), n, k, x.data_ptr(), rows, y.data_ptr(), kernels.threads(),
        kernels.default_panel_min_rows()[1], None if sc is None else sc.data_ptr(),
    )  # fmt: skip
    if rc:
        raise RuntimeError(f"q8_0_gemm_i16 failed ({rc})")
    return y


# Q8_0.quantize's divisors for weights read from 5- and 6-bit blocks (a GGUF's Q5_K and Q6_K
# layers fused with another type, held at 8 bits): 31 or 32 steps of a 6-bit
# sub-block of 16 over 124, 96 or 93 put its weights on the 8-bit grid exactly, and the
# divisors between serve Q5_K's offsets. On a tiny llama's Q6_K / Q5_K_M layers the squared
# error is ~0.6x / ~0.45x that of 127 alone.
K_QUANT_DIVISORS = (127, 124, 120, 116, 112, 108, 104, 100, 96, 93)

BlockWeight = Q4_1 | Q8_0  # Q4_K, Q5_K and Q6_K among them


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
