"""llama.cpp's `llama-server` on the bundled GGUF: build it (once, cached), start it, stop it;
and the same build's GGUF converter and quantizer (gguf_tools).

Shared by the benchmark against it (vs_llama.py, quality.py) and by the tests that put
this app in front of it (tests/backends/test_upstream_llama.py); started and stopped with
the project's launcher's helpers (tools/live_server.py). The binary comes from
scripts/build-llama-server.sh, which builds it into the cache folder the first time and
afterwards only prints its path.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tools.live_server import free_port, stop_process, wait_until_up

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-llama-server.sh"
# What the build script runs; without one of them there is no llama-server on this machine.
BUILD_TOOLS = (("cmake",), ("ninja",), ("cc", "gcc", "clang"), ("c++", "g++", "clang++"))


def missing_build_tools() -> list[str]:
    """The tools the build needs and this machine lacks (a name per group of alternatives)."""
    return [group[0] for group in BUILD_TOOLS if not any(shutil.which(t) for t in group)]


def binary_path() -> Path:
    """Where the build script puts (or has put) llama-server; it need not exist yet."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--path"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def llama_server_binary(path: str = "") -> str:
    """`path` if given, else the cached build (built first if missing: minutes)."""
    if path:
        return path
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def gguf_tools(server: str = "") -> tuple[Path, Path]:
    """llama.cpp's `convert_hf_to_gguf.py` and `llama-quantize`, from the source and build
    llama-server comes from (built first if missing: minutes). The converter runs with this
    project's Python (it needs torch, transformers, gguf and sentencepiece)."""
    binary = Path(llama_server_binary(server))
    return binary.parents[2] / "src" / "convert_hf_to_gguf.py", binary.parent / "llama-quantize"


class LlamaServer:
    """One llama-server process: `slots` parallel sequences of `ctx_per_slot` tokens each,
    on `threads` threads (0: llama-server's own default, its count of physical cores)."""

    def __init__(
        self,
        binary: str,
        gguf: Path,
        threads: int,
        slots: int,
        workdir: Path,
        ctx_per_slot: int = 2048,
    ) -> None:
        if threads < 0 or slots < 1 or ctx_per_slot < 1:
            raise ValueError(
                f"threads must be >= 0 and slots and ctx_per_slot >= 1, not {threads}, "
                f"{slots}, {ctx_per_slot}"
            )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"llama-{slots}.log"
        self.args = [
            binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
            "-np", str(slots), "-c", str(ctx_per_slot * slots),
            "--threads-http", str(slots + 4),
        ]  # fmt: skip
        if threads:
            self.args += ["-t", str(threads), "-tb", str(threads)]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LlamaServer:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until_up(f"{self.url}/health", self.proc, self.log, timeout=300)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        stop_process(self.proc, timeout=20)
