"""Reading a model from disk: its config and its tensors, as two functions, so that another
file format (GGUF) plugs in beside them. What the engine cannot serve correctly is refused
here by name (UnsupportedModelError), never left to fail later as a KeyError."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from inference.engine.errors import UnsupportedModelError
from inference.engine.formats.gguf_model import (
    gguf_matrix_names,
    gguf_path,
    gguf_weight_reader,
    load_gguf_blocks,
    load_gguf_config,
    load_gguf_tokenizer,
    load_gguf_weights,
)
from inference.engine.models.registry import refusal
from inference.engine.quantized import Q4_1, Q8_0, BlockWeight

# The float types a checkpoint's tensors may have; anything else (fp8, packed integers of
# GPTQ / AWQ / bitsandbytes) would be read as numbers they are not.
WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def load_config(folder: str) -> PretrainedConfig:
    """The model's transformers config; an UnsupportedModelError for a config transformers
    cannot read (an unknown model type) or a quantized checkpoint. `folder` may also name
    a GGUF file, or a folder holding one (formats/gguf_model.py)."""
    if (gguf := gguf_path(folder)) is not None:
        return load_gguf_config(gguf)
    try:
        config: PretrainedConfig = AutoConfig.from_pretrained(folder)
    except (ValueError, KeyError) as exc:
        raw = _raw_config(folder)
        if raw is None:
            raise UnsupportedModelError(f"cannot read a model config at {folder}: {exc}") from exc
        archs = raw.get("architectures")
        arch = str(archs[0]) if isinstance(archs, list) and archs else ""
        raise refusal(str(raw.get("model_type", "")), arch) from exc
    quant = getattr(config, "quantization_config", None)
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else type(quant).__name__
        raise UnsupportedModelError(
            f"pre-quantized checkpoints ({method!r}) are not supported; supported weight "
            f"types: {', '.join(str(t).removeprefix('torch.') for t in WEIGHT_DTYPES)}"
        )
    return config


def load_tokenizer(folder: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer and chat template: the folder's files, or a GGUF's metadata."""
    if (gguf := gguf_path(folder)) is not None:
        return load_gguf_tokenizer(gguf)
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(folder)
    return tokenizer


def _raw_config(folder: str) -> dict[str, object] | None:
    try:
        with open(os.path.join(folder, "config.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def load_weights(folder: str, blocks_only: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's *.safetensors, by its name in the checkpoint. With
    `blocks_only`, a GGUF's matrices are left out: load_blocks gives them as blocks, and
    lazy_weights any float copy of one a step size needs."""
    if (gguf := gguf_path(folder)) is not None:
        return load_gguf_weights(gguf, gguf_matrix_names(gguf) if blocks_only else ())
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    # The GGUF's own blocks beside a converted checkpoint are load_blocks' to read.
    files = [f for f in files if os.path.basename(f) != BLOCKS_FILE]
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(f))
    for name, t in weights.items():
        if t.dtype not in WEIGHT_DTYPES:
            supported = ", ".join(str(d).removeprefix("torch.") for d in WEIGHT_DTYPES)
            raise UnsupportedModelError(
                f"weight type {str(t.dtype).removeprefix('torch.')} (tensor {name!r}) is not "
                f"supported; supported: {supported}"
            )
    return weights


BLOCKS_FILE = "gguf-blocks.safetensors"


def save_blocks(blocks: dict[str, BlockWeight], folder: str | os.PathLike[str]) -> None:
    """Store a GGUF's block matrices beside a converted checkpoint (read_gguf is slow)."""
    from safetensors.torch import save_file

    flat: dict[str, torch.Tensor] = {}
    for name, b in blocks.items():
        if name == "lm_head.weight" and b is blocks.get("embed_tokens.weight"):
            continue
        kind = "q4_1" if isinstance(b, Q4_1) else "q8_0"
        flat[f"{name}.{kind}.qs"] = b.qs
        flat[f"{name}.{kind}.d"] = b.d
        if isinstance(b, Q4_1):
            flat[f"{name}.{kind}.m"] = b.m
    save_file(flat, os.path.join(folder, BLOCKS_FILE))


def lazy_weights(folder: str) -> Callable[[str], torch.Tensor | None] | None:
    """For a GGUF, a reader of one float tensor by name (what load_weights(blocks_only=True)
    left out); None for a folder, whose load_weights holds every tensor."""
    gguf = gguf_path(folder)
    return gguf_weight_reader(gguf) if gguf is not None else None


def load_blocks(folder: str) -> dict[str, BlockWeight] | None:
    if (gguf := gguf_path(folder)) is not None:
        return load_gguf_blocks(gguf)
    path = os.path.join(folder, BLOCKS_FILE)
    if not os.path.isfile(path):
        return None
    flat = load_file(path)
    out: dict[str, BlockWeight] = {}
    for key in flat:
        name, kind, part = key.rsplit(".", 2)
        if part != "qs":
            continue
        if kind == "q4_1":
            out[name] = Q4_1(flat[key], flat[f"{name}.q4_1.d"], flat[f"{name}.q4_1.m"])
        else:
            out[name] = Q8_0(flat[key], flat[f"{name}.q8_0.d"])
    if "lm_head.weight" not in out and "embed_tokens.weight" in out:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out
