"""Documents attached to a message: their text read from the file as uploaded, and that
text put into the prompt.

A user message's turn in the prompt is its documents, each wrapped the same way, then the
person's own words (`prompt_text`). The wrapping depends on nothing but the stored name and
text, so the turn's ids are the same every time the conversation is continued, and the
engine's KV cache reuses them (docs/http.md, "Attachments").
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import subprocess
import sys
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chatapp.chat.models import Attachment, Message
from chatapp.text import without_surrogates

if TYPE_CHECKING:
    from inference.client import EngineClient

log = logging.getLogger(__name__)

# Files read as text, by extension: prose, data and the common programming languages.
# fmt: off
TEXT_EXTENSIONS = frozenset({
    "txt", "text", "md", "markdown", "mdx", "rst", "adoc", "org", "tex", "csv", "tsv", "json",
    "jsonl", "ndjson", "yaml", "yml", "toml", "ini", "cfg", "conf", "env", "properties", "xml",
    "html", "htm", "css", "scss", "sass", "less", "log", "diff", "patch", "sql", "graphql", "gql",
    "py", "pyi", "ipynb", "js", "mjs", "cjs", "ts", "tsx", "jsx", "vue", "svelte", "java", "kt",
    "kts", "scala", "groovy", "gradle", "c", "h", "cc", "cpp", "cxx", "hpp", "hh", "cs", "fs",
    "go", "rs", "rb", "php", "pl", "pm", "lua", "r", "jl", "swift", "m", "mm", "dart", "ex",
    "exs", "erl", "hrl", "hs", "clj", "cljs", "elm", "ml", "mli", "nim", "zig", "v", "sv", "vhd",
    "sh", "bash", "zsh", "fish", "ps1", "bat", "cmd", "mk", "cmake", "dockerfile", "makefile",
    "proto", "tf", "hcl", "nix", "asm", "s", "srt", "vtt", "bib",
})
IMAGE_EXTENSIONS = frozenset({
    "png", "jpg", "jpeg", "gif", "webp", "bmp", "tif", "tiff", "heic", "heif", "avif", "svg",
    "ico", "jxl",
})
# fmt: on
# Magic numbers of the image formats a browser or phone produces.
_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"II*\x00", b"MM\x00*")
_BOMS = (
    (b"\xef\xbb\xbf", "utf-8"),
    (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
)


class AttachmentRefused(Exception):
    """A file that cannot be attached; `message` says why in words a person reads, and
    `status` is the HTTP status the upload answers with."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def human_size(n: int) -> str:
    """1234567 -> "1.2 MB" (the UI's chips use the same units)."""
    if n < 1000:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KB", "MB", "GB"):
        value /= 1000
        if value < 1000 or unit == "GB":
            break
    return f"{value:.1f} {unit}"


def clean_name(raw: Any) -> str:
    """A file name fit to show and to put in a prompt: its last path part, no control
    characters or quotes, at most 255 characters."""
    name = str(raw or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = re.sub(r"[\x00-\x1f\x7f\"<>]", "", name)
    name = name.encode("utf-8", "replace").decode("utf-8").strip()
    name = without_surrogates(name)
    return name[:255] or "document"


def _extension(name: str) -> str:
    lower = name.lower()
    if lower in ("dockerfile", "makefile"):
        return lower
    return lower.rsplit(".", 1)[-1] if "." in lower.strip(".") else ""


def _is_image(data: bytes) -> bool:
    head = data[:16]
    return (
        head.startswith(_IMAGE_MAGIC)
        or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")
        or head[4:12] in (b"ftypheic", b"ftypheix", b"ftypavif", b"ftypmif1")
    )


def refuse_images(name: str) -> AttachmentRefused:
    return AttachmentRefused(
        "image_unsupported",
        f"{name} is an image. The model served here reads text only, so images cannot be attached.",
        415,
    )


def too_large(name: str, size: int) -> AttachmentRefused:
    limit = settings.CHAT_ATTACHMENT_MAX_BYTES
    return AttachmentRefused(
        "too_large",
        f"{name} is {human_size(size)}; files of at most {human_size(limit)} can be attached.",
        413,
    )


def _kind(name: str, data: bytes) -> str:
    """The kind of an uploaded file, or AttachmentRefused: too large, an image, a type not
    read."""
    if len(data) > settings.CHAT_ATTACHMENT_MAX_BYTES:
        raise too_large(name, len(data))
    ext = _extension(name)
    if _is_image(data) or ext in IMAGE_EXTENSIONS:
        raise refuse_images(name)
    if data.startswith(b"%PDF-") or ext == "pdf":
        return Attachment.Kind.PDF
    if ext in TEXT_EXTENSIONS or ext == "":
        return Attachment.Kind.TEXT
    raise AttachmentRefused(
        "unsupported_type",
        f"{name}: .{ext} files cannot be attached. Attach text (.txt, .md), code, CSV, "
        "JSON or PDF files.",
        415,
    )


def _kept(name: str, text: str) -> str:
    if not text.strip():
        raise AttachmentRefused("empty", f"{name} has no text in it.", 422)
    if len(text) > settings.CHAT_ATTACHMENT_MAX_CHARS:
        raise too_much_text(name, len(text))
    return text


def extract(name: str, data: bytes) -> tuple[str, str]:
    """(kind, text) of an uploaded file, or AttachmentRefused saying why not."""
    kind = _kind(name, data)
    if kind == Attachment.Kind.PDF:
        reader = _start_pdf_reader()
        try:
            text = _pdf_answer(name, reader, data)
        finally:
            _stop(reader)
    else:
        text = _decoded(name, data)
    return kind, _kept(name, text)


async def extract_async(name: str, data: bytes) -> tuple[str, str]:
    """`extract` for async views: a PDF's reader is killed as soon as the caller is
    cancelled (Django cancels the view when its client goes away)."""
    kind = _kind(name, data)
    if kind == Attachment.Kind.PDF:
        reader = _start_pdf_reader()
        try:
            text = await asyncio.to_thread(_pdf_answer, name, reader, data)
        finally:
            _stop(reader)
    else:
        text = _decoded(name, data)
    return kind, _kept(name, text)


def too_much_text(name: str, chars: int, more: bool = False) -> AttachmentRefused:
    most = settings.CHAT_ATTACHMENT_MAX_CHARS
    held = f"more than {chars:,}" if more else f"{chars:,}"
    return AttachmentRefused(
        "too_large",
        f"{name} holds {held} characters of text; at most {most:,} can be attached.",
        413,
    )


def _decoded(name: str, data: bytes) -> str:
    encoding = "utf-8"
    for bom, enc in _BOMS:
        if data.startswith(bom):
            data, encoding = data[len(bom) :], enc
            break
    if encoding == "utf-8" and b"\x00" in data[:8192]:
        raise _binary(name)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise AttachmentRefused(
            "undecodable",
            f"{name} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start:,} does not decode); save it as UTF-8 and attach it again.",
            422,
        ) from exc
    if "\x00" in text:
        raise _binary(name)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _binary(name: str) -> AttachmentRefused:
    return AttachmentRefused(
        "undecodable", f"{name} looks like a binary file, not text: it cannot be read.", 422
    )


_READER = Path(__file__).with_name("pdf_reader.py")


def _start_pdf_reader() -> subprocess.Popen[bytes]:
    limits = (
        settings.CHAT_PDF_MAX_PAGES,
        settings.CHAT_PDF_MAX_CONTENT_BYTES,
        settings.CHAT_ATTACHMENT_MAX_CHARS,
        math.ceil(settings.CHAT_PDF_TIMEOUT_S) + 1,
    )
    return subprocess.Popen(
        [sys.executable, "-I", str(_READER), *map(str, limits)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _stop(reader: subprocess.Popen[bytes]) -> None:
    if reader.poll() is None:
        reader.kill()
    reader.wait()


def _pdf_answer(name: str, reader: subprocess.Popen[bytes], data: bytes) -> str:
    """The text `reader` read from the PDF, or AttachmentRefused saying why not."""
    limit = settings.CHAT_PDF_TIMEOUT_S
    try:
        out, err = reader.communicate(data, timeout=limit)
    except subprocess.TimeoutExpired:
        reader.kill()
        reader.communicate()
        raise AttachmentRefused(
            "pdf_too_slow",
            f"{name} takes longer than {limit:g} seconds to read, the most a PDF is given: "
            "it is built in a way that makes its text very slow to find. Attach its text "
            "as a file instead.",
            422,
        ) from None
    try:
        answer = json.loads(out)
    except ValueError:
        # Killed by its CPU or memory limit, or by the stop above.
        log.info("PDF %r: reader exited %s: %s", name, reader.returncode, err[-300:])
        answer = {"refused": "content", "count": 0}
    if "text" in answer:
        text = str(answer["text"])
        if not text.strip():
            raise AttachmentRefused(
                "no_text_layer",
                f"{name} has no text layer (a scan or pictures of text): there is no text to "
                "read in it. Attach a PDF with selectable text, or its text as a file.",
                422,
            )
        return text
    why, count = answer.get("refused"), int(answer.get("count") or 0)
    if why == "encrypted":
        raise AttachmentRefused(
            "unreadable_pdf", f"{name} is protected by a password: its text cannot be read.", 422
        )
    if why == "pages":
        most = settings.CHAT_PDF_MAX_PAGES
        raise AttachmentRefused(
            "too_large",
            f"{name} has {count:,} pages; PDFs of at most {most:,} can be attached.",
            413,
        )
    if why == "content":
        most = human_size(settings.CHAT_PDF_MAX_CONTENT_BYTES)
        raise AttachmentRefused(
            "too_large",
            f"{name} holds more page content than a PDF may ({most} once unpacked).",
            413,
        )
    if why == "chars":
        raise too_much_text(name, count, more=True)
    log.info("PDF %r not read: %s", name, answer.get("detail"))
    raise AttachmentRefused(
        "unreadable_pdf", f"{name} could not be read as a PDF: the file is damaged.", 422
    )


# --- the prompt -------------------------------------------------------------------


def document_block(name: str, text: str) -> str:
    """One document as the prompt carries it, before the person's words."""
    return f'<document name="{name}">\n{text.strip(chr(10))}\n</document>\n\n'


def prompt_text(text: str, documents: Iterable[Attachment]) -> str:
    """A user turn's text in the prompt: its documents, in order, then the person's words."""
    return "".join(document_block(a.name, a.text) for a in documents) + text


def count_tokens(client: EngineClient, name: str, text: str) -> int | None:
    """Tokens of one document's block for the served model (None where not known here)."""
    return client.count_tokens(document_block(name, text))


# --- storing ----------------------------------------------------------------------


def create_pending(user: Any, name: str, data: bytes, client: EngineClient | None) -> Attachment:
    """Read an uploaded file and keep its text for the message about to be sent."""
    name = clean_name(name)
    kind, text = extract(name, data)
    return keep_pending(user, name, kind, text, len(data), client)


def keep_pending(
    user: Any, name: str, kind: str, text: str, size: int, client: EngineClient | None
) -> Attachment:
    """Keep a file's text for the message about to be sent. Files this user uploaded and
    never sent go after CHAT_ATTACHMENT_PENDING_HOURS."""
    cutoff = timezone.now() - timedelta(hours=settings.CHAT_ATTACHMENT_PENDING_HOURS)
    Attachment.objects.filter(owner=user, message__isnull=True, created_at__lt=cutoff).delete()
    tokens = count_tokens(client, name, text) if client is not None else None
    return Attachment.objects.create(
        owner=user, name=name, kind=kind, size=size, text=text, tokens=tokens
    )


class AttachmentsInvalid(ValueError):
    """A send or edit named attachments it may not use."""


def clean_ids(raw: Any) -> list[int]:
    """The `attachments` field of a frame or request: a list of distinct ids."""
    if raw is None:
        return []
    if not isinstance(raw, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in raw):
        raise AttachmentsInvalid("'attachments' must be a list of attachment ids")
    if len(set(raw)) != len(raw):
        raise AttachmentsInvalid("an attachment is listed twice")
    most = settings.CHAT_ATTACHMENTS_PER_MESSAGE
    if len(raw) > most:
        raise AttachmentsInvalid(f"at most {most} files can go with one message")
    return list(raw)


def usable(user: Any, ids: list[int], keep_from: Message | None = None) -> list[Attachment]:
    """The attachments `ids` names, in that order: this user's, waiting to be sent, or
    (for an edit) attached to `keep_from`, the message being edited."""
    if not ids:
        return []
    found = {
        a.pk: a
        for a in Attachment.objects.filter(pk__in=ids, owner=user)
        if a.message_id is None or (keep_from is not None and a.message_id == keep_from.pk)
    }
    missing = [i for i in ids if i not in found]
    if missing:
        raise AttachmentsInvalid(
            "an attached file is no longer available (sent already, or removed): attach it again"
        )
    return [found[i] for i in ids]


def of_messages(message_ids: Iterable[int], with_text: bool = True) -> dict[int, list[Attachment]]:
    """The attachments of these messages, by message id, in order."""
    qs = Attachment.objects.filter(message_id__in=list(message_ids)).order_by("position", "id")
    if not with_text:
        qs = qs.defer("text")
    out: dict[int, list[Attachment]] = {}
    for a in qs:
        assert a.message_id is not None
        out.setdefault(a.message_id, []).append(a)
    return out


@transaction.atomic
def attach(message: Message, documents: list[Attachment]) -> None:
    """Put `documents` on `message`: a pending upload moves onto it (once: a second send of
    the same upload is refused), one already on another message (an edit keeps its
    documents) is copied."""
    for position, a in enumerate(documents):
        if a.message_id is None:
            moved = Attachment.objects.filter(pk=a.pk, message__isnull=True).update(
                message=message, position=position
            )
            if not moved:
                raise AttachmentsInvalid(
                    "an attached file is no longer available (sent already, or removed): "
                    "attach it again"
                )
        else:
            Attachment.objects.create(
                owner_id=a.owner_id,
                message=message,
                position=position,
                name=a.name,
                kind=a.kind,
                size=a.size,
                text=a.text,
                tokens=a.tokens,
            )


def attachment_json(a: Attachment, with_text: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": a.pk,
        "name": a.name,
        "kind": a.kind,
        "size": a.size,
        "tokens": a.tokens,
        "message_id": a.message_id,
    }
    if with_text:
        data["text"] = a.text
    return data
