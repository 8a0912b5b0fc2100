"""GGUF files made here, as people get them: a tiny random-weight Hugging Face model,
converted by llama.cpp's own `convert_hf_to_gguf.py` and quantized by its `llama-quantize`
(both from the build scripts/build-llama-server.sh makes).

k-quants pack rows in super-blocks of 256, so the model's widths are multiples of 256;
llama-quantize falls back to another type for a tensor whose rows do not fit, and picks
some tensors' types itself (Q4_K_M: Q6_K for some attn_v / ffn_down and the tied head), so
a test reads each tensor's type from the file rather than assuming it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from tests.architectures import build_tiny
from tests.tiny_model import TOKENIZER_FILES

# The file types the converter writes itself (its --outtype), and those llama-quantize
# makes from the F32 file.
CONVERTED = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}
QUANTIZED = ("Q4_0", "Q4_1", "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K")
# Types a file holds whole where llama-quantize is asked for them, and in part where a
# matrix's rows are not whole super-blocks of a K-quant (Q5_0 in a Q4_K_M file, Q5_1 in a
# Q5_K_M one, IQ4_NL in smaller ones).
FALLBACKS = ("Q5_0", "Q5_1", "IQ4_NL")


def build_tiny_llama_256(folder: Path, tokenizer_source: Path, seed: int = 0) -> Path:
    """A 2-layer llama (hidden 256, MLP 512, 4 heads of 64, 2 KV heads, vocab 49152) with
    the default model's tokenizer. A large init range keeps greedy choices clear of ties."""
    return build_llama(folder, tokenizer_source, hidden=256, layers=2, mlp=512, seed=seed)


def build_llama(
    folder: Path,
    tokenizer_source: Path,
    hidden: int,
    layers: int,
    mlp: int,
    head_dim: int = 64,
    seed: int = 0,
    **extra: Any,
) -> Path:
    """A random llama of these sizes (KV heads half the heads) with the default model's
    tokenizer; `extra`: more config fields (rope_scaling, say)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    heads = hidden // head_dim
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        vocab_size=49152,
        max_position_embeddings=1024,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
        **extra,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    copy_tokenizer(tokenizer_source, folder)
    return folder


# Each registered family as a GGUF source: tests/architectures.py's tiny model at widths the
# k-quants take (hidden 256, MLP 512, heads of 64), with what llama.cpp assumes rather than
# reads from the file made true in the model too: Gemma's query scale is 1/sqrt(head_dim),
# and Gemma 3's global layers are every sixth (so six layers, one of them global).
FAMILY_SOURCES: dict[str, dict[str, Any]] = {
    "qwen2": {},
    "qwen3": {},
    "gemma2": {"query_pre_attn_scalar": 64},
    "gemma3": {"query_pre_attn_scalar": 64, "num_hidden_layers": 6, "layer_types": None},
    "phi3": {},
}


def build_family(name: str) -> Callable[[Path, Path], Path]:
    """A builder for TinyGGUFs.model: the tiny `name` model of FAMILY_SOURCES' widths."""

    def build(folder: Path, tokenizer_source: Path) -> Path:
        widths = {
            "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        }  # fmt: skip
        settings = {**widths, **FAMILY_SOURCES[name]}
        return build_tiny(name, folder, tokenizer_source, **settings)

    return build


def copy_tokenizer(source: Path, folder: Path) -> None:
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, folder / name)


class TinyGGUFs:
    """The tiny llama's folder and its GGUFs, made on first use and kept beside the
    llama.cpp build they came from (so a new llama.cpp version makes them anew). close()
    ends the converter's process, if a file had to be made."""

    def __init__(self, tokenizer_source: Path) -> None:
        from inference.bench.llama_server import gguf_tools

        self.tokenizer_source = tokenizer_source
        converter, self.quantize = gguf_tools()
        self.converter = Converter(converter)
        self.dir = self.quantize.parents[2] / "test-ggufs"
        self.dir.mkdir(exist_ok=True)
        self.hf = self.model("tiny-llama-256", build_tiny_llama_256)

    def model(self, name: str, build: Callable[[Path, Path], Path]) -> Path:
        """The Hugging Face folder `name`, made by `build(folder, tokenizer_source)` once."""
        folder = self.dir / name
        if not (folder / "config.json").is_file():
            partial = self.dir / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            build(partial, self.tokenizer_source)
            shutil.rmtree(folder, ignore_errors=True)
            partial.rename(folder)
        return folder

    def file(self, file_type: str, model: Path | None = None) -> Path:
        """The tiny llama's GGUF of `file_type`, or another model folder's (self.model)."""
        return make_gguf(model or self.hf, file_type, self.dir, self.converter, self.quantize)

    def close(self) -> None:
        self.converter.close()


def tiny_ggufs(tokenizer_source: Path) -> TinyGGUFs:
    """The fixtures' files, or a skip where llama.cpp's tools cannot be built here."""
    import pytest

    from inference.bench.llama_server import binary_path, missing_build_tools

    if not binary_path().exists() and (missing := missing_build_tools()):
        pytest.skip(f"llama.cpp's tools are not built and cannot be: no {', '.join(missing)} here")
    return TinyGGUFs(tokenizer_source)


def _run(args: list[str]) -> None:
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[-4:])} failed:\n{out.stdout[-2000:]}{out.stderr[-3000:]}"
        )


# The converter reads Gemma 2's and Phi-3's vocabulary from a SentencePiece tokenizer.model;
# the test models carry the default model's BPE tokenizer.json, which it reads for the other
# families (and for Gemma 3 and Phi-4 folders without tokenizer.model) as "gpt2". It names
# the pre-tokenizer by hashing what transformers' tokenizer makes of a text, and transformers
# gives a qwen2 folder Qwen2Tokenizer's own split whatever tokenizer.json says: every test
# model's is SmolLM2's.
# One process runs every conversion asked of it, so that torch, transformers and the
# converter are imported once, not per file (seconds each): a JSON list of the converter's
# arguments a line in, a line out for each, "done" or "failed" (its log, the converter's
# output included, goes to stderr).
_CONVERTER = """
import json, os, runpy, sys, traceback
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # what the converter prints goes to the log, not among the answers
sys.path.insert(0, sys.argv[1])
from conversion import TextModel, gemma, phi
gemma.Gemma2Model.set_vocab = TextModel._set_vocab_gpt2
phi.Phi3MiniModel.set_vocab = TextModel._set_vocab_gpt2
TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
converter = sys.argv[1] + "/convert_hf_to_gguf.py"
main = runpy.run_path(converter)["main"]
for line in sys.stdin:
    sys.argv = [converter, *json.loads(line)]
    try:
        main()
        answer = "done"
    except BaseException:  # SystemExit too: the converter's refusals exit
        traceback.print_exc()
        answer = "failed"
    sys.stderr.flush()
    print(answer, file=answers, flush=True)
"""


class Converter:
    """llama.cpp's `convert_hf_to_gguf.py` (`script`), run in a process of its own started
    on the first conversion and kept for the next ones."""

    def __init__(self, script: Path) -> None:
        self.script = script
        self.proc: subprocess.Popen[str] | None = None
        self.log: Path | None = None

    def convert(self, args: list[str]) -> None:
        """The converter on these command-line arguments; RuntimeError with its log if it
        fails."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.log is not None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        start = self.log.stat().st_size
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "done":
            with open(self.log, errors="replace") as log:
                log.seek(start)
                raise RuntimeError(f"{' '.join(args[-4:])} failed:\n{log.read()[-5000:]}")

    def _start(self) -> None:
        self.close()
        fd, name = tempfile.mkstemp(prefix="gguf-converter-", suffix=".log")
        self.log = Path(name)
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CONVERTER, str(self.script.parent)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
            )  # fmt: skip

    def close(self) -> None:
        """Ends the process (it exits at the end of its input) and removes its log."""
        if self.proc is not None:
            for pipe in (self.proc.stdin, self.proc.stdout):
                _close(pipe)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.log is not None:
            self.log.unlink(missing_ok=True)
            self.log = None


def _close(pipe: IO[str] | None) -> None:
    if pipe is not None:
        with contextlib.suppress(OSError):  # the process is gone: nothing waits in the pipe
            pipe.close()


def make_gguf(
    hf_folder: Path, file_type: str, out_dir: Path, converter: Converter, quantize: Path
) -> Path:
    """`hf_folder` as a GGUF of `file_type` (a key of CONVERTED, one of QUANTIZED or FALLBACKS) in
    `out_dir`; the F32 file is made first where a quantized one needs it."""
    out = out_dir / f"{hf_folder.name}.{file_type}.gguf"
    if out.is_file():
        return out
    # Written under another name and renamed: a run cut short leaves no file that looks done.
    partial = out.with_suffix(".partial")
    if file_type in CONVERTED:
        # One name for all: llama.cpp tunes a vocabulary by the model's name (a "phi3" one
        # must hold SentencePiece's </s>), and these carry SmolLM2's whatever the family.
        converter.convert([
            str(hf_folder), "--outtype", CONVERTED[file_type], "--outfile", str(partial),
            "--model-name", "tiny test model",
        ])  # fmt: skip
    elif file_type in (*QUANTIZED, *FALLBACKS):
        source = make_gguf(hf_folder, "F32", out_dir, converter, quantize)
        # On every core: each thread quantizes rows of its own, the file is the same.
        _run([str(quantize), str(source), str(partial), file_type, str(os.cpu_count() or 1)])
    else:
        raise ValueError(f"no recipe for {file_type}; known: {*CONVERTED, *QUANTIZED, *FALLBACKS}")
    partial.rename(out)
    return out
