"""The text of a PDF, read in a process of its own (`python -I pdf_reader.py`): the web
process starts it per upload and kills it when it runs past its time or the client goes
away (attachments.py). A hostile PDF can cost pypdf minutes of CPU (pages that share one
big content stream of empty operators are parsed once per page), and no cap inside pypdf
bounds that; a process can always be killed.

It imports nothing but pypdf and the standard library. Limits come as arguments, the file
on stdin; the answer is one JSON object on stdout: {"text": ...} or {"refused": why,
"count": n}, where why is "encrypted", "pages", "content", "chars" or "damaged".
"""

from __future__ import annotations

import io
import json
import os
import resource
import sys
from typing import Any

from pypdf import PdfReader
from pypdf.errors import PyPdfError
from pypdf.generic import ArrayObject


class Refused(Exception):
    def __init__(self, why: str, count: int = 0) -> None:
        super().__init__(why)
        self.why, self.count = why, count


def _content_bytes(page: Any) -> int:
    """The decoded size of a page's content streams, each counted as often as pages use
    it: what extract_text will parse for this page."""
    contents = page.get("/Contents")
    if contents is None:
        return 0
    contents = contents.get_object()
    streams = contents if isinstance(contents, ArrayObject) else [contents]
    return sum(len(s.get_object().get_data()) for s in streams)


def read(data: bytes, max_pages: int, max_content_bytes: int, max_chars: int) -> str:
    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted and not reader.decrypt(""):
        raise Refused("encrypted")
    pages = len(reader.pages)
    if pages > max_pages:
        raise Refused("pages", pages)
    texts: list[str] = []
    content = chars = 0
    for page in reader.pages:
        content += _content_bytes(page)
        if content > max_content_bytes:  # checked before the parse it would cost
            raise Refused("content", content)
        texts.append(page.extract_text() or "")
        chars += len(texts[-1])
        if chars > max_chars:
            raise Refused("chars", chars)
    # A form feed between pages (empty ones too): a passage then knows its page number.
    return "\n\f\n".join(t.strip() for t in texts).replace("\x00", "")


def main() -> None:
    max_pages, max_content_bytes, max_chars, cpu_s = (int(a) for a in sys.argv[1:5])
    # A second bound beside the parent's clock, and room for the engine's threads first.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    os.nice(10)
    data = sys.stdin.buffer.read()
    try:
        answer: dict[str, Any] = {"text": read(data, max_pages, max_content_bytes, max_chars)}
    except Refused as exc:
        answer = {"refused": exc.why, "count": exc.count}
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        answer = {"refused": "damaged", "detail": repr(exc)[:300]}
    except MemoryError:
        answer = {"refused": "content", "count": 0}
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    main()
