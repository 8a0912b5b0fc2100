"""GGUF's weight types, read straight from a file's blocks: each dequantizes exactly as the
`gguf` package does, on random blocks and on the blocks llama.cpp's own quantizer wrote; a
type the registry does not know is refused by name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

from inference.bench.llama_server import binary_path, missing_build_tools
from inference.engine.formats.ggml_types import TYPES, GGMLType, UnsupportedWeightType
from inference.engine.formats.gguf_file import GGUFFile
from tests.gguf_files import CONVERTED, FALLBACKS, QUANTIZED, TinyGGUFs

# Where each block type keeps its float16 scales (the rest of a block is any bytes).
SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
                 "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,)}  # fmt: skip


def random_rows(t: GGMLType, rows: int, blocks: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, blocks * block_bytes]: random bytes with finite scales, or finite floats."""
    if t.block_elems == 1:
        x = rng.standard_normal((rows, blocks)).astype(np.float32) * 10
        if t.name == "BF16":
            return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return x.astype(np.float16 if t.name == "F16" else np.float32).view(np.uint8)
    raw = rng.integers(0, 256, size=(rows, blocks, t.block_bytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS[t.name]:
        scale = rng.standard_normal((rows, blocks, 1)).astype(np.float16)
        raw[..., offset : offset + 2] = scale.view(np.uint8)
    return raw.reshape(rows, -1)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_the_registry_agrees_with_gguf_on_every_types_block_size() -> None:
    for t in TYPES:
        assert GGML_QUANT_SIZES[GGMLQuantizationType[t.name]] == (t.block_elems, t.block_bytes)
        assert GGMLQuantizationType[t.name].value == t.id


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_random_blocks_dequantize_bit_for_bit_as_gguf_does(t: GGMLType) -> None:
    rng = np.random.default_rng(t.id)
    raw = random_rows(t, rows=7, blocks=5, rng=rng)
    expected = dequantize(raw, GGMLQuantizationType[t.name]).astype(np.float32)
    got = t.dequantize(torch.from_numpy(raw), expected.shape[1]).numpy()
    assert same_bits(got, expected)


def test_a_type_outside_the_registry_is_refused_by_tensor_and_type_name(tmp_path: Path) -> None:
    path = tmp_path / "iq.gguf"
    writer = GGUFWriter(path, "llama")
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType.IQ2_XS][1]
    blocks = np.zeros((4, block_bytes), dtype=np.uint8)  # 4 rows of one block each
    writer.add_tensor("blk.0.attn_q.weight", blocks, raw_dtype=GGMLQuantizationType.IQ2_XS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedWeightType) as refused:
        GGUFFile(path)
    message = str(refused.value)
    assert "tensor blk.0.attn_q.weight has type IQ2_XS, which is not supported" in message
    assert "supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K" in message


def test_the_header_reads_every_value_type_and_tensor_as_gguf_does(tmp_path: Path) -> None:
    """GGUFFile reads the header itself (gguf_file._Header): each value of every GGUF type,
    arrays and strings too, and each tensor's bytes, past an alignment other than 32, are
    gguf's own reader's, as the same Python values."""
    path = tmp_path / "kinds.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_custom_alignment(1024)
    scalars = {
        GGUFValueType.UINT8: 200, GGUFValueType.INT8: -100, GGUFValueType.UINT16: 60000,
        GGUFValueType.INT16: -30000, GGUFValueType.UINT32: 4_000_000_000,
        GGUFValueType.INT32: -2_000_000_000, GGUFValueType.FLOAT32: 0.1,
        GGUFValueType.UINT64: 2**63 + 5, GGUFValueType.INT64: -(2**62),
        GGUFValueType.FLOAT64: 0.1, GGUFValueType.BOOL: True, GGUFValueType.STRING: "naïve ✓",
    }  # fmt: skip
    for kind, value in scalars.items():
        writer.add_key_value(f"test.{kind.name.lower()}", value, kind)
    writer.add_array("test.tokens", ["<s>", "", "Ġthe", "✓"])
    writer.add_array("test.scores", [0.5, -1.25, 3.0])
    writer.add_key_value("test.ids", [1, -2, 3], GGUFValueType.ARRAY, GGUFValueType.INT32)
    writer.add_key_value("test.flags", [True, False], GGUFValueType.ARRAY, GGUFValueType.BOOL)
    rng = np.random.default_rng(0)
    q8 = random_rows(next(t for t in TYPES if t.name == "Q8_0"), 3, 2, rng)
    writer.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    ours, theirs = GGUFFile(path), GGUFReader(path)
    expected = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.keys() == list(expected)
    for key, value in expected.items():
        got = ours.get(key)
        assert got == value and type(got) is type(value), (key, got, value)
        if isinstance(value, list):
            assert [type(v) for v in got] == [type(v) for v in value], key
    tensors = ours.tensors()
    assert list(tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        mine = tensors[t.name]
        assert mine.offset == t.data_offset and mine.offset % 1024 == 0
        assert mine.shape == tuple(int(n) for n in reversed(t.shape.tolist()))
        assert np.array_equal(
            mine.raw.numpy().reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1)
        )


@pytest.fixture(scope="session")
def ggufs(real_model_path: Path) -> Iterator[TinyGGUFs]:
    if not binary_path().exists() and (missing := missing_build_tools()):
        pytest.skip(f"llama.cpp's tools are not built and cannot be: no {', '.join(missing)} here")
    files = TinyGGUFs(real_model_path)
    yield files
    files.close()


@pytest.mark.slow
def test_llama_cpps_own_files_dequantize_bit_for_bit_as_gguf_does(ggufs: TinyGGUFs) -> None:
    seen: dict[str, set[str]] = {}
    for file_type in (*CONVERTED, *QUANTIZED, *FALLBACKS):
        file = GGUFFile(ggufs.file(file_type))
        for name, t in file.tensors().items():
            seen.setdefault(file_type, set()).add(t.type.name)
            raw = t.raw.numpy()
            expected = dequantize(raw, GGMLQuantizationType[t.type.name]).astype(np.float32)
            got = t.dequantize().reshape(expected.shape).numpy()
            assert same_bits(got, expected), f"{file_type}: {name} ({t.type.name})"
    # The files hold every type of the registry: none of the checks above was vacuous.
    assert set().union(*seen.values()) == {t.name for t in TYPES}, seen
    assert {"Q4_K", "Q6_K"} <= seen["Q4_K_M"]
