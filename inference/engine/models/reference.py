"""docs/models.md's tables, written from the registries: the architectures (models/registry's
FAMILIES, formats/gguf_model's ARCHITECTURES), the GGUF weight types (formats/ggml_types'
TYPES, each with the blocks gguf_model.held_as holds it in) and the rope types
(layers/rotary's ROPE_TYPES). The prose around them is the page's.

    python -m inference.engine.models.reference            # rewrite the tables in place
    python -m inference.engine.models.reference --check    # exit 1 if the page differs
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

from inference.engine.formats.ggml_types import TYPES
from inference.engine.formats.gguf_model import ARCHITECTURES, held_as
from inference.engine.layers.rotary import ROPE_TYPES
from inference.engine.models.registry import FAMILIES

PAGE = Path(__file__).resolve().parents[3] / "docs" / "models.md"


def architectures_table() -> str:
    rows = [
        "| Family | Covers | transformers architectures | model_type | GGUF architecture |",
        "|---|---|---|---|---|",
    ]
    for family in FAMILIES:
        gguf = [a for a, arch in ARCHITECTURES.items() if arch.model_type in family.model_types]
        rows.append(
            f"| {family.family} | {_covers(family)} | {', '.join(family.architectures)} | "
            f"{', '.join(family.model_types)} | {', '.join(gguf) or '(none)'} |"
        )
    return "\n".join(rows)


def _covers(family: type) -> str:
    """The family module's first words, up to its colon: the models it names."""
    doc = inspect.getdoc(sys.modules[family.__module__]) or ""
    return " ".join(doc.split(":", 1)[0].split())


def weight_types_table() -> str:
    rows = [
        "| GGUF type | Weights per block | Bytes per block | Bits per weight "
        "| A layer's matrix held as |",
        "|---|---|---|---|---|",
    ]
    for t in TYPES:
        bits = t.block_bytes * 8 / t.block_elems
        held = held_as(t.name).__name__
        rows.append(f"| {t.name} | {t.block_elems} | {t.block_bytes} | {bits:g} | {held} |")
    return "\n".join(rows)


def rope_types() -> str:
    return ", ".join(f"`{t}`" for t in ROPE_TYPES)


SECTIONS: dict[str, Callable[[], str]] = {
    "architectures": architectures_table,
    "weight-types": weight_types_table,
    "rope-types": rope_types,
}


def render(page: str) -> str:
    """The page with each generated section between its markers written anew."""
    for name, make in SECTIONS.items():
        start, end = f"<!-- generated: {name} -->", f"<!-- end: {name} -->"
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        if not pattern.search(page):
            raise ValueError(f"{PAGE.name} has no {start} ... {end} section")
        section = f"{start}\n{make()}\n{end}"
        page = pattern.sub(lambda _match: section, page)  # noqa: B023 (used at once)
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs")
    args = parser.parse_args(argv)
    current = PAGE.read_text()
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(f"{PAGE} is stale: python -m inference.engine.models.reference", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
