"""What a model on disk is, in the words a person running the server looks for: its
architecture, how its weights are stored, its context length. The start-up log, /v1/models
and the chat's model list say it; read from the config and the files' headers, no weights."""

from __future__ import annotations

import functools
import glob
import json
import os
import struct
from collections import Counter
from dataclasses import dataclass

from inference.engine.formats.gguf_model import gguf_path, open_gguf, weights
from inference.engine.models.loader import BLOCKS_FILE, load_config
from inference.engine.models.registry import model_class


@dataclass(frozen=True)
class ModelFiles:
    architecture: str  # the transformers class, e.g. LlamaForCausalLM
    family: str  # the module of models/ that serves it
    weight_format: str  # e.g. "GGUF Q4_K_M: 98 Q4_K, 15 Q6_K" or "safetensors bf16"
    context_length: int


def describe_model(path: str) -> ModelFiles:
    """The model at `path` (a folder or a GGUF); UnsupportedModelError as load_config and the
    registry refuse it. Read once per path and modification time: /v1/models asks often."""
    stat = os.stat(path)
    return _describe(os.path.abspath(path), stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _describe(path: str, mtime_ns: int) -> ModelFiles:
    config = load_config(path)
    family = model_class(config)
    archs = getattr(config, "architectures", None) or family.architectures
    return ModelFiles(
        architecture=str(archs[0]),
        family=family.family,
        weight_format=weight_format(path),
        context_length=int(config.max_position_embeddings),
    )


def weight_format(path: str) -> str:
    """How the matrices are stored: a GGUF's file type and the count of each block type
    among its matrices (a Q4_K_M file mixes Q4_K and Q6_K), or a checkpoint's dtypes."""
    if (gguf := gguf_path(path)) is not None:
        file = open_gguf(gguf)
        blocks = Counter(t.type.name for t in weights(file).values() if len(t.shape) == 2)
        return f"GGUF {gguf_file_type(file.get('general.file_type'))}: {_counts(blocks)}"
    kinds: Counter[str] = Counter()
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        if os.path.basename(f) != BLOCKS_FILE:
            kinds.update(_header(f)[0])
    text = f"safetensors {_counts(kinds) if len(kinds) > 1 else next(iter(kinds), '?')}"
    if os.path.isfile(stored := os.path.join(path, BLOCKS_FILE)):
        # A folder converted from a GGUF keeps the file's blocks beside it (loader.save_blocks).
        text += f", with its GGUF's blocks ({_counts(_header(stored)[1])})"
    return text


def gguf_file_type(value: object) -> str:
    """general.file_type as llama-quantize names it (Q4_K_M, F16, ...)."""
    from gguf import LlamaFileType

    try:
        name = LlamaFileType(int(value)).name  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return "(file type not set)"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _counts(kinds: Counter[str]) -> str:
    return ", ".join(f"{n} {k}" for k, n in kinds.most_common())


# safetensors' dtype names as people write them.
_DTYPES = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "F64": "fp64"}


def _header(file: str) -> tuple[Counter[str], Counter[str]]:
    """From a safetensors file's JSON header alone: the dtype of each 2-D tensor, and the
    block format of each matrix save_blocks stored (its `<name>.<format>.qs` tensors)."""
    with open(file, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    dtypes = Counter(
        _DTYPES.get(t["dtype"], t["dtype"].lower()) for t in header.values() if len(t["shape"]) == 2
    )
    blocks = Counter(n.split(".")[-2].upper() for n in header if n.endswith(".qs"))
    return dtypes, blocks
