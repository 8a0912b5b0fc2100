"""Steps of a few rows through one native call per layer (kernels/decode_layer.c).

At one to four rows a step's work is reading the weights' blocks; run as ~30 torch ops a
layer, the dispatch around those reads cost as much again. This path does the same maths
as DecoderModel.forward for such steps in C, for a Llama-shaped float32 model on a CPU with
the block kernels, on one rank; each product in its matrix's own blocks (Q4_1, a GGUF's
Q4_K or Q5_K, or Q8_0 and a GGUF's Q6_K). Each row carries its own position and
block table, and every row's K/V is written to the pool before any row attends, so
decodes, speculative guesses and short prefill chunks (a row sees the positions up to its
own) all fit. Steps of more rows than `max_rows` take the torch path.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from inference.engine import kernels
from inference.engine.layers.linear import Linear, StackedLinear
from inference.engine.quantized import Q4_1, Q8_0

if TYPE_CHECKING:
    from collections.abc import Iterable

    from inference.engine.layers.attention import AttentionMetadata
    from inference.engine.models.base import DecoderModel


def _pointer(t: torch.Tensor | None) -> int | None:
    """A float32 vector's address for the C layer; None (NULL) where the layer has none."""
    if t is None:
        return None
    assert t.dtype == torch.float32 and t.is_contiguous()
    return int(t.data_ptr())


def _matrix(blocks: object) -> kernels.LayerMatrix:
    """A product's blocks as decode_layer.c takes them: Q4_1 (a GGUF's Q4_K with its
    scales' parts, its Q5_K with their fifth bits too), or Q8_0 (a GGUF's Q8_0, its Q6_K
    with their scales), each multiplied in its own format."""
    assert _native_blocks(blocks)
    if isinstance(blocks, Q8_0):
        n, k = blocks.shape
        q8 = kernels.q8_matrix(blocks.qs, blocks.d, n, k, blocks.k_parts())
        return kernels.LayerMatrix(kernels.LAYER_Q8_0, q8=q8)
    assert isinstance(blocks, Q4_1)
    n, k = blocks.shape
    sc, mn, qh = blocks.k_parts()
    q4 = kernels.Q4Matrix(
        blocks.qs.data_ptr(), blocks.d.data_ptr(), blocks.m.data_ptr(), n, k,
        None if sc is None else sc.data_ptr(), None if mn is None else mn.data_ptr(),
        None if qh is None else qh.data_ptr(),
    )  # fmt: skip
    return kernels.LayerMatrix(kernels.LAYER_Q4_1, q4=q4)


def _native_blocks(blocks: object) -> bool:
    return isinstance(blocks, (Q4_1, Q8_0)) and blocks.kernel


def _products(lin: Linear | StackedLinear) -> list[Linear]:
    """A layer product's Linears: itself, or a stacked one's parts."""
    return lin.parts if isinstance(lin, StackedLinear) else [lin]


def _qkv(lin: Linear | StackedLinear) -> tuple[kernels.LayerMatrix, kernels.LayerMatrix, int]:
    """The q/k/v product as decode_layer.c takes it: its matrix, and where it is two
    (StackedLinear: q and k, then v) the second and the first's rows (LayerWeights'
    qkv_v, qkv_split)."""
    parts = _products(lin)
    if len(parts) == 1:
        return _matrix(parts[0].blocks), kernels.LayerMatrix(), 0
    first, second = parts
    return _matrix(first.blocks), _matrix(second.blocks), first.out_features


class NativeDecoder:
    def __init__(
        self, model: DecoderModel, lib: ctypes.CDLL, max_rows: int, any_chunk_rows: int = 8
    ) -> None:
        self.model = model
        self.lib = lib
        self.max_rows = max_rows
        # Steps of up to any_chunk_rows rows come here whatever their chunks; larger ones
        # only while no sequence has more rows than that in them (decodes, guesses, a
        # prompt as short as a step of this path could be).
        # A prompt's chunk keeps the float format: its 8-bit activations here cost the
        # first token's precision (the real model's "What is the capital of France?"
        # prefilled on this path opened "L'Étoile, ..." instead of "The capital ...": float
        # logits gave "The" 0.179 against "L" 0.139, this path 0.110 against 0.149), and
        # the kernel's attention reads a row's whole context for each row, where SDPA's
        # tiles read a long chunk's context once.
        self.any_chunk_rows = min(any_chunk_rows, max_rows)
        layers = [
            kernels.LayerWeights(
                layer.input_norm.data_ptr(),
                layer.post_norm.data_ptr(),
                _pointer(layer.q_norm),
                _pointer(layer.k_norm),
                _pointer(getattr(layer.qkv, "bias", None)),
                qkv,
                _matrix(layer.o.blocks),
                _matrix(layer.gate_up.blocks),
                _matrix(layer.down.blocks),
                qkv_v,
                split,
            )
            for layer in model.layers
            for qkv, qkv_v, split in [_qkv(layer.qkv)]
        ]
        self.layers = (kernels.LayerWeights * len(layers))(*layers)
        self._shape: kernels.LayerShape | None = None
        self._pools: ctypes.Array[ctypes.c_void_p] | None = None
        self._pools_of: list[torch.Tensor] | None = None

    @staticmethod
    def usable(model: DecoderModel) -> bool:
        return (
            model.device.type == "cpu"
            and model.dtype == torch.float32
            and model.tp_size == 1
            and all(
                len(_products(layer.qkv)) <= 2
                and all(
                    _native_blocks(lin.blocks)
                    for p in (layer.qkv, layer.o, layer.gate_up, layer.down)
                    for lin in _products(p)
                )
                for layer in model.layers
            )
        )

    def handles(self, rows: int, chunks: Iterable[int] = ()) -> bool:
        """Whether a step of `rows` rows takes this path; `chunks`: the rows of each
        sequence with more than one row in the step."""
        if not 0 < rows <= self.max_rows:
            return False
        return rows <= self.any_chunk_rows or all(n <= self.any_chunk_rows for n in chunks)

    def forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, kv_caches: list[torch.Tensor]
    ) -> torch.Tensor:
        m = self.model
        rows = input_ids.shape[0]
        x = m.embed_tokens(input_ids).contiguous()
        positions = meta.positions.contiguous()
        cos = m.cos[positions].contiguous()
        sin = m.sin[positions].contiguous()
        tables = self._block_tables(meta)
        shape = self._layer_shape(kv_caches[0])
        as_rows = rows if meta.as_rows is None else meta.as_rows
        rc = self.lib.decode_layers(
            ctypes.byref(shape), self.layers, len(self.layers), x.data_ptr(), rows, as_rows,
            positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            tables.data_ptr(), tables.shape[1], self._pool_pointers(kv_caches),
            kernels.threads(),
        )  # fmt: skip
        if rc:
            raise RuntimeError(f"decode_layers failed ({rc})")
        return F.rms_norm(x, m.norm.shape, m.norm, m.eps)

    def _pool_pointers(self, kv_caches: list[torch.Tensor]) -> ctypes.Array[ctypes.c_void_p]:
        """Each layer's KV pool, as the C call takes them (kept while the pools are these)."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"{len(kv_caches)} KV pools for {len(self.layers)} layers")
        if (
            self._pools is None
            or self._pools_of is None
            or any(a is not b for a, b in zip(self._pools_of, kv_caches, strict=True))
        ):
            self._pools = (ctypes.c_void_p * len(kv_caches))(*(t.data_ptr() for t in kv_caches))
            self._pools_of = list(kv_caches)
        return self._pools

    def _layer_shape(self, pool: torch.Tensor) -> kernels.LayerShape:
        if self._shape is None:
            if pool.dtype not in kernels.KV_DTYPES:
                raise ValueError(
                    f"the native path's KV pool must be float32, float16 or int8, not {pool.dtype}"
                )
            m = self.model
            inter = m.layers[0].down.blocks.shape[1]  # type: ignore[union-attr]
            self._shape = kernels.LayerShape(
                m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, inter,
                m.eps, m.scale, pool.shape[2], pool.shape[1], kernels.kv_type(pool),
            )  # fmt: skip
        return self._shape

    @staticmethod
    def _block_tables(meta: AttentionMetadata) -> torch.Tensor:
        """One block table per row, in the flat batch's order, padded to one width."""
        groups, prefills = meta.decode_groups, meta.prefills
        if len(groups) == 1 and not prefills:
            return groups[0].block_tables.contiguous()
        tables = [g.block_tables for g in groups]
        tables += [p.block_table.expand(p.length, -1) for p in prefills]
        width = max(t.shape[1] for t in tables)
        return torch.cat([F.pad(t, (0, width - t.shape[1])) for t in tables]).contiguous()
