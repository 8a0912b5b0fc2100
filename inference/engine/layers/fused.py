"""Which projections of a decoder layer are multiplied as one product: q, k and v; gate and
up. models/base.py's DecoderLayer fuses them so, and the GGUF loader holds each group's
matrices in one format (formats/gguf_model.py's layer_formats), both from this table."""

from __future__ import annotations

# Each product's projections by their Hugging Face module names, in the order their rows
# are stacked.
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
GATE_UP = ("mlp.gate_proj", "mlp.up_proj")
FUSED_PRODUCTS: tuple[tuple[str, ...], ...] = (QKV, GATE_UP)
