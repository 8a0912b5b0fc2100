"""Which family serves a model: config.architectures[0], else config.model_type, looked up
in one table. Adding a family is its module and one line in FAMILIES."""

from __future__ import annotations

from transformers import PretrainedConfig

from inference.engine.errors import UnsupportedModelError
from inference.engine.models.base import DecoderModel
from inference.engine.models.gemma2 import Gemma2Model
from inference.engine.models.gemma3 import Gemma3Model
from inference.engine.models.llama import LlamaModel
from inference.engine.models.phi3 import Phi3Model
from inference.engine.models.qwen2 import Qwen2Model
from inference.engine.models.qwen3 import Qwen3Model

FAMILIES: tuple[type[DecoderModel], ...] = (
    LlamaModel,
    Qwen2Model,
    Qwen3Model,
    Gemma2Model,
    Gemma3Model,
    Phi3Model,
)

_BY_ARCHITECTURE = {a: f for f in FAMILIES for a in f.architectures}
_BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def supported_model_types() -> list[str]:
    return sorted(_BY_MODEL_TYPE)


def refusal(model_type: str, architecture: str) -> UnsupportedModelError:
    what = f"model type {model_type!r}" if model_type else "a model without a model_type"
    if architecture:
        what += f" ({architecture})"
    return UnsupportedModelError(
        f"{what} is not supported; supported: {', '.join(supported_model_types())}"
    )


def model_class(config: PretrainedConfig) -> type[DecoderModel]:
    """The family of this config, or an UnsupportedModelError naming it and what is known."""
    archs = getattr(config, "architectures", None) or []
    architecture = str(archs[0]) if archs else ""
    model_type = str(getattr(config, "model_type", "") or "")
    family = _BY_ARCHITECTURE.get(architecture) or _BY_MODEL_TYPE.get(model_type)
    if family is None or (architecture and architecture not in _BY_ARCHITECTURE):
        raise refusal(model_type, architecture)
    return family
