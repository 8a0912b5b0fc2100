"""Conversations brought in from a file: a ChatGPT export (`conversations.json`, or the
zip it comes in) or this app's own JSON export (one conversation, or the export job's
list of them, or its zip).

The file is read as a stream (ijson), one conversation at a time, and all of it is
checked before anything is written: a file with anything wrong in it imports nothing, and
the error names the conversation and what is wrong. The writes then go in short
transactions, so that other users' writes never wait long behind an import (write_all).
Imported messages carry no token ids; the next turn tokenizes the history from its text
(docs/http.md, "Import").
"""

from __future__ import annotations

import io
import logging
import math
import re
import tempfile
import time
import zipfile
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

import ijson
from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from chatapp.chat import attachments, tool_blocks
from chatapp.chat.conversations import InvalidSettings, clean_settings
from chatapp.chat.models import Attachment, Conversation, Message
from inference.client import EngineClient, default_model, list_models, loaded_clients
from inference.engine import EngineError

log = logging.getLogger(__name__)

# ChatGPT content types whose parts are what a person reads; the others (hidden reasoning,
# custom instructions, ...) are left out, and tools' calls and output are read as blocks
# (tool_blocks).
CHATGPT_TEXT_TYPES = frozenset({"text", "multimodal_text", "code"})
MAX_MESSAGE_CHARS = 1_000_000
MAX_DEPTH = 64  # a ChatGPT export nests about 8 deep
# A reply's figures as the chat stores them (chatapp/chat/generation.py, message_figures):
# these numbers, and `replayed`. Whatever else a file's figures hold is left out.
FIGURE_NUMBERS = frozenset(
    {
        "ttft_ms",
        "output_tokens",
        "tokens_per_s",
        "prompt_tokens",
        "cached_tokens",
        "cached_tokens_redis",
        "e2e_ms",
        "queue_ms",
    }
)
_ZIP_MAGIC = b"PK\x03\x04"
# Writes go in transactions this short, with this pause after each (write_all).
WRITE_BATCH_S = 0.01
WRITE_PAUSE_S = 0.01


class ImportRefused(Exception):
    """The file cannot be imported; `message` says why, and nothing was written."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_import") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


@dataclass
class Node:
    """One message to write: `parent` is another Node's key in the same conversation."""

    key: str
    role: str
    text: str
    parent: str | None
    created: float = 0.0
    order: int = 0  # place in the file, after `created` among siblings
    documents: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)  # a reply's, from this app's export


@dataclass
class Incoming:
    title: str
    settings: dict[str, Any]
    nodes: list[Node]  # parents before children, siblings oldest first
    active: str | None  # the key of the leaf on screen
    created_at: datetime | None = None
    updated_at: datetime | None = None
    model: str = ""  # the conversation's model, kept when it is served here


# --- reading the upload -----------------------------------------------------------


def spool(stream: IO[bytes], limit: int) -> IO[bytes]:
    """The request body copied to a temporary file (memory up to 8 MiB, then disk), refused
    as soon as it passes `limit` bytes, whatever length it declared."""
    out = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)  # noqa: SIM115 (returned)
    total = 0
    while chunk := stream.read(1024 * 1024):
        total += len(chunk)
        if total > limit:
            out.close()
            raise too_large(limit)
        out.write(chunk)
    out.seek(0)
    return out


def too_large(limit: int) -> ImportRefused:
    return ImportRefused(
        f"The file is larger than {attachments.human_size(limit)}, the most an import "
        "takes. For a ChatGPT export, upload its conversations.json alone.",
        413,
        "too_large",
    )


class _Capped(io.RawIOBase):
    """A reader that refuses to yield more than `limit` bytes (an unzipped member that
    claims one size and inflates to another)."""

    def __init__(self, inner: IO[bytes], limit: int) -> None:
        self.inner, self.left, self.limit = inner, limit, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.inner.read(min(len(buffer), self.left + 1))
        if len(data) > self.left:
            raise too_large(self.limit)
        self.left -= len(data)
        buffer[: len(data)] = data
        return len(data)


# An escaped backslash, a surrogate pair, or a lone surrogate: matched in this order left to
# right, so "\\ud800" (a backslash, then text) is never taken for an escape.
_ESCAPES = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
)
_PAIR = 12  # bytes of a surrogate pair's two escapes


class _LoneSurrogatesReplaced(io.RawIOBase):
    """The JSON with each escaped lone surrogate ("\\udc00") turned into "\\ufffd", as
    the docs promise: the JSON parser refuses a lone low surrogate and turns a high one
    into "?"."""

    def __init__(self, inner: IO[bytes]) -> None:
        self.inner, self.carry, self.out = inner, b"", b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.out:
            chunk = self.inner.read(256 * 1024)
            if not chunk and not self.carry:
                return 0
            self.out, self.carry = self._replaced(self.carry + chunk, final=not chunk)
        n = min(len(buffer), len(self.out))
        buffer[:n], self.out = self.out[:n], self.out[n:]
        return n

    @staticmethod
    def _replaced(data: bytes, final: bool) -> tuple[bytes, bytes]:
        """(what can be passed on, what must wait for the next bytes)."""
        cut = len(data) if final else len(data) - (_PAIR - 1)
        parts, done = [], 0
        for match in _ESCAPES.finditer(data):
            if match.start() >= cut:
                break
            escape = match.group()
            lone = escape != b"\\\\" and len(escape) != _PAIR
            parts += [data[done : match.start()], b"\\ufffd" if lone else escape]
            done = match.end()
        done_to = max(done, cut)
        parts.append(data[done:done_to])
        return b"".join(parts), data[done_to:]


def open_json(upload: IO[bytes]) -> IO[bytes]:
    """The JSON inside the upload: the file itself, or the conversations.json of a zip."""
    head = upload.read(4)
    if not head:
        raise ImportRefused("The file is empty.")
    upload.seek(3 if head.startswith(b"\xef\xbb\xbf") else 0)  # past a UTF-8 BOM
    if head != _ZIP_MAGIC:
        return upload
    try:
        archive = zipfile.ZipFile(upload)
        names = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == "conversations.json"]
        if not names:
            raise ImportRefused(
                "The zip file has no conversations.json in it (a ChatGPT export or this "
                "app's export of all conversations has one)."
            )
        member = archive.open(min(names, key=len))
    except (zipfile.BadZipFile, RuntimeError, NotImplementedError) as exc:
        # RuntimeError: a password-protected member; NotImplementedError: a compression
        # method zipfile does not read.
        raise ImportRefused(f"The zip file cannot be opened ({exc}).") from exc
    return io.BufferedReader(_Capped(member, settings.CHAT_IMPORT_MAX_BYTES))


def items(raw: IO[bytes]) -> Iterator[Any]:
    """The conversations of the file, one at a time: a JSON list of them, or one object.
    Built from the parser's events with a depth limit: a hostile file nested a million deep
    is refused early, in little memory (ijson's own builders keep a path per level)."""
    events = ijson.basic_parse(raw, use_float=True)
    first = next(events, None)
    if first is None:
        raise ImportRefused("The file is empty.")  # blank after all
    if first[0] == "start_map":
        yield _build(events, first)
    elif first[0] == "start_array":
        for event in events:
            if event[0] == "end_array":
                break
            yield _build(events, event)
        for _ in events:  # what follows the list: trailing garbage raises here
            pass
    else:
        raise ImportRefused(
            "The file is not a list of conversations nor one conversation: import a ChatGPT "
            "conversations.json (or its zip) or a JSON export of this app."
        )


def _build(events: Iterator[tuple[str, Any]], first: tuple[str, Any]) -> Any:
    """One JSON value from its first event on."""
    kind, value = first
    if kind not in ("start_map", "start_array"):
        return value
    root: Any = {} if kind == "start_map" else []
    stack: list[Any] = [root]
    key: str | None = None
    keys: list[str | None] = []
    for kind, value in events:
        top = stack[-1]
        if kind == "map_key":
            key = value
            continue
        if kind in ("end_map", "end_array"):
            stack.pop()
            if not stack:
                return root
            key = keys.pop()
            continue
        if kind in ("start_map", "start_array"):
            if len(stack) >= MAX_DEPTH:
                raise ImportRefused(
                    f"Nothing was imported: the file is nested more than {MAX_DEPTH} levels "
                    "deep, which no conversation needs."
                )
            value = {} if kind == "start_map" else []
        if isinstance(top, dict):
            top[key] = value
        else:
            top.append(value)
        if kind in ("start_map", "start_array"):
            stack.append(value)
            keys.append(key)
    raise ImportRefused("Nothing was imported: the file ends in the middle of a conversation.")


# --- the two formats --------------------------------------------------------------


def _where(index: int, title: Any) -> str:
    named = f' ("{title[:60]}")' if isinstance(title, str) and title else ""
    return f"conversation {index + 1}{named}"


def _text(value: Any, what: str) -> str:
    """Text from the file, storable everywhere: NUL and lone surrogates (which no database
    stores) become U+FFFD."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be text")
    if len(value) > MAX_MESSAGE_CHARS:
        raise ValueError(f"{what} is longer than {MAX_MESSAGE_CHARS:,} characters")
    value = value.replace("\x00", "\ufffd")
    return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _time(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _datetime(value: Any) -> datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 4e9:
        return datetime.fromtimestamp(value, tz=UTC)
    if isinstance(value, str):
        try:
            parsed = parse_datetime(value)
        except ValueError:
            return None
        if parsed is not None and timezone.is_naive(parsed):
            parsed = timezone.make_aware(parsed, UTC)
        return parsed
    return None


def from_chatgpt(data: dict[str, Any]) -> Incoming:
    """A ChatGPT conversation: the tree of its `mapping`, the person's and the assistant's
    messages with text kept (system and hidden nodes left out, their children joined to
    the nearest kept ancestor), tool calls and results as blocks in the replies around
    them (_with_tool_blocks), the branch through `current_node` on screen."""
    mapping = data.get("mapping")
    if not isinstance(mapping, dict):
        raise ValueError("'mapping' must be an object of nodes")
    if len(mapping) > settings.CHAT_IMPORT_MAX_MESSAGES:
        raise ValueError(f"it has more than {settings.CHAT_IMPORT_MAX_MESSAGES:,} messages")
    parents: dict[str, str | None] = {}
    kept: dict[str, Node] = {}
    tools: dict[str, str] = {}  # calls and results, as tool_blocks writes them
    for key, node in mapping.items():
        if not isinstance(node, dict):
            raise ValueError(f"node {key[:40]!r} is not an object")
        parent = node.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise ValueError(f"node {key[:40]!r} has a parent that is not an id")
        if parent is not None and parent not in mapping:
            raise ValueError(f"node {key[:40]!r} has a parent that is not in the file")
        parents[key] = parent
        message = _chatgpt_message(node.get("message"), key)
        if message is not None:
            kept[key] = message
        else:
            tool = _chatgpt_tool(node.get("message"), key)
            if tool:
                tools[key] = tool
    _refuse_loops(parents)
    for key, message in kept.items():
        message.parent = _kept_ancestor(parents, kept, parents[key])
    _with_tool_blocks(parents, kept, tools)
    current = data.get("current_node")
    if current is not None and not isinstance(current, str):
        raise ValueError("'current_node' must be a node id")
    active = None
    if current is not None and current in mapping:
        active = current if current in kept else _kept_ancestor(parents, kept, parents[current])
    title = data.get("title")
    return Incoming(
        title=_text(title, "the title")[:200] if title is not None else "",
        settings={},
        nodes=_ordered(list(kept.values())),
        active=active,
        created_at=_datetime(data.get("create_time")),
        updated_at=_datetime(data.get("update_time")),
    )


def _chatgpt_message(message: Any, key: str) -> Node | None:
    if message is None:
        return None
    if not isinstance(message, dict):
        raise ValueError(f"node {key[:40]!r} has a message that is not an object")
    author = message.get("author")
    role = author.get("role") if isinstance(author, dict) else None
    if role not in ("user", "assistant"):
        return None  # system, tool: context the person did not write or read
    if message.get("recipient", "all") != "all":
        return None  # the assistant calling a tool
    metadata = message.get("metadata")
    if isinstance(metadata, dict) and metadata.get("is_visually_hidden_from_conversation"):
        return None
    content = message.get("content")
    if not isinstance(content, dict):
        raise ValueError(f"node {key[:40]!r} has content that is not an object")
    if content.get("content_type") not in CHATGPT_TEXT_TYPES:
        return None
    pieces: list[str] = []
    if content.get("content_type") == "code":
        pieces.append(_text(content.get("text", ""), f"the code of node {key[:40]!r}"))
    else:
        parts = content.get("parts")
        if not isinstance(parts, list):
            raise ValueError(f"node {key[:40]!r} has 'parts' that are not a list")
        for part in parts:
            if isinstance(part, str):
                pieces.append(_text(part, f"a part of node {key[:40]!r}"))
            elif not isinstance(part, dict):
                raise ValueError(f"a part of node {key[:40]!r} must be text")
            elif str(part.get("content_type", "")).startswith("image"):
                pieces.append("[an image, not imported]")
    text = "\n\n".join(p for p in pieces if p.strip())
    if not text.strip():
        return None
    return Node(key, role, text, None, _time(message.get("create_time")))


def _chatgpt_tool(message: Any, key: str) -> str | None:
    """A tool call (the assistant writing to a tool) or a tool's result, as a block; None
    for anything else, hidden ones and those with nothing readable in them."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), dict):
        return None
    author = message.get("author")
    role = author.get("role") if isinstance(author, dict) else None
    metadata = message.get("metadata")
    if isinstance(metadata, dict) and metadata.get("is_visually_hidden_from_conversation"):
        return None
    recipient = message.get("recipient", "all")
    if role == "assistant" and isinstance(recipient, str) and recipient != "all":
        kind, name = tool_blocks.CALL, recipient
    elif role == "tool":
        named = author.get("name") if isinstance(author, dict) else None
        kind, name = tool_blocks.RESULT, named if isinstance(named, str) else "tool"
    else:
        return None
    body = tool_blocks.content_text(message["content"])
    if not body.strip():
        return None
    return _text(tool_blocks.block(kind, name, body), f"the tool message of node {key[:40]!r}")


def _with_tool_blocks(
    parents: dict[str, str | None], kept: dict[str, Node], tools: dict[str, str]
) -> None:
    """Each reply starts with the tool calls and results between it and the message before
    it; those no reply follows (the person spoke next, or the conversation ends there) go
    at the end of the reply that made them."""
    used: set[str] = set()
    for key, message in kept.items():
        if message.role != "assistant":
            continue
        above = _tools_above(parents, kept, tools, parents[key])
        if above:
            message.text = "\n\n".join([*(tools[k] for k in above), message.text])
            used.update(above)
    after: dict[str, list[str]] = {}
    for key in tools:
        owner = _kept_ancestor(parents, kept, parents[key])
        if key not in used and owner is not None and kept[owner].role == "assistant":
            after.setdefault(owner, []).append(key)
    for owner, keys in after.items():
        keys.sort(key=lambda k: len(_tools_above(parents, kept, tools, k)))
        kept[owner].text = "\n\n".join([kept[owner].text, *(tools[k] for k in keys)])


def _tools_above(
    parents: dict[str, str | None], kept: dict[str, Node], tools: dict[str, str], start: str | None
) -> list[str]:
    """The tool nodes from `start` up to the nearest kept node, first one first (the
    parents were checked for loops)."""
    found: list[str] = []
    node = start
    while node is not None and node not in kept:
        if node in tools:
            found.append(node)
        node = parents[node]
    return found[::-1]


def _refuse_loops(parents: dict[str, str | None]) -> None:
    """Every node must lead up to a root; each is walked once (`rooted` remembers)."""
    rooted: set[str] = set()
    for start in parents:
        trail: list[str] = []
        on_trail: set[str] = set()
        node: str | None = start
        while node is not None and node not in rooted:
            if node in on_trail:
                raise ValueError("its nodes' parents go round in a loop")
            trail.append(node)
            on_trail.add(node)
            node = parents[node]
        rooted.update(trail)


def _kept_ancestor(
    parents: dict[str, str | None], kept: dict[str, Node], start: str | None
) -> str | None:
    """The nearest kept node at or above `start`; a loop in the parents is refused."""
    seen: set[str] = set()
    node = start
    while node is not None and node not in kept:
        if node in seen:
            raise ValueError("its nodes' parents go round in a loop")
        seen.add(node)
        node = parents.get(node)
    return node


def _ordered(nodes: list[Node]) -> list[Node]:
    """Parents before children (breadth first from the roots), siblings by time then
    file order: the order the messages are written in, so alternatives keep their order."""
    children: dict[str | None, list[Node]] = {}
    for i, n in enumerate(nodes):
        children.setdefault(n.parent, []).append(n)
        n.order = i
    out: list[Node] = []
    queue = deque(sorted(children.get(None, []), key=_sibling_order))
    while queue:
        node = queue.popleft()
        out.append(node)
        queue.extend(sorted(children.get(node.key, []), key=_sibling_order))
    if len(out) != len(nodes):
        raise ValueError("its nodes' parents go round in a loop")
    return out


def _sibling_order(n: Node) -> tuple[float, int]:
    return (n.created, n.order)


def from_own(data: dict[str, Any]) -> Incoming:
    """This app's export (chatapp/chat/export.py): `messages` is the branch on screen,
    `other_messages` the other branches; `parent_id`s tie them together."""
    conv = data.get("conversation")
    if not isinstance(conv, dict):
        raise ValueError("'conversation' must be an object")
    shown = data.get("messages")
    others = data.get("other_messages", [])
    if not isinstance(shown, list) or not isinstance(others, list):
        raise ValueError("'messages' and 'other_messages' must be lists")
    if len(shown) + len(others) > settings.CHAT_IMPORT_MAX_MESSAGES:
        raise ValueError(f"it has more than {settings.CHAT_IMPORT_MAX_MESSAGES:,} messages")
    nodes: dict[str, Node] = {}
    for raw in [*shown, *others]:
        node = _own_message(raw)
        if node.key in nodes:
            raise ValueError(f"message id {node.key} appears twice")
        nodes[node.key] = node
    for node in nodes.values():
        if node.parent is not None and node.parent not in nodes:
            raise ValueError(f"message {node.key} has a parent that is not in the file")
    previous: str | None = None
    for raw in shown:  # the branch on screen must be a chain from the root
        node = nodes[str(raw["id"])]
        if node.parent != previous and not (previous is None and node.parent is None):
            raise ValueError("'messages' is not one branch from the first message down")
        previous = node.key
    try:
        conv_settings = clean_settings(conv.get("settings") or {})
    except InvalidSettings as exc:
        raise ValueError(f"its settings are refused: {exc}") from exc
    title = conv.get("title", "")
    order = {key: i for i, key in enumerate(sorted(nodes, key=_id_order))}
    for node in nodes.values():
        node.created = float(order[node.key])
    return Incoming(
        title=_text(title, "the title")[:200],
        settings=conv_settings,
        nodes=_ordered(list(nodes.values())),
        active=previous,
        created_at=_datetime(conv.get("created_at")),
        updated_at=_datetime(conv.get("updated_at")),
        model=conv["model"] if isinstance(conv.get("model"), str) else "",
    )


def _id_order(key: str) -> tuple[int, str]:
    return (int(key), "") if key.lstrip("-").isdigit() else (0, key)


def _own_message(raw: Any) -> Node:
    if not isinstance(raw, dict):
        raise ValueError("a message is not an object")
    key = raw.get("id")
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise ValueError("a message has no id")
    role = raw.get("role")
    if role not in ("user", "assistant"):
        raise ValueError(f"message {key}: role must be 'user' or 'assistant'")
    parent = raw.get("parent_id")
    if parent is not None and (isinstance(parent, bool) or not isinstance(parent, int | str)):
        raise ValueError(f"message {key}: 'parent_id' must be an id")
    documents = raw.get("attachments", []) if role == "user" else []
    if not isinstance(documents, list) or len(documents) > settings.CHAT_ATTACHMENTS_PER_MESSAGE:
        raise ValueError(
            f"message {key}: 'attachments' must be a list of at most "
            f"{settings.CHAT_ATTACHMENTS_PER_MESSAGE}"
        )
    return Node(
        key=str(key),
        role=role,
        text=_text(raw.get("text", ""), f"the text of message {key}"),
        parent=None if parent is None else str(parent),
        documents=[_own_document(d, key) for d in documents],
        figures=_own_figures(raw) if role == "assistant" else {},
    )


def _own_figures(raw: dict[str, Any]) -> dict[str, Any]:
    """A reply's figures: its `figures`, or `stats` in an export written before they were
    renamed. Numbers that are not numbers are left out, not refused: they are only shown."""
    given = raw.get("figures", raw.get("stats"))
    if not isinstance(given, dict):
        return {}
    kept: dict[str, Any] = {}
    for name, value in given.items():
        if name == "replayed" and value is True:
            kept[name] = True
        elif name in FIGURE_NUMBERS and (
            value is None
            or (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value >= 0  # counts and durations: a negative one is not a figure
            )
        ):
            kept[name] = value
    return kept


def _own_document(raw: Any, key: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"message {key}: an attachment is not an object")
    text = _text(raw.get("text"), f"the text of an attachment of message {key}")
    if len(text) > settings.CHAT_ATTACHMENT_MAX_CHARS:
        raise ValueError(f"message {key}: an attachment holds more text than is allowed")
    kind = raw.get("kind", Attachment.Kind.TEXT)
    if kind not in Attachment.Kind.values:
        raise ValueError(f"message {key}: an attachment's kind must be 'text' or 'pdf'")
    size, tokens = raw.get("size", 0), raw.get("tokens")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 2**62:
        raise ValueError(f"message {key}: an attachment's size must be a number of bytes")
    if tokens is not None and (
        isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens < 2**31
    ):
        raise ValueError(f"message {key}: an attachment's tokens must be a count")
    return {
        "name": attachments.clean_name(raw.get("name")),
        "kind": kind,
        "size": size,
        "tokens": tokens,
        "text": text,
    }


def parse(index: int, data: Any) -> Incoming:
    """One conversation of the file, in either format, or ImportRefused naming it."""
    title = data.get("title") if isinstance(data, dict) else None
    if isinstance(data, dict) and isinstance(data.get("conversation"), dict):
        title = data["conversation"].get("title")
    try:
        if not isinstance(data, dict):
            raise ValueError("it is not an object")
        if "mapping" in data:
            return from_chatgpt(data)
        if "conversation" in data and "messages" in data:
            return from_own(data)
        raise ValueError(
            "it is neither a ChatGPT conversation (with a 'mapping') nor this app's export "
            "(with 'conversation' and 'messages')"
        )
    except ValueError as exc:
        raise ImportRefused(f"Nothing was imported: {_where(index, title)}: {exc}.") from exc


def _first_line(exc: Exception) -> str:
    """yajl's message without the excerpt it draws under it."""
    text = str(exc)
    if text.startswith(("b'", 'b"')):
        text = text[2:].split("\\n")[0]
    return text.strip().splitlines()[0].rstrip(".") if text.strip() else "it ends early"


# --- writing ----------------------------------------------------------------------


def import_file(user: Any, upload: IO[bytes]) -> list[Conversation]:
    """Every conversation of the file for `user`, or none (ImportRefused). A conversation
    whose model is not served here goes on with the default model."""
    incoming = read_all(upload)
    if not incoming:
        raise ImportRefused("Nothing was imported: the file holds no conversation with messages.")
    return write_all(user, incoming)


def read_all(upload: IO[bytes]) -> list[Incoming]:
    """The conversations of the file with messages, all checked before any is written."""
    raw = io.BufferedReader(_LoneSurrogatesReplaced(open_json(upload)))
    try:
        served = {m.id for m in list_models()}
    except EngineError:
        served = set()
    found: list[Incoming] = []
    try:
        for index, data in enumerate(items(raw)):
            if index >= settings.CHAT_IMPORT_MAX_CONVERSATIONS:
                raise ImportRefused(
                    "Nothing was imported: the file holds more than "
                    f"{settings.CHAT_IMPORT_MAX_CONVERSATIONS:,} conversations."
                )
            incoming = parse(index, data)
            if incoming.model not in served:
                incoming.model = ""
            if incoming.nodes:  # a conversation with nothing to read is left out
                found.append(incoming)
    except ijson.JSONError as exc:
        raise ImportRefused(
            f"Nothing was imported: the file is not valid JSON ({_first_line(exc)})."
        ) from exc
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ImportRefused("Nothing was imported: the file is not valid JSON.") from exc
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise ImportRefused(f"Nothing was imported: the zip file is damaged ({exc}).") from exc
    return found


def write_all(user: Any, incoming: list[Incoming]) -> list[Conversation]:
    """Write the conversations in short transactions (WRITE_BATCH_S each, a pause between):
    on SQLite a transaction holds the one write lock of the whole database, so one long
    import would make every other user's write wait for it, then fail. If a write fails,
    what this import wrote so far is deleted: all of the file, or nothing."""
    created: list[Conversation] = []
    rows = _rows(user, incoming, created)
    try:
        while _write_batch(rows):
            time.sleep(WRITE_PAUSE_S)  # a writer waiting on SQLite's lock gets its turn
    except BaseException:
        _delete(created)
        raise
    return created


def _delete(created: list[Conversation]) -> None:
    try:
        for conv in created:
            Conversation.objects.filter(pk=conv.pk).delete()
    except DatabaseError:
        log.exception("an import that failed left %d conversations behind", len(created))


def _write_batch(rows: Iterator[None]) -> bool:
    """Write rows for WRITE_BATCH_S in one transaction; False when none are left."""
    with transaction.atomic():
        started = time.monotonic()
        for _ in rows:
            if time.monotonic() - started > WRITE_BATCH_S:
                return True
    return False


def _rows(user: Any, incoming: list[Incoming], created: list[Conversation]) -> Iterator[None]:
    """Writes the conversations a row at a time, yielding between rows; each yield leaves
    a state that may be committed."""
    for conversation in incoming:
        yield from write(user, conversation, created)


def _counter(model: str) -> EngineClient | None:
    """The engine client of the conversation's model (blank: the default) when this
    process has it up, to count each message's tokens as it is written: a send then sizes
    the conversation without tokenizing it (conversations.too_long_by_count). A count
    never loads a model."""
    try:
        return loaded_clients().get(model or default_model())
    except EngineError:
        return None


def write(user: Any, incoming: Incoming, created: list[Conversation]) -> Iterator[None]:
    conv = Conversation.objects.create(
        owner=user,
        title=incoming.title,
        model=incoming.model,
        **{**settings.CHAT_DEFAULTS, **incoming.settings},
    )
    created.append(conv)
    saved: dict[str, int] = {}
    counter = _counter(incoming.model)
    for node in incoming.nodes:
        tokens = counter.count_tokens(node.text) if counter else None
        message = Message.objects.create(
            conversation=conv,
            parent_id=saved.get(node.parent) if node.parent else None,
            role=node.role,
            text=node.text,
            status=Message.Status.COMPLETE,
            figures=node.figures,
            tokens=tokens,
            # The vocabulary `tokens` was counted in (no token ids are stored).
            tokenizer=(counter.tokenizer_id or "") if counter and tokens is not None else "",
        )
        saved[node.key] = message.pk
        Attachment.objects.bulk_create(
            Attachment(owner=user, message=message, position=i, **doc)
            for i, doc in enumerate(node.documents)
        )
        yield
    leaf = saved.get(incoming.active) if incoming.active else None
    if leaf is None and incoming.nodes:
        leaf = saved[incoming.nodes[-1].key]
    times = {"created_at": incoming.created_at, "updated_at": incoming.updated_at}
    Conversation.objects.filter(pk=conv.pk).update(
        active_leaf_id=leaf, **{k: v for k, v in times.items() if v is not None}
    )
    conv.refresh_from_db()
    yield
