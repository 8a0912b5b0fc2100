"""Tool calls in the Hermes format (Hermes, Qwen2.5, Qwen3, SmolLM3 templates):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`constraint` gives the xgrammar structural tag that makes `tool_choice: required` or a
named function always produce such calls; `HermesParser` turns a reply's text into
OpenAI's content and `tool_calls`, whole or as stream deltas. One parser serves both, so a
streamed reply adds up to the same message as the unstreamed one.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from chatapp.openai_api.protocol import NamedToolChoice, Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# The call as the grammar writes it: the name first, so both it and the arguments can be
# streamed as they come.
CALL_HEAD = OPEN + '\n{"name": "'
ARGS_KEY = '", "arguments": '
CALL_END = "}\n" + CLOSE
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


def constraint(tools: list[Tool], choice: str | NamedToolChoice, parallel: bool) -> str:
    """The structural tag (JSON) of a reply made of tool calls only: one or more of any
    tool for "required" (one when not `parallel`), exactly one of the named one."""
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    tags = [
        {
            "type": "tag",
            "begin": CALL_HEAD + t.function.name + ARGS_KEY,
            # One space at most where JSON allows any: the model's own style, `{"a": 1}`,
            # fits; a run of blank space that never ends does not.
            "content": {
                "type": "json_schema",
                "json_schema": parameters(t),
                "max_whitespace_cnt": 1,
            },
            "end": CALL_END,
        }
        for t in tools
        if named is None or t.function.name == named
    ]
    fmt: dict[str, Any] = (
        tags[0]
        if named is not None
        else {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
    )
    return json.dumps({"type": "structural_tag", "format": fmt})


def parameters(tool: Tool) -> dict[str, Any]:
    # OpenAI: a function without parameters takes an empty object.
    return tool.function.parameters or {"type": "object", "properties": {}}


def template_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """The tools as chat templates read them (OpenAI's shape, nulls left out)."""
    return [t.model_dump(exclude_none=True) for t in tools] if tools else None


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class _Call:
    id: str
    name: str
    arguments: str = ""  # the text sent so far (all of it once the call is complete)


def _partial_suffix(text: str, marker: str) -> int:
    """How many trailing characters of `text` could begin `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _whole_call(body: str) -> tuple[str, str] | None:
    """A complete call's name and arguments text, or None if the body is no call. The
    arguments are the raw text after `"arguments":` (what streaming sent) when that is
    the call's last field; otherwise the parsed value written again."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    args = call.get("arguments", call.get("parameters", {}))
    if isinstance(args, str):
        return call["name"], args
    head = _HEAD.match(body)
    if head is not None:
        raw = body[head.end() :].rstrip()
        raw = raw[:-1].rstrip() if raw.endswith("}") else raw
        try:
            if json.loads(raw) == args:
                return call["name"], raw
        except ValueError:
            pass
    return call["name"], json.dumps(args, ensure_ascii=False)


class HermesParser:
    """A reply's text, fed as it comes, as OpenAI message deltas: content before the first
    `<tool_call>`, then each call's id and name, then its arguments bit by bit. A block that
    does not parse as a call becomes content at the end."""

    def __init__(self, parallel: bool = True) -> None:
        self.parallel = parallel
        self.text = ""
        self.content_sent = ""
        self.calls: list[_Call] = []
        self._call_of_block: dict[int, int] = {}
        self._failed: list[str] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        self.text += text
        return self._advance(final=False)

    def finish(self) -> list[dict[str, Any]]:
        return self._advance(final=True)

    @property
    def content(self) -> str | None:
        return self.content_sent or None

    def tool_calls(self) -> list[dict[str, Any]]:
        return [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in self.calls
        ]

    def _advance(self, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        first = self.text.find(OPEN)
        blocks = self._blocks(first, final) if first != -1 else []
        for i, (body, complete) in enumerate(blocks):
            if not self.parallel and self.calls and i not in self._call_of_block:
                break  # one call asked for: the rest is dropped
            out.extend(self._call_deltas(i, body, complete))
        if first == -1:
            head = self.text
            if not final:  # hold back what may still turn into a marker or a call's lead-in
                head = head[: len(head) - _partial_suffix(head, OPEN)].rstrip()
        elif self.calls:
            head = self.text[:first].rstrip() + "".join(self._failed)
        else:
            head = self.text if final else self.text[:first].rstrip()
        if head.startswith(self.content_sent) and len(head) > len(self.content_sent):
            out.insert(0, {"content": head[len(self.content_sent) :]})
            self.content_sent = head
        return out

    def _blocks(self, first: int, final: bool) -> list[tuple[str, bool]]:
        """Each `<tool_call>` block's body and whether it is closed (or, at the end, whole)."""
        blocks, pos = [], first
        while pos != -1:
            start = pos + len(OPEN)
            end = self.text.find(CLOSE, start)
            if end == -1:
                body = self.text[start:]
                if not final:
                    body = body[: len(body) - _partial_suffix(body, CLOSE)]
                blocks.append((body, final))
                break
            blocks.append((self.text[start:end], True))
            pos = self.text.find(OPEN, end + len(CLOSE))
        self._failed = []
        return blocks

    def _call_deltas(self, block: int, body: str, complete: bool) -> list[dict[str, Any]]:
        head = _HEAD.match(body)
        whole = _whole_call(body) if complete else None
        index = self._call_of_block.get(block)
        out: list[dict[str, Any]] = []
        if index is None:
            if whole is None and head is None:
                if complete:
                    self._failed.append("\n" + OPEN + body + CLOSE)
                return out  # not (yet) known to be a call
            name = whole[0] if whole else json.loads('"' + head.group(1) + '"')  # type: ignore[union-attr]
            index = self._call_of_block[block] = len(self.calls)
            self.calls.append(_Call(_call_id(), name))
            out.append(self._tool_delta(index, id=self.calls[index].id, name=name))
        call = self.calls[index]
        if whole is not None:
            args = whole[1]
        elif complete or head is None:
            args = body[head.end() :].strip() if head else ""  # a broken call: as it came
        else:
            # Closing braces and spaces may be the call's own end: held back until known.
            args = body[head.end() :].rstrip(" \t\r\n}")
            if not args.startswith("{"):
                args = ""  # a string or other value: sent whole once the call is
        if args.startswith(call.arguments) and len(args) > len(call.arguments):
            out.append(self._tool_delta(index, arguments=args[len(call.arguments) :]))
            call.arguments = args
        return out

    @staticmethod
    def _tool_delta(
        index: int, id: str | None = None, name: str | None = None, arguments: str = ""
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {"index": index}
        if id is not None:
            entry.update(id=id, type="function", function={"name": name, "arguments": ""})
        else:
            entry["function"] = {"arguments": arguments}
        return {"tool_calls": [entry]}


class ForwardedCalls(HermesParser):
    """The tool calls an upstream engine parsed itself (its deltas' `tool_calls`, OpenAI's
    stream shape), passed on as they come under this reply's own indices, beside its
    text as content; read as HermesParser's are."""

    def __init__(self, parallel: bool = True) -> None:
        super().__init__(parallel)
        self._index: dict[int, int] = {}

    def feed(self, text: str, calls: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if text:
            out.append({"content": text})
            self.content_sent += text
        for entry in calls or ():
            function = entry.get("function") or {}
            theirs = entry.get("index", 0)
            index = self._index.get(theirs)
            if index is None:
                if not self.parallel and self.calls:
                    continue  # one call asked for: the rest is dropped
                index = self._index[theirs] = len(self.calls)
                call = _Call(entry.get("id") or _call_id(), str(function.get("name") or ""))
                self.calls.append(call)
                out.append(self._tool_delta(index, id=call.id, name=call.name))
            arguments = str(function.get("arguments") or "")
            if arguments:
                self.calls[index].arguments += arguments
                out.append(self._tool_delta(index, arguments=arguments))
        return out

    def finish(self) -> list[dict[str, Any]]:
        return []
