"""The inference engine: a plain Python + torch library (no Django).

Public surface::

    from inference.engine import AsyncEngine, EngineConfig, SamplingParams
    engine = AsyncEngine(EngineConfig(model="/path/to/hf-folder"))
    async for delta in engine.generate(prompt_token_ids, SamplingParams(max_tokens=64)):
        print(delta.text, end="")
"""

from typing import TYPE_CHECKING

from inference.engine.config import EngineConfig
from inference.engine.errors import EngineBusyError, EngineError, PromptTooLongError
from inference.engine.outputs import Delta, RequestFigures
from inference.engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # imported lazily at run time (__getattr__ below)
    from inference.engine.async_engine import AsyncEngine

__all__ = [
    "AsyncEngine",
    "Delta",
    "EngineBusyError",
    "EngineConfig",
    "EngineError",
    "PromptTooLongError",
    "RequestFigures",
    "SamplingParams",
]


def __getattr__(name: str) -> object:
    # AsyncEngine pulls in torch and transformers; import it only when asked for so
    # that light users (settings, validation) stay fast to import.
    if name == "AsyncEngine":
        from inference.engine.async_engine import AsyncEngine

        return AsyncEngine
    raise AttributeError(name)
