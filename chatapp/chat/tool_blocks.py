"""Tool calls and their results in an imported conversation, as text a person reads.

A ChatGPT export keeps the assistant's calls to its tools (browsing, code, image
generation, a GPT's actions) and what they answered as messages of their own: a call is an
assistant message addressed to the tool (its `recipient`), holding JSON arguments or code;
a result is a `tool` message. Each becomes a fenced block whose info string says which,

    ```tool-call browser
    search("tasca alfama")
    ```

which the chat UI shows as a collapsed "Called tool `browser`" block
(frontend/src/markdown.ts), and which reads plainly anywhere else: an export, the prompt of
the conversation's next turn.
"""

from __future__ import annotations

import json
import re
from typing import Any

CALL, RESULT = "tool-call", "tool-result"
# A browsing dump can run to megabytes; the block keeps its start, which says what it was.
MAX_BODY_CHARS = 20_000
NAME = re.compile(r"[^\w.:/-]")
BACKTICKS = re.compile(r"`+")


def block(kind: str, name: str, body: str) -> str:
    """The fenced block of a call or a result; JSON is indented, anything else kept as is."""
    name = NAME.sub("_", name)[:80] or "tool"
    body = _indented(body)
    if len(body) > MAX_BODY_CHARS:
        body = body[:MAX_BODY_CHARS] + "\n… (cut short on import)"
    longest = max((len(run) for run in BACKTICKS.findall(body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{kind} {name}\n{body}\n{fence}"


def _indented(body: str) -> str:
    try:
        value = json.loads(body)
    except ValueError:
        return body.strip("\n")
    if isinstance(value, dict | list):
        return json.dumps(value, indent=2, ensure_ascii=False)
    return body.strip("\n")


def content_text(content: dict[str, Any]) -> str:
    """What a call or a result says, from the content types ChatGPT writes them in ("" for
    one it has nothing readable in)."""
    kind = content.get("content_type")
    if kind in ("code", "execution_output"):
        return _str(content.get("text"))
    if kind == "tether_browsing_display":
        return _str(content.get("result")) or _str(content.get("summary"))
    if kind == "tether_quote":
        head = " ".join(p for p in (_str(content.get("title")), _str(content.get("url"))) if p)
        return "\n\n".join(p for p in (head, _str(content.get("text"))) if p)
    if kind == "system_error":
        return ": ".join(p for p in (_str(content.get("name")), _str(content.get("text"))) if p)
    parts = content.get("parts")
    if kind in ("text", "multimodal_text") and isinstance(parts, list):
        pieces = [
            p if isinstance(p, str) else "[an image, not imported]"
            for p in parts
            if isinstance(p, str) or (isinstance(p, dict) and _is_image(p))
        ]
        return "\n\n".join(p for p in pieces if p.strip())
    return ""


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _is_image(part: dict[str, Any]) -> bool:
    return str(part.get("content_type", "")).startswith("image")
