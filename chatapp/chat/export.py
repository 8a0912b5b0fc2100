"""A conversation as Markdown or JSON (the active branch)."""

from __future__ import annotations

from typing import Any

from chatapp import conversations as conv_logic
from chatapp.models import Conversation


def conversation_payload(conv: Conversation) -> dict[str, Any]:
    return {
        "conversation": conv_logic.conversation_json(conv),
        "messages": [conv_logic.message_json(m) for m in conv_logic.active_branch(conv)],
    }


def conversation_markdown(conv: Conversation) -> str:
    lines = [f"# {conv.title or 'Conversation'}", ""]
    if conv.system_prompt.strip():
        lines += ["**System:**", "", conv.system_prompt, ""]
    for m in conv_logic.active_branch(conv):
        who = {"user": "You", "assistant": "Assistant"}.get(m.role, m.role.title())
        lines += [f"**{who}:**", "", m.text, ""]
    return "\n".join(lines)
