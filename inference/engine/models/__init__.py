"""The architectures the engine serves, one module per family over layers/, and the one way
to build a model from a folder: load_model."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from inference.engine import kernels
from inference.engine.formats.gguf_file import return_freed_memory
from inference.engine.layers.linear import HYBRID_MAX_ROWS
from inference.engine.models.base import DecoderModel
from inference.engine.models.describe import describe_model
from inference.engine.models.loader import lazy_weights, load_blocks, load_config, load_weights
from inference.engine.models.registry import model_class
from inference.engine.native_decode import NativeDecoder

__all__ = [
    "DecoderModel", "check_model", "describe_model", "load_config", "load_model",
    "load_weights", "model_class",
]  # fmt: skip

log = logging.getLogger(__name__)


def check_model(folder: str) -> type[DecoderModel]:
    """The family that serves the model in `folder`, from its config alone (no weights read):
    an UnsupportedModelError for an architecture, rope type or activation not supported, so
    that a process refuses it at start. Missing tensors and weight types show at load."""
    config = load_config(folder)
    family = model_class(config)
    family.check(config)
    return family


def load_model(
    folder: str,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    quantization: str = "none",
    max_len: int | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    native_max_rows: int = 0,
) -> DecoderModel:
    """The model in `folder`, built by its family; an UnsupportedModelError (errors.py)
    where the engine cannot serve it correctly."""
    config = load_config(folder)
    family = model_class(config)
    kw: dict[str, Any] = {}
    blocks_only = False
    if quantization in ("int4", "hybrid"):
        kw["stored_blocks"] = load_blocks(folder)
        # A GGUF's matrices come as blocks only, with no float copy of the model.
        kw["lazy"] = lazy_weights(folder)
        blocks_only = kw["lazy"] is not None
    model = family(
        config, load_weights(folder, blocks_only), dtype=dtype, device=device,
        quantization=quantization,
        max_len=max_len, tp_rank=tp_rank, tp_size=tp_size, all_reduce=all_reduce,
        native_max_rows=native_max_rows, **kw,
    )  # fmt: skip
    lib = kernels.load() if model.has_blocks and model.llama_shaped else None
    if lib is not None and NativeDecoder.usable(model):
        model.native = NativeDecoder(model, lib, model.native_rows, HYBRID_MAX_ROWS)
    return_freed_memory()  # what loading freed, back to the system
    if tp_rank == 0:
        log.info("%s", describe_loaded(folder, model, quantization))
    return model


def describe_loaded(folder: str, model: DecoderModel, quantization: str) -> str:
    """The start-up line of one model: what was loaded, and what serves its steps."""
    files = describe_model(folder)
    isa = kernels.loaded_isa()
    served = [f"quantization {quantization}"]
    if model.native is not None:
        served.append(f"native decode up to {model.native.max_rows} rows")
    served.append(f"kernels {isa.name}" if model.has_blocks and isa else "torch products")
    return (
        f"model {folder}: {files.architecture} ({files.family}), {files.weight_format}, "
        f"context {files.context_length}; served by {', '.join(served)}"
    )
