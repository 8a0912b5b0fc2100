"""Where the built kernels live: one shared library per instruction set in `built/` beside
the sources, named by a digest of every source, header and flag that made it, so a process
never loads a build of other sources."""

from __future__ import annotations

import hashlib
from pathlib import Path

from inference.engine.cpu_backend import Isa

SOURCE_DIR = Path(__file__).parent
BUILT_DIR = SOURCE_DIR / "built"
COMMON_FLAGS = ("-O3", "-pthread", "-shared", "-fPIC")


def sources() -> list[Path]:
    """Every C file of the kernels (a new one is built without a list to update)."""
    return sorted(SOURCE_DIR.rglob("*.c"))


def headers() -> list[Path]:
    return sorted(SOURCE_DIR.rglob("*.h"))


def flags(isa: Isa) -> list[str]:
    return [*COMMON_FLAGS, *isa.cc_flags]


def library_path(isa: Isa) -> Path:
    digest = hashlib.sha256()
    for path in (*sources(), *headers()):
        digest.update(str(path.relative_to(SOURCE_DIR)).encode() + b"\0" + path.read_bytes())
    digest.update(" ".join(flags(isa)).encode())
    return BUILT_DIR / f"kernels-{isa.name}-{digest.hexdigest()[:16]}.so"
