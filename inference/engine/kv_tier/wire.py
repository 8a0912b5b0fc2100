"""The value stored for one block: a header (magic, version, compression, block size,
fingerprint, parent digest, lengths), the block's token ids, its K and V for every layer
in the pool dtype (byte for byte, or compressed), then a crc32 of all that. `verify`
checks every field against what the reader expects; anything off is refused."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np

from inference.engine.kv_tier.blocks import BlockEntry, BlockLayout

LAYOUT_VERSION = 1
MAGIC = b"KVTB"
# magic, version, compression, block size, fingerprint, parent digest,
# stored payload length, raw payload length, crc32 of everything but this field.
HEADER = struct.Struct("<4sBBH12s16sII")
CRC = struct.Struct("<I")
COMPRESSIONS = {"none": 0, "zlib": 1, "lz4": 2}


def verify(
    value: bytes,
    tokens: tuple[int, ...],
    parent: bytes,
    layout: BlockLayout,
    fingerprint: bytes,
) -> memoryview | None:
    """The raw payload of a stored block if every field is what we expect, else None."""
    bs = layout.block_size
    head = HEADER.size + 4 * bs
    if len(value) < head + CRC.size:
        return None
    magic, version, comp, block_size, fp, stored_parent, stored_len, raw_len = HEADER.unpack_from(
        value
    )
    if (
        magic != MAGIC
        or version != LAYOUT_VERSION
        or comp not in COMPRESSIONS.values()
        or block_size != bs
        or fp != fingerprint
        or stored_parent != parent
        or stored_len != len(value) - head - CRC.size
        or raw_len != layout.nbytes
        or struct.unpack_from(f"<{bs}I", value, HEADER.size) != tokens
    ):
        return None
    body = memoryview(value)[: len(value) - CRC.size]
    if zlib.crc32(body) != CRC.unpack_from(value, len(value) - CRC.size)[0]:
        return None
    payload = body[head:]
    try:
        if comp == COMPRESSIONS["zlib"]:
            payload = memoryview(zlib.decompress(payload))
        elif comp == COMPRESSIONS["lz4"]:
            import lz4.frame

            payload = memoryview(lz4.frame.decompress(payload))
    except Exception:
        return None
    return payload if len(payload) == raw_len else None


def encode(
    entry: BlockEntry,
    block: list[np.ndarray],
    layout: BlockLayout,
    fingerprint: bytes,
    compression: str,
) -> memoryview:
    """Header, token ids, payload, crc32: one buffer, one copy of the payload."""
    bs = layout.block_size
    head = HEADER.size + 4 * bs
    raw_len = layout.nbytes
    comp = COMPRESSIONS[compression]
    stored: Any = None
    if comp != COMPRESSIONS["none"]:
        raw = np.stack(block).data
        if comp == COMPRESSIONS["zlib"]:
            stored = zlib.compress(raw, 1)
        else:
            import lz4.frame

            stored = lz4.frame.compress(raw)
    stored_len = raw_len if stored is None else len(stored)
    value = bytearray(head + stored_len + CRC.size)
    HEADER.pack_into(
        value, 0, MAGIC, LAYOUT_VERSION, comp, bs, fingerprint, entry.parent,
        stored_len, raw_len,
    )  # fmt: skip
    struct.pack_into(f"<{bs}I", value, HEADER.size, *entry.token_ids)
    if stored is None:
        dst = np.frombuffer(value, dtype=np.uint8, count=raw_len, offset=head)
        dst = dst.reshape(len(block), *block[0].shape)
        for layer, src in enumerate(block):
            dst[layer] = src
    else:
        value[head : head + stored_len] = stored
    body = memoryview(value)[: head + stored_len]
    CRC.pack_into(value, head + stored_len, zlib.crc32(body))
    return memoryview(value)
