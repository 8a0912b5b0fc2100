"""settings.ENGINE's engine part, generated from EngineConfig's fields: each field FIELD
is read from the variable ENGINE_<FIELD> (its type from the field's default), so a field
added to the engine is a setting at once, and each default is written once, in the
dataclass. Only the differences are listed here."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from chatapp.settings.env import env_bool, env_float, env_int, env_str
from inference.catalog import ModelSpec, parse_model_list
from inference.engine.config import EngineConfig
from inference.model_files import default_model_path

# Fields read from another variable than ENGINE_<FIELD>.
VARIABLES = {"model": "CHATAPP_MODEL"}
# Defaults of the web app that differ from the engine library's: the converted bundled
# model; the Redis tier on (docs/kv-tier.md: memory-only while nobody answers there);
# speculation "auto" (prompt lookup while batches are small: measured to win or tie at 1,
# 16 and 64 users on quoting and open-ended requests, docs/performance.md, "Speculation").
DEFAULTS: dict[str, Any] = {
    "model": str(default_model_path()),
    "kv_tier_url": "redis://127.0.0.1:6379/4",
    "speculative_mode": "auto",
}


def variable(field: str) -> str:
    return VARIABLES.get(field, f"ENGINE_{field.upper()}")


def _read(name: str, default: Any) -> Any:
    if isinstance(default, bool):
        return env_bool(name, default)
    if isinstance(default, int):
        return env_int(name, default)
    if isinstance(default, float):
        return env_float(name, default)
    if isinstance(default, str):
        return env_str(name, default)
    raise TypeError(f"EngineConfig.{name}: no reader for a {type(default).__name__} setting")


def engine_settings() -> dict[str, Any]:
    """{FIELD: value} for every EngineConfig field, from the environment."""
    return {
        f.name.upper(): _read(variable(f.name), DEFAULTS.get(f.name, f.default))
        for f in dataclasses.fields(EngineConfig)
    }


def served_model_list(raw: str) -> list[ModelSpec]:
    """CHATAPP_MODELS' entries; a malformed one stops the process at start, saying why."""
    try:
        return parse_model_list(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from exc
