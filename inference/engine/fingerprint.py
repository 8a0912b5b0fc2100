"""What makes cached model state reusable: the model's weights, and how they are run.

Anything kept outside the process (the Redis KV tier, the response cache) is keyed by a
fingerprint of everything that changes what the model computes: the weight files' bytes,
the compute dtype, how linear weights are stored (quantization) and, for KV blocks, the
block size and cache layout. Another model, a retrained checkpoint with the same name, or a
dtype change gives another fingerprint, so stale state is never found, let alone used.
"""

from __future__ import annotations

import hashlib
import os
import threading

_weights_cache: dict[tuple[str, int, int], str] = {}
_lock = threading.Lock()

# Files whose bytes decide the model's outputs (weights, config, tokenizer).
_RELEVANT_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt", ".gguf")


def weights_digest(model_dir: str) -> str:
    """A content hash of the model folder's weight, config and tokenizer files.

    Hashing ~270 MB takes a few hundred ms, so the result is remembered per folder for as
    long as no file in it changes size or modification time.
    """
    if os.path.isfile(model_dir):  # a GGUF file: weights, config and tokenizer in one
        files = [model_dir]
    else:
        files = sorted(
            os.path.join(model_dir, name)
            for name in os.listdir(model_dir)
            if name.endswith(_RELEVANT_SUFFIXES) and os.path.isfile(os.path.join(model_dir, name))
        )
    stamp = tuple((f, st.st_size, st.st_mtime_ns) for f in files for st in (os.stat(f),))
    key = (os.path.realpath(model_dir), hash(stamp), len(files))
    with _lock:
        if key in _weights_cache:
            return _weights_cache[key]
    h = hashlib.blake2b(digest_size=16)
    for path in files:
        h.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    digest = h.hexdigest()
    with _lock:
        _weights_cache[key] = digest
    return digest


def model_fingerprint(model_dir: str, *, dtype: str, quantization: str, **extra: object) -> str:
    """A short hex id of (weights, dtype, quantization, anything else passed as keywords)."""
    parts = [weights_digest(model_dir), f"dtype={dtype}", f"quant={quantization}"]
    parts += [f"{k}={extra[k]}" for k in sorted(extra)]
    return hashlib.blake2b("|".join(parts).encode(), digest_size=12).hexdigest()
