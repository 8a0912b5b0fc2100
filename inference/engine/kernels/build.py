"""Building a C file of ours into a shared library once, into the cache folder, and loading it.

The library's name carries a digest of its sources and flags, so a changed source or CPU
gets a new build while an unchanged one is only loaded. It is built beside its final name
and renamed, so a process loading it at the same time never sees half a file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("CHATAPP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "chatapp"
    )
    return Path(root) / "kernels"


def compiled_library(
    stem: str, sources: Sequence[Path], flags: Sequence[str], headers: Sequence[Path] = ()
) -> ctypes.CDLL:
    """The library built from `sources` with `flags` (gcc, or $CC). Raises RuntimeError
    (no compiler, a failed build) or OSError (a library that does not load)."""
    text = b"".join(p.read_bytes() for p in (*sources, *headers))
    digest = hashlib.sha256(text + " ".join(flags).encode()).hexdigest()[:16]
    target = cache_dir() / f"{stem}-{digest}.so"
    if not target.is_file():
        _build(target, sources, flags)
    return ctypes.CDLL(str(target))


def _build(target: Path, sources: Sequence[Path], flags: Sequence[str]) -> None:
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (gcc) found")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        subprocess.run(
            [compiler, *flags, "-o", str(partial), *map(str, sources), "-lm"],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        partial.rename(target)
    except subprocess.CalledProcessError as exc:
        partial.unlink(missing_ok=True)
        names = " ".join(s.name for s in sources)
        raise RuntimeError(f"building {names} failed: {exc.stderr.strip()[-500:]}") from exc
    except subprocess.SubprocessError as exc:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"building {target.stem} failed: {exc}") from exc
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
