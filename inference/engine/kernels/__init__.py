"""Small native kernels the engine builds once at run time: weight-only Q4_1 and Q8_0 matrix
products and a whole decoder layer for steps of a few rows (quant_gemm.c), the same
products for many rows on AMX's tiles where the CPU has them (amx_gemm.c) or in float32
from weights unpacked once (panel_gemm.c, AVX2), spread over the engine's threads by a pool
of their own (spinning between a step's products, asleep between steps), prompts' chunk
attention (chunk_attention.c), the torch path's norms, rope and activation for steps whose
products run in the pool (row_ops.c) and the sampler's filtered draws (sample.c).

Why our own: at one row a step is bound by the bytes of weights it reads, so 4-bit weights
should cost a quarter of bf16. torch's `_weight_int4pack_mm_for_cpu` is fast only with
AVX512; on an AVX2 CPU it measured ~30x slower than fp16 weights. The C file is compiled
with the system's gcc into the cache folder on first use (about a second) and loaded with
ctypes (which drops the GIL during the call). No compiler, or a CPU without
AVX2 and FMA: `load()` returns None and the engine keeps its torch weights.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

from inference.engine.kernels.build import compiled_library

log = logging.getLogger(__name__)

SOURCES = [
    Path(__file__).with_name(n)
    for n in (
        "quant_gemm.c",
        "amx_gemm.c",
        "panel_gemm.c",
        "sample.c",
        "chunk_attention.c",
        "row_ops.c",
    )
]
HEADERS = [Path(__file__).with_name(n) for n in ("simd.h", "common.h")]
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-pthread", "-shared", "-fPIC"]
_REQUIRED_CPU_FLAGS = {"avx2", "fma", "f16c"}
# Where the CPU lists them (as the kernel sees them: /proc/cpuinfo, not the compiler's own
# -march=native probe, which on some virtual machines enables what the host hides), the
# AVX512 forms: VNNI's one-instruction 8-bit dot products and 512-bit 16-bit products.
_AVX512_FLAGS = {
    "avx512f": "-mavx512f",
    "avx512bw": "-mavx512bw",
    "avx512vl": "-mavx512vl",
    "avx512_vnni": "-mavx512vnni",
}

_AMX_FLAGS = {"amx_tile", "amx_bf16"}
# The native path's products (8-bit activations) move to AMX's tiles (amx_gemm.c) from this
# many rows: 30 layers' products on a 2-core Xeon, 2 threads, 8-bit against the tiles:
# 13.0 / ~17 / 21.6 / 37.8 ms at 16 / 24 / 32 / 64 rows against 15.2 / 17.1 / 20.0 / 23.3.
AMX_MIN_ROWS = 32
# The head's 8-bit blocks (16-bit activations) likewise, from fewer rows (its weights are
# wider, so the tiles' unpacking costs less for its products): 1.7 / 4.1 / 4.2 / 17.7 ms at
# 1 / 4 / 8 / 64 rows against 3.1 / 3.1 / 3.3 / 6.4.
AMX_HEAD_MIN_ROWS = 4


# Where the kernels are built for AVX512-VNNI (and no AMX takes the product), the native
# path's products move to panel_gemm.c's 512-bit tiles from this many rows: 16 columns
# unpacked once for all rows, 8 rows a tile. 30 layers' products on a 2-core Zen 4, 2
# threads, the 8-bit kernel against the tile: 11.1 / 16.5 / 21.2 / 44.7 ms at 16 / 24 /
# 32 / 64 rows against 10.7 / 13.9 / 18.0 / 34.6 (9.0 against 10.8 at 12 rows). Where
# AMX's tiles run they take the products from AMX_MIN_ROWS, the panels the steps below: on
# a 2-core Xeon with AMX, the 8-bit kernel / the panels / the tiles at 12 / 16 / 24 / 32
# rows: 9.5 / 11.4-11.5 / 15.4-15.8 / 19.3-19.8 ms, 9.0 / 9.2-9.3 / 11.6-11.8 / 14.0-14.6,
# 10.0 / 10.1-10.3 / 12.7-12.9 / 12.8-12.9.
PANEL_MIN_ROWS = 16
# The head's (16-bit activations, vpdpwssd): 4.16 / 6.26 / 9.23 / 18.5 ms at 16 / 24 / 32
# / 64 rows against 4.39 / 5.71 / 7.24 / 12.4 (oneDNN's bf16 on 2 threads: 12.3 at 64).
PANEL_HEAD_MIN_ROWS = 24
# Built for AVX2 alone, the same panels take 4-row tiles of 256-bit sums (vpmaddubsw for the
# layers, vpmaddwd for the head). 2-core Zen 1, 2 threads, the 8-bit kernels against the
# panels, medians of 5-9 in two or three runs: the layers 50.7-50.8 / 73-89 / 92-95 / 181-194 ms
# at 16 / 24 / 32 / 64 rows against 48.8-52.3 / 72-81 / 89-90 / 168-183, the head 18.8-20.5
# / 30.1-30.5 / 35-40 / 77-84 against 19.6-20.1 / 28.0-28.4 / 33-36 / 67-72 (at 4 and 8
# rows the panels lost: 18.1 against 14.9 ms, 29.2 against 27.1).
PANEL_MIN_ROWS_AVX2 = 24
PANEL_HEAD_MIN_ROWS_AVX2 = 24


def _row_limits(setting: str, layers: int, head: int) -> tuple[int, int]:
    """(layers, head), or the setting's one value for both (0: never; for comparisons)."""
    raw = os.environ.get(setting, "")
    if not raw.strip():
        return layers, head
    try:
        return int(raw), int(raw)
    except ValueError:
        raise ValueError(f"{setting} must be an integer, got {raw!r}") from None


def amx_min_rows() -> tuple[int, int]:
    """(AMX_MIN_ROWS, AMX_HEAD_MIN_ROWS), or ENGINE_AMX_MIN_ROWS's one value for both."""
    return _row_limits("ENGINE_AMX_MIN_ROWS", AMX_MIN_ROWS, AMX_HEAD_MIN_ROWS)


def panel_min_rows(vnni: bool = True) -> tuple[int, int]:
    """(layers, head): from how many rows the native path's products take panel_gemm.c's
    tiles, by the kernels' build (`vnni`: the 512-bit tiles, else AVX2's), or
    ENGINE_PANEL_MIN_ROWS's one value for both. Where AMX's tiles run they come first
    (amx_min_rows()), so the panels serve the steps between the two limits."""
    if vnni:
        layers, head = PANEL_MIN_ROWS, PANEL_HEAD_MIN_ROWS
    else:
        layers, head = PANEL_MIN_ROWS_AVX2, PANEL_HEAD_MIN_ROWS_AVX2
    return _row_limits("ENGINE_PANEL_MIN_ROWS", layers, head)


def _built_panel_min_rows(lib: ctypes.CDLL) -> tuple[int, int]:
    """panel_min_rows for the build `lib` is (the 512-bit panels or AVX2's)."""
    return panel_min_rows(bool(lib.q4_1_i16_vnni()))


def default_panel_min_rows() -> tuple[int, int]:
    """What `load()` sets for the kernels built here (tests and benchmarks put it back)."""
    lib = load()
    return (0, 0) if lib is None else _built_panel_min_rows(lib)


@cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


_threads: int | None = None


def set_threads(n: int | None) -> None:
    """How many threads the kernels' own pool uses (None: torch's count). The engine gives
    small steps their count here and keeps torch's at one meanwhile: torch's OpenMP threads
    spin for a while after each op, on the cores this pool wants next."""
    global _threads
    _threads = n


def threads() -> int:
    return _threads if _threads is not None else torch.get_num_threads()


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: only there is bfloat16 faster than float32 on a CPU."""
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16"})


def cpu_has_amx() -> bool:
    """AMX tiles for bf16: there oneDNN's bf16 products outrun the 8-bit blocks early."""
    return "amx_bf16" in _cpu_flags()


def build_flags(cpu_flags: frozenset[str]) -> list[str]:
    """The compiler flags for this CPU: AVX2 always, the AVX512 set only when all of it is
    there (ENGINE_KERNELS_AVX512=0 keeps the AVX2 build, for comparisons)."""
    wanted = os.environ.get("ENGINE_KERNELS_AVX512", "1") not in ("0", "false", "no")
    if wanted and set(_AVX512_FLAGS) <= cpu_flags:
        # AVX512-BF16's pair products, for the prompts' attention (chunk_attention.c).
        bf16 = ["-mavx512bf16"] if "avx512_bf16" in cpu_flags else []
        # AMX's bf16 tiles, for the 4-bit products of many rows (amx_gemm.c).
        amx = ["-mamx-tile", "-mamx-bf16"] if bf16 and cpu_flags >= _AMX_FLAGS else []
        return [*FLAGS, *_AVX512_FLAGS.values(), *bf16, *amx]
    return list(FLAGS)


def cpu_build_flags() -> list[str]:
    """build_flags for this machine's CPU."""
    return build_flags(_cpu_flags())


@cache
def load() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use; None where they cannot run here."""
    cpu = _cpu_flags()
    missing = _REQUIRED_CPU_FLAGS - cpu
    if missing:
        log.info("native 4-bit kernels off: the CPU lacks %s", ", ".join(sorted(missing)))
        return None
    flags = cpu_build_flags()
    try:
        lib = compiled_library("quant_gemm", SOURCES, flags, HEADERS)
    except (OSError, RuntimeError) as exc:
        log.warning("native 4-bit kernels unavailable, using torch weights: %s", exc)
        return None
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.q4_1_gemm.argtypes = [p, p, p, i, i, p, i, p, i]
    lib.q4_1_gemm.restype = i
    lib.q4_1_gemm_bf16.argtypes = [p, p, p, i, i, p, i, p, i]
    lib.q4_1_gemm_bf16.restype = i
    lib.q4_1_bf16_available.argtypes = []
    lib.q4_1_bf16_available.restype = i
    lib.q4_1_gemm_amx.argtypes = [p, p, p, i, i, p, i, p, i]
    lib.q4_1_gemm_amx.restype = i
    lib.q4_1_amx_available.argtypes = []
    lib.q4_1_amx_available.restype = i
    lib.q4_1_gemm_i16.argtypes = [p, p, p, i, i, p, i, p, i]
    lib.q4_1_gemm_i16.restype = i
    lib.q4_1_i16_vnni.argtypes = []
    lib.q4_1_i16_vnni.restype = i
    lib.set_amx_min_rows.argtypes = [i, i]
    lib.set_amx_min_rows.restype = None
    if lib.q4_1_amx_available():
        lib.set_amx_min_rows(*amx_min_rows())
    lib.set_panel_min_rows.argtypes = [i, i]
    lib.set_panel_min_rows.restype = None
    lib.set_panel_min_rows(*_built_panel_min_rows(lib))
    lib.q8_0_gemm.argtypes = [p, p, i, i, p, i, p, i]
    lib.q8_0_gemm.restype = i
    lib.decode_layer.argtypes = [
        ctypes.POINTER(LayerShape), ctypes.POINTER(LayerWeights), p, i, p, p, p, p, i, p, i
    ]  # fmt: skip
    lib.decode_layer.restype = i
    lib.decode_layers.argtypes = [
        ctypes.POINTER(LayerShape), ctypes.POINTER(LayerWeights), i, p, i, p, p, p, p, i, p, i
    ]  # fmt: skip
    lib.decode_layers.restype = i
    declare_decode_attention(lib)
    lib.chunk_attention.argtypes = [ctypes.POINTER(ChunkShape), p, i, p, p, i, p, p, i]
    lib.chunk_attention.restype = i
    f = ctypes.c_float
    lib.add_rms_norm.argtypes = [p, p, p, i, i, f, p, i]
    lib.add_rms_norm.restype = None
    lib.rope_rows.argtypes = [p, i, i, i, i, p, p, i]
    lib.rope_rows.restype = None
    lib.silu_mul.argtypes = [p, i, i, p, i]
    lib.silu_mul.restype = None
    lib.sample_rows.argtypes = [p, i, i, p, p, p, p, p, p, i]
    lib.sample_rows.restype = None
    lib.spec_sample.argtypes = [p, i, f, i, f, f, ctypes.c_int64, f, f]
    lib.spec_sample.restype = ctypes.c_int64
    return lib


class Q4Matrix(ctypes.Structure):
    _fields_ = [
        ("qs", ctypes.c_void_p),
        ("d", ctypes.c_void_p),
        ("m", ctypes.c_void_p),
        ("n", ctypes.c_int),
        ("k", ctypes.c_int),
    ]


class LayerWeights(ctypes.Structure):
    _fields_ = [
        ("input_norm", ctypes.c_void_p),
        ("post_norm", ctypes.c_void_p),
        ("qkv", Q4Matrix),
        ("o", Q4Matrix),
        ("gate_up", Q4Matrix),
        ("down", Q4Matrix),
    ]


class LayerShape(ctypes.Structure):
    _fields_ = [
        ("hidden", ctypes.c_int),
        ("heads", ctypes.c_int),
        ("kv_heads", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("inter", ctypes.c_int),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("block_size", ctypes.c_int),
        ("num_blocks", ctypes.c_int),
        ("kv_half", ctypes.c_int),  # the pool's elements: float16 (1) or float32 (0)
    ]


# The KV pools the attention kernels read: float32, or float16 (their shapes' kv_half).
KV_DTYPES = (torch.float32, torch.float16)


def kv_half(pool: torch.Tensor) -> int:
    """The kernels' shapes' kv_half for this pool: 1 where it is float16."""
    return int(pool.dtype == torch.float16)


class ChunkShape(ctypes.Structure):
    """An attention layer's heads and its KV pool's blocks as the chunk attention takes them
    (chunk_attention.c), and whether its products run in bf16."""

    _fields_ = [
        ("heads", ctypes.c_int),
        ("kv_heads", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("block_size", ctypes.c_int),
        ("num_blocks", ctypes.c_int),
        ("scale", ctypes.c_float),
        ("kv_half", ctypes.c_int),  # the pool's elements: float16 (1) or float32 (0)
        ("bf16", ctypes.c_int),
    ]


def declare_decode_attention(lib: ctypes.CDLL) -> None:
    """decode_attention's argument types in `lib` (this build, or another checkout's for a
    benchmark)."""
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.decode_attention.argtypes = [ctypes.POINTER(LayerShape), p, i, p, p, i, p, p, i]
    lib.decode_attention.restype = i


def _attend(
    fn: Callable[..., int],
    shape: LayerShape | ChunkShape,
    qkv: torch.Tensor,
    positions: torch.Tensor,
    tables: torch.Tensor,
    width: int,
    pool: torch.Tensor,
    nthreads: int,
) -> tuple[int, torch.Tensor]:
    """One of the attention kernels' calls over the pool: (its return code, the output)."""
    rows = qkv.shape[0]
    out = torch.empty(rows, shape.heads, shape.head_dim, dtype=torch.float32)
    rc = fn(
        ctypes.byref(shape), qkv.data_ptr(), rows, positions.data_ptr(), tables.data_ptr(),
        width, pool.data_ptr(), out.data_ptr(), nthreads,
    )  # fmt: skip
    return int(rc), out


def decode_attention(
    lib: ctypes.CDLL,
    shape: LayerShape,
    qkv: torch.Tensor,
    positions: torch.Tensor,
    tables: torch.Tensor,
    pool: torch.Tensor,
    nthreads: int,
) -> torch.Tensor:
    """The native path's attention alone, as its steps run it (quant_gemm.c): qkv [rows,
    heads + 2 * kv_heads, head_dim] float32 contiguous, the rows' K/V already in `pool`
    (float32, or float16 with shape.kv_half: [2 * kv_heads, blocks, block_size, head_dim]);
    positions int64 [rows]; tables
    int64 [rows, width], one block table a row (consecutive rows with equal tables are one
    sequence's chunk). Returns [rows, heads, head_dim]."""
    rc, out = _attend(lib.decode_attention, shape, qkv, positions, tables, tables.shape[1],
                      pool, nthreads)  # fmt: skip
    if rc:
        raise MemoryError("decode_attention: out of memory for its scores")
    return out


def chunk_attention(
    lib: ctypes.CDLL,
    shape: ChunkShape,
    qkv: torch.Tensor,
    positions: torch.Tensor,
    table: torch.Tensor,
    pool: torch.Tensor,
    nthreads: int,
) -> torch.Tensor | None:
    """One sequence's chunk of rows over its paged context (chunk_attention.c): qkv [rows,
    heads + 2 * kv_heads, head_dim] float32 contiguous, its rows' K/V already in `pool`
    (float32, or float16 with shape.kv_half: [2 * kv_heads, blocks, block_size, head_dim]);
    positions int64 [rows], table
    int64 [blocks of the sequence]. Returns [rows, heads, head_dim], or None for a shape the
    kernel does not take."""
    rc, out = _attend(lib.chunk_attention, shape, qkv, positions, table, table.shape[0], pool,
                      nthreads)  # fmt: skip
    if rc == -1:
        return None
    if rc:
        raise RuntimeError("chunk_attention: a row's position is past its block table")
    return out


_Q4_FNS = {
    "int8": "q4_1_gemm",
    "bf16": "q4_1_gemm_bf16",
    "amx": "q4_1_gemm_amx",
    "i16": "q4_1_gemm_i16",
}


def q4_1_gemm(
    lib: ctypes.CDLL,
    qs: torch.Tensor,
    d: torch.Tensor,
    m: torch.Tensor,
    x: torch.Tensor,
    n: int,
    kind: str = "int8",
) -> torch.Tensor:
    """x [rows, K] float32 contiguous @ the n columns of Q4_1 weights in the kernel layout
    (quantized.Q4_1.for_kernel: qs [N', K/2], d and m [N', K/32], N' = n rounded up to 8).T
    with x quantized to int8 per block of 32 (kind "int8": the native path's product, on
    AMX's tiles from amx_min_rows() rows where they run), or rounded to bf16 against the
    exact weights ("bf16": float precision for prompts' rows, where bf16_gemm_available()),
    or both rounded to bf16 on AMX tiles ("amx", where amx_available(); n a multiple of 32),
    or at 16 bits a block against the weights' integers unpacked once per 16 columns ("i16",
    panel_gemm.c: float precision for prompts' rows on AVX2, wherever the kernels load)."""
    rows, k = x.shape
    y = torch.empty(rows, n, dtype=torch.float32)
    rc = getattr(lib, _Q4_FNS[kind])(
        qs.data_ptr(), d.data_ptr(), m.data_ptr(), n, k, x.data_ptr(), rows, y.data_ptr(),
        threads(),
    )  # fmt: skip
    if rc:
        raise RuntimeError(f"{_Q4_FNS[kind]} failed ({rc})")
    return y


def amx_available() -> bool:
    """Whether the 4-bit products run on AMX tiles here (built with AMX, the tiles granted)."""
    lib = load()
    return lib is not None and bool(lib.q4_1_amx_available())


def i16_vnni_available() -> bool:
    """Whether the 16-bit-activation 4-bit product was built with its AVX512-VNNI tile."""
    lib = load()
    return lib is not None and bool(lib.q4_1_i16_vnni())


def bf16_gemm_available() -> bool:
    """Whether the kernels were built with the bf16-activation 4-bit product (AVX512-BF16)."""
    lib = load()
    return lib is not None and bool(lib.q4_1_bf16_available())


def q8_0_gemm(
    lib: ctypes.CDLL, qs: torch.Tensor, d: torch.Tensor, x: torch.Tensor, n: int
) -> torch.Tensor:
    """x [rows, K] float32 contiguous @ the n columns of Q8_0 weights in the kernel layout
    (quantized.Q8_0.for_kernel: qs int8 [N', K], d float32 [N', K/32]).T, x at 16 bits a
    block (on AMX's tiles from amx_min_rows()[1] rows where they run: both in bf16)"""
    rows, k = x.shape
    y = torch.empty(rows, n, dtype=torch.float32)
    rc = lib.q8_0_gemm(
        qs.data_ptr(), d.data_ptr(), n, k, x.data_ptr(), rows, y.data_ptr(),
        threads(),
    )  # fmt: skip
    if rc:
        raise RuntimeError(f"q8_0_gemm failed ({rc})")
    return y


def sample_rows(
    lib: ctypes.CDLL,
    logits: torch.Tensor,
    temps: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    u: torch.Tensor,
) -> torch.Tensor:
    """One token per row of logits [rows, vocab] float32 contiguous (sample.c): temps, top_p,
    min_p, u float32 [rows], top_k int32 [rows]; -1 where the row must be drawn over the
    whole vocabulary by the caller."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    lib.sample_rows(
        logits.data_ptr(), rows, vocab, temps.data_ptr(), top_k.data_ptr(), top_p.data_ptr(),
        min_p.data_ptr(), u.data_ptr(), out.data_ptr(), threads(),
    )  # fmt: skip
    if (out == -2).any():
        raise MemoryError("sample_rows: out of memory")
    return out
