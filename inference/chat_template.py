"""Build prompt token ids from a conversation with the model's chat template, so that
turn N+1's prompt is an exact token-for-token extension of turn N's prompt plus reply.

Re-tokenizing a whole rendered conversation each turn breaks that: a reply the model
produced as one sequence of ids may tokenize differently as text, and then the engine's
prefix cache misses. So assistant replies are spliced in as the ids the engine produced,
and only the template's own markers and user/system text are tokenized.

The template is probed once per tokenizer with a placeholder message to learn each
role's head and tail text (e.g. ``<|im_start|>user\\n`` and ``<|im_end|>\\n`` for ChatML),
the preamble some templates add before the first message, and the generation prompt.
The probe is then checked against ``apply_chat_template`` on a sample conversation;
if assembling the pieces does not reproduce it exactly, the builder falls back to
tokenizing the whole rendered conversation (correct, just without the guarantee).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

_PH = "\u2063PLACEHOLDER\u2063"
# The Hermes tool-call markers (tool_calls.py in the API parses what is between them).
HERMES_OPEN = "<tool_call>"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "d",
        "parameters": {"type": "object", "properties": {}},
    },
}


@dataclass
class Turn:
    role: str  # "system" | "user" | "assistant"
    text: str
    # For an assistant turn: the ids the engine generated (end token included).
    token_ids: list[int] | None = None


@dataclass
class Prompt:
    """A request's prompt in whatever form the engine behind the client takes."""

    token_ids: list[int] | None = None  # our engine: exact ids
    messages: list[dict[str, str]] | None = None  # an upstream chat endpoint
    text: str | None = None  # an upstream completions endpoint
    # The ids of the newest user turn (stored with the message), when known.
    user_token_ids: list[int] = field(default_factory=list)

    @property
    def length(self) -> int | None:
        return None if self.token_ids is None else len(self.token_ids)


@dataclass
class _Affixes:
    head: dict[str, str] = field(default_factory=dict)
    tail: dict[str, str] = field(default_factory=dict)
    # Text the template puts before the first message when it is not a system message
    # (SmolLM2's template injects a default system prompt there).
    preamble_without_system: str = ""
    generation_prompt: str = ""


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short id of what turns text into ids and back here: the vocabulary and merges,
    the special tokens, the end-of-turn ids and the chat template. Two models with equal
    fingerprints take each other's token ids unchanged; others never get them."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = (
        backend.to_str()
        if backend is not None
        else json.dumps(sorted(tokenizer.get_vocab().items()))
    )
    eos = tokenizer.eos_token_id
    parts = [
        vocab,
        json.dumps(sorted(tokenizer.all_special_tokens)),
        json.dumps(eos if isinstance(eos, list) else [eos]),
        str(getattr(tokenizer, "chat_template", "") or ""),
    ]
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()


class PromptBuilder:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_texts = self._eos_texts()
        self._affixes: _Affixes | None = None
        self.exact = False
        try:
            self._affixes = self._probe()
            self.exact = self._self_check()
        except Exception:  # a template that refuses our probe: fall back, loudly
            log.exception("chat template probe failed; prompts will be re-tokenized")
        if not self.exact:
            log.warning("chat template is not splittable; prefix reuse across turns is off")
        self.tool_format = self._tool_format()

    # --- public -------------------------------------------------------------------

    def build(self, turns: list[Turn], add_generation_prompt: bool = True) -> list[int]:
        """Prompt ids for `turns`, ending with the assistant generation prompt."""
        if not self.exact:
            return self._render_ids(turns, add_generation_prompt)
        return self._assemble(turns, add_generation_prompt)

    def build_with_tools(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """Prompt ids for OpenAI-shaped messages (assistant `tool_calls`, `tool` results)
        and tool definitions, rendered whole by the template: its tool section and call
        format cannot be probed turn by turn, so these prompts are tokenized as text."""
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=True
        )
        return self._encode(text)

    def public_openings(self, system_prompt: str = "") -> list[list[int]]:
        """Token ids a conversation may open with that are no user's own text: for a
        server-wide `system_prompt` (public: every user sees it in their settings), its system
        turn and the user head after it. Empty without one, or when the template is not
        splittable (nothing is then known to be public)."""
        a = self._affixes
        if not self.exact or a is None or not system_prompt.strip():
            return []
        system = self.turn_ids(Turn("system", system_prompt), first=True)
        return [system + self._encode(a.head["user"])]

    def turn_ids(self, turn: Turn, first: bool = False) -> list[int]:
        """The ids one turn contributes to the conversation's token stream."""
        a = self._affixes
        assert a is not None
        head = a.head[turn.role]
        tail = a.tail[turn.role]
        if first and turn.role != "system":
            head = a.preamble_without_system + head
        if turn.role == "assistant" and turn.token_ids is not None:
            generated = list(turn.token_ids)
            if generated and generated[-1] in self._eos_ids():
                # The reply already ends with the end-of-turn token the tail starts with.
                for eos_text in self.eos_texts:
                    if tail.startswith(eos_text):
                        tail = tail[len(eos_text) :]
                        break
            return self._encode(head) + generated + self._encode(tail)
        return self._encode(head + turn.text + tail)

    # --- probing ------------------------------------------------------------------

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _render_ids(self, turns: list[Turn], add_generation_prompt: bool) -> list[int]:
        text = self._render(
            [{"role": t.role, "content": t.text} for t in turns], add_generation_prompt
        )
        return self._encode(text)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _eos_ids(self) -> set[int]:
        ids = self.tokenizer.eos_token_id
        return set(ids if isinstance(ids, list) else [ids]) if ids is not None else set()

    def _eos_texts(self) -> list[str]:
        return [self.tokenizer.decode([i]) for i in sorted(self._eos_ids())]

    def _probe(self) -> _Affixes:
        a = _Affixes()
        sys_msg = {"role": "system", "content": "S"}
        base = self._render([sys_msg])
        for role in ("user", "assistant", "system"):
            text = self._render([sys_msg, {"role": role, "content": _PH}])
            if not text.startswith(base):
                raise ValueError("template output is not append-only")
            seg = text[len(base) :]
            a.head[role], a.tail[role] = seg.split(_PH)
        # What comes before the first message when it is not a system message.
        first_user = self._render([{"role": "user", "content": _PH}])
        a.preamble_without_system = first_user.split(_PH)[0][: -len(a.head["user"]) or None]
        if a.head["user"] and not first_user.split(_PH)[0].endswith(a.head["user"]):
            raise ValueError("first-turn head differs from later heads")
        with_gen = self._render([sys_msg], add_generation_prompt=True)
        a.generation_prompt = with_gen[len(base) :]
        # A system message first: its head must match the system head as probed.
        first_sys = self._render([{"role": "system", "content": _PH}]).split(_PH)[0]
        if first_sys != a.head["system"]:
            raise ValueError("first system head differs")
        return a

    def _tool_format(self) -> str | None:
        """The tool-call format the template teaches the model, if one this server parses:
        "hermes" (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, Hermes, Qwen2.5,
        Qwen3, SmolLM3). None when the template ignores `tools` (it renders the same with
        and without them) or writes calls some other way."""
        source = str(getattr(self.tokenizer, "chat_template", "") or "")
        if HERMES_OPEN not in source:
            return None
        user = [{"role": "user", "content": "Hi"}]
        try:
            with_tools = self.tokenizer.apply_chat_template(
                user, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True
            )
            without = self._render(user, add_generation_prompt=True)
        except Exception:  # a template that breaks on tools cannot serve them
            log.exception("chat template fails with tools; tool calling is off")
            return None
        return "hermes" if with_tools != without and "probe_tool" in with_tools else None

    def _self_check(self) -> bool:
        sample = [
            Turn("user", "Hello there!"),
            Turn("assistant", "Hi. How can I help?"),
            Turn("user", "Tell me a joke about caches.\nTwo lines."),
        ]
        for turns in (sample, [Turn("system", "Be brief."), *sample]):
            if self._assemble(turns, True) != self._render_ids(turns, True):
                return False
        return True

    def _assemble(self, turns: list[Turn], add_generation_prompt: bool) -> list[int]:
        """The prompt from the probed pieces, turn by turn."""
        assert self._affixes is not None
        ids: list[int] = []
        for i, turn in enumerate(turns):
            ids.extend(self.turn_ids(turn, first=(i == 0)))
        if add_generation_prompt:
            ids.extend(self._encode(self._affixes.generation_prompt))
        return ids
