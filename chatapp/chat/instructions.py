"""Custom instructions (docs/http.md, "Custom instructions"): what a user says about
themselves and how they want answers, applied to each new chat of theirs as its system
prompt, as ChatGPT does. A chat keeps the prompt it started with: editing the instructions
changes the chats started afterwards, and a chat's own settings can still change its prompt.
"""

from __future__ import annotations

from typing import Any

from chatapp.chat.conversations import InvalidSettings
from chatapp.chat.models import CustomInstructions
from chatapp.text import clean_text

MAX_CHARS = 1500  # each of the two texts, as ChatGPT allows
FIELDS = {"about": "What the assistant should know about you", "style": "How it should answer"}


def of(user: Any) -> dict[str, str]:
    row = CustomInstructions.objects.filter(user=user).first()
    return {"about": row.about if row else "", "style": row.style if row else ""}


def system_prompt(about: str, style: str) -> str:
    """The two texts as one system prompt ("" when both are empty)."""
    parts = []
    if about.strip():
        parts.append(f"About the user:\n{about.strip()}")
    if style.strip():
        parts.append(f"How to answer:\n{style.strip()}")
    return "\n\n".join(parts)


def prompt_of(user: Any) -> str:
    """The system prompt a new chat of `user` starts with."""
    return system_prompt(**of(user))


def with_instructions(user: Any, conv_settings: dict[str, Any]) -> dict[str, Any]:
    """A new chat's settings: its own system prompt when it names one, else the user's
    custom instructions."""
    if "system_prompt" in conv_settings:
        return conv_settings
    prompt = prompt_of(user)
    return {**conv_settings, "system_prompt": prompt} if prompt else conv_settings


def save(user: Any, data: Any) -> dict[str, str]:
    """Store both texts (a missing one is kept as it was); InvalidSettings says why not."""
    if not isinstance(data, dict):
        raise InvalidSettings("The instructions must be an object.")
    unknown = set(data) - set(FIELDS)
    if unknown:
        raise InvalidSettings(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    values = of(user)
    for name, label in FIELDS.items():
        if name in data:
            raw = data[name]
            if isinstance(raw, str) and len(raw) > MAX_CHARS:
                raise InvalidSettings(f"{label}: at most {MAX_CHARS:,} characters.")
            values[name] = clean_text(raw, label, MAX_CHARS, allow_empty=True)
    CustomInstructions.objects.update_or_create(user=user, defaults=values)
    return values


def as_json(values: dict[str, str]) -> dict[str, Any]:
    return {**values, "max_chars": MAX_CHARS, "system_prompt": system_prompt(**values)}
