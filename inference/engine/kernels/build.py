"""Builds the native kernels ahead of serving, with a fallback chain:

    python -m inference.engine.kernels.build

Each instruction set this CPU can run (cpu_backend.ISAS: AMX, AVX512-BF16, AVX512, AVX2) is
compiled with $CC (else gcc, else cc) and kept only where it compiles and passes its
self-check (inference/engine/kernel_check.py: a few products against torch, in a process of
its own). Keeping each, not only the best, lets a process pick a lesser one
(ENGINE_KERNELS_AVX512=0) and an image built on one CPU serve on another. It prints what it
chose and exits 1 when nothing was built; the engine then uses torch.

A serving process never compiles: kernels.load() loads the best build here or none.
`compiled_library` is for benchmarks that build another checkout's sources.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from inference.engine import cpu_backend
from inference.engine.cpu_backend import Isa
from inference.engine.kernels.library import BUILT_DIR, flags, library_path, sources


def compiler() -> str | None:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    return cc if cc and shutil.which(cc) else None


def build(say: Callable[[str], object] = print) -> Isa | None:
    """Builds every missing library of the chain; the best one kept, or None."""
    isas = cpu_backend.supported_isas()
    if not isas:
        missing = sorted(cpu_backend.AVX2.needs - cpu_backend.cpu_flags())
        say(f"kernels: none, this CPU lacks {', '.join(missing)}; the engine uses torch")
        return None
    todo = [i for i in isas if not library_path(i).is_file()]
    cc = compiler()
    if todo and cc is None:
        say(f"kernels: no C compiler (CC={os.environ.get('CC', '')!r}, no gcc or cc on PATH)")
        todo = []
    BUILT_DIR.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
        errors = dict(zip(todo, pool.map(lambda i: _build_one(cc or "", i), todo), strict=True))
    kept = [i for i in isas if library_path(i).is_file()]
    for isa in isas:
        state = errors.get(isa) or ("built" if isa in todo else "up to date")
        say(f"kernels: {isa.name}: {state}")
    _remove_stale({library_path(i) for i in kept})
    if not kept:
        say("kernels: none built; the engine uses torch's products")
        return None
    say(f"kernels: chose {kept[0].name} ({library_path(kept[0])})")
    return kept[0]


def _build_one(cc: str, isa: Isa) -> str | None:
    """Compiles and checks one library into place; None, or why it was not kept."""
    target = library_path(isa)
    with tempfile.NamedTemporaryFile(dir=BUILT_DIR, suffix=".so.tmp", delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        cmd = [cc, *flags(isa), "-o", str(partial), *map(str, sources()), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode:
            return f"the compiler failed: {done.stderr.strip()[-400:]}"
        check = [sys.executable, "-m", "inference.engine.kernel_check", str(partial)]
        done = subprocess.run(check, capture_output=True, text=True, timeout=300)
        if done.returncode:
            return f"its self-check failed ({done.returncode}): {done.stderr.strip()[-400:]}"
        partial.rename(target)  # whole or not at all, for a process loading it meanwhile
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"not built: {exc}"
    finally:
        partial.unlink(missing_ok=True)


def _remove_stale(keep: set[Path]) -> None:
    for path in BUILT_DIR.glob("kernels-*.so"):
        if path not in keep:
            path.unlink(missing_ok=True)


def compiled_library(
    stem: str, sources: Sequence[Path], flags: Sequence[str], headers: Sequence[Path] = ()
) -> ctypes.CDLL:
    """`sources` built with `flags` into a temporary folder's library, by digest (for a
    benchmark comparing another checkout's kernels). Raises RuntimeError or OSError."""
    text = b"".join(p.read_bytes() for p in (*sources, *headers))
    digest = hashlib.sha256(text + " ".join(flags).encode()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / f"{stem}-{digest}.so"
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (gcc) found")
    if not target.is_file():
        done = subprocess.run(
            [cc, *flags, "-o", f"{target}.tmp", *map(str, sources), "-lm"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode:
            raise RuntimeError(f"building {stem} failed: {done.stderr.strip()[-500:]}")
        os.replace(f"{target}.tmp", target)
    return ctypes.CDLL(str(target))


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    return 0 if build() is not None else 1


if __name__ == "__main__":
    sys.exit(main())
