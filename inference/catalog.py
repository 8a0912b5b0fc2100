"""Which models this deployment serves, and under which names.

    CHATAPP_MODEL=/models/SmolLM2-135M-Instruct            # the default (needs no setting)
    CHATAPP_MODELS=tiny=/models/tiny-llama,/models/Qwen2.5-0.5B-Instruct

The default model is CHATAPP_MODEL's folder, served under the folder's name. CHATAPP_MODELS
adds others, comma-separated, each `folder` (served under the folder's name) or
`name=folder`; an entry naming the default's own folder gives the default that name. Where
a folder is named, a GGUF file (`/models/Qwen3-0.6B.Q4_K_M.gguf`) or a folder holding one
may be too; a file is served under its name without `.gguf`. A
name is what the OpenAI API's `model` field, the chat's model picker, the metrics'
`model_name` label and an engine worker's registration call the model.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

# /v1/models' `owned_by` for the models this app serves itself.
OWNER = "chatapp"
# Letters, digits and . _ - : / @ + (Hugging Face ids such as "org/Model-1.5B" fit).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,99}")


GGUF = ".gguf"


def model_name(path: str | os.PathLike[str]) -> str:
    """The name a model is served under unless one is given: its folder's, or its GGUF
    file's without `.gguf`."""
    return os.path.basename(str(path).rstrip("/")).removesuffix(GGUF) or "model"


def is_model_path(path: str) -> bool:
    """Whether `path` can name a model here: a folder, or a GGUF file."""
    return os.path.isdir(path) or (os.path.isfile(path) and path.endswith(GGUF))


@dataclass(frozen=True)
class ModelSpec:
    """A model (a folder or a GGUF file) and the name it is served under."""

    name: str
    path: str


@dataclass(frozen=True)
class ModelInfo:
    """A served model as /v1/models and the chat's picker list it."""

    id: str
    created: int  # Unix time: when the model's files were written (OpenAI's field)
    owned_by: str
    default: bool = False
    # The context window in tokens, once known (an engine loaded it, a worker reported it).
    context_tokens: int | None = None
    # What its files hold (engine.models.describe), where this process can read them.
    architecture: str | None = None
    weight_format: str | None = None


def parse_model_list(raw: str) -> list[ModelSpec]:
    """CHATAPP_MODELS' entries; ValueError names what is wrong with one."""
    specs = []
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        name, sep, path = entry.partition("=")
        if not sep:
            name, path = model_name(entry), entry
        name, path = name.strip(), path.strip()
        if not path:
            raise ValueError(f"CHATAPP_MODELS entry {entry!r} names no folder")
        if not NAME.fullmatch(name):
            raise ValueError(
                f"CHATAPP_MODELS entry {entry!r}: the name {name!r} must be 1-100 letters, "
                "digits or . _ - : / @ +, starting with a letter or digit"
            )
        specs.append(ModelSpec(name, path))
    return specs


def served_models(default_path: str, extra: list[ModelSpec]) -> list[ModelSpec]:
    """The served models, the default first; ValueError when two share a name or a folder."""
    default = ModelSpec(model_name(default_path), default_path)
    rest = []
    for spec in extra:
        if _same_folder(spec.path, default_path):
            default = ModelSpec(spec.name, default_path)
        else:
            rest.append(spec)
    out = [default]
    for spec in rest:
        for seen in out:
            if seen.name == spec.name:
                raise ValueError(f"two models are named {spec.name!r}: {seen.path}, {spec.path}")
            if _same_folder(seen.path, spec.path):
                raise ValueError(f"{spec.path} is listed twice ({seen.name!r}, {spec.name!r})")
        out.append(spec)
    return out


def created_at(path: str) -> int:
    """When a model's config was written: a folder's config.json, else the GGUF file (the
    one named, or the folder's), which holds its config (0 when none can be read)."""
    if not path:
        return 0
    candidates = [path]
    if os.path.isdir(path):
        candidates = [os.path.join(path, "config.json")]
        candidates += sorted(glob.glob(os.path.join(glob.escape(path), "*" + GGUF)))
    for candidate in candidates:
        try:
            return int(os.stat(candidate).st_mtime)
        except OSError:
            continue
    return 0


def _same_folder(a: str, b: str) -> bool:
    return os.path.realpath(a.rstrip("/")) == os.path.realpath(b.rstrip("/"))
