"""Small native kernels, built ahead (python -m inference.engine.kernels.build, run by
scripts/setup.sh and the Dockerfile) and loaded here with ctypes, which drops the GIL
during a call. The C files, by job:

- activations.c: a product's input quantized per row and block (int8, int16, bf16);
- q4_1_gemm.c, q8_0_gemm.c, q4_1_bf16_gemm.c: each weight format's products of a few rows;
- amx_gemm.c, panel_gemm.c: the same products for many rows, on AMX's tiles or on weights
  unpacked once;
- gemm_dispatch.c: which of them serves a product's rows (the limits cpu_backend.py sets);
- thread_pool.c: the kernels' own pool (spinning between a step's products, asleep between
  steps);
- decode_attention.c, decode_layer.c: a whole decoder layer for steps of a few rows and its
  attention over the paged pool; chunk_attention.c: a prompt chunk's attention;
- row_ops.c: norms, rope and activation for steps whose products run in the pool;
- sample.c: the sampler's filtered draws.

Why our own: at one row a step is bound by the bytes of weights it reads, so 4-bit weights
should cost a quarter of bf16; torch's int4 product is fast only with AVX512. A process
loads the best build its CPU can run (cpu_backend.runnable_isas) and never compiles; with
none built, `load()` returns None, says so once, and the engine keeps its torch weights.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from functools import cache

import torch

from inference.engine import cpu_backend
from inference.engine.cpu_backend import Backend, Isa, cpu_has_amx, cpu_has_native_bf16
from inference.engine.kernels.library import BUILT_DIR, flags, headers, library_path, sources

__all__ = ["cpu_has_amx", "cpu_has_native_bf16"]

log = logging.getLogger(__name__)

# What the kernels are built from (benchmarks build another checkout's with these names).
SOURCES = sources()
HEADERS = headers()


def amx_min_rows() -> tuple[int, int]:
    """cpu_backend.amx_min_rows (benchmarks and tests put the kernels' back with it)."""
    return cpu_backend.amx_min_rows()


def default_panel_min_rows() -> tuple[int, int]:
    """What `load()` sets for the panels of the build loaded here."""
    return backend().kernel_min_rows()[1]


_threads: int | None = None


def set_threads(n: int | None) -> None:
    """How many threads the kernels' own pool uses (None: torch's count). The engine gives
    small steps their count here and keeps torch's at one meanwhile: torch's OpenMP threads
    spin for a while after each op, on the cores this pool wants next."""
    global _threads
    _threads = n


def threads() -> int:
    return _threads if _threads is not None else torch.get_num_threads()


@cache
def _loaded() -> tuple[ctypes.CDLL, Isa] | None:
    for isa in cpu_backend.runnable_isas():
        path = library_path(isa)
        if not path.is_file():
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            log.warning("native kernels: the %s build does not load: %s", isa.name, exc)
            continue
        declare(lib)
        chosen = Backend(isa, bool(lib.q4_1_amx_available()))
        amx, panel = chosen.kernel_min_rows()
        lib.set_chunk_amx(int(chosen.chunk_amx))
        lib.set_amx_min_rows(*amx)
        lib.set_panel_min_rows(*panel)
        lib.set_pair_min_rows(*cpu_backend.pair_min_rows())
        log.info("native kernels: the %s build (%s)", isa.name, path.name)
        return lib, isa
    log.warning("native kernels off, the engine uses torch's products: %s", _why_none())
    return None


def _why_none() -> str:
    if not cpu_backend.supported_isas():
        missing = sorted(cpu_backend.AVX2.needs - cpu_backend.cpu_flags())
        return f"this CPU lacks {', '.join(missing)}"
    build = "python -m inference.engine.kernels.build"
    if any(BUILT_DIR.glob("kernels-*.so")):
        return f"they were built from other sources; run `{build}`"
    return f"they are not built in {BUILT_DIR}; run `{build}` (scripts/setup.sh does)"


def load() -> ctypes.CDLL | None:
    """The best build of the kernels this CPU runs, loaded once; None where none is built
    (said once, as a warning)."""
    loaded = _loaded()
    return None if loaded is None else loaded[0]


def loaded_isa() -> Isa | None:
    """The instruction set of the build load() returns."""
    loaded = _loaded()
    return None if loaded is None else loaded[1]


@cache
def backend() -> Backend:
    """The CPU backend of the build loaded here: which product and threads serve a step."""
    return Backend(loaded_isa(), amx_tiles=amx_available())


def cpu_build_flags() -> list[str]:
    """The compiler flags of the loaded build (benchmarks build other sources with them)."""
    isa = loaded_isa() or (cpu_backend.runnable_isas() or [cpu_backend.AVX2])[0]
    return flags(isa)


def declare(lib: ctypes.CDLL) -> None:
    """The argument and return types of the library's functions."""
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.q4_1_gemm.argtypes = [p, p, p, i, i, p, i, p, i, p, p, p]
    lib.q4_1_gemm.restype = i
    lib.q4_1_gemm_bf16.argtypes = [p, p, p, i, i, p, i, p, i, p, p, p]
    lib.q4_1_gemm_bf16.restype = i
    lib.q4_1_bf16_available.argtypes = []
    lib.q4_1_bf16_available.restype = i
    lib.q4_1_gemm_amx.argtypes = [p, p, p, i, i, p, i, p, i, p, p, p]
    lib.q4_1_gemm_amx.restype = i
    lib.q4_1_amx_available.argtypes = []
    lib.q4_1_amx_available.restype = i
    lib.q4_1_gemm_i16.argtypes = [p, p, p, i, i, p, i, p, i, p, p, p]
    lib.q4_1_gemm_i16.restype = i
    lib.q4_1_i16_vnni.argtypes = []
    lib.q4_1_i16_vnni.restype = i
    lib.set_amx_min_rows.argtypes = [i, i]
    lib.set_amx_min_rows.restype = None
    lib.set_panel_min_rows.argtypes = [i, i]
    lib.set_panel_min_rows.restype = None
    lib.set_chunk_amx.argtypes = [i]
    lib.set_chunk_amx.restype = None
    lib.set_pair_min_rows.argtypes = [i, i]
    lib.set_pair_min_rows.restype = None
    lib.q8_0_gemm.argtypes = [p, p, i, i, p, i, i, p, i, p]
    lib.q8_0_gemm.restype = i
    lib.q8_0_layers_gemm.argtypes = [p, p, i, i, p, i, i, p, i, p]
    lib.q8_0_layers_gemm.restype = i
    lib.decode_layer.argtypes = [
        ctypes.POINTER(LayerShape), ctypes.POINTER(LayerWeights), p, i, i, p, p, p, p, i, p, i
    ]  # fmt: skip
    lib.decode_layer.restype = i
    lib.decode_layers.argtypes = [
        ctypes.POINTER(LayerShape), ctypes.POINTER(LayerWeights), i, p, i, i, p, p, p, p, i, p, i
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
    lib.argmax_rows.argtypes = [p, i, i, p, i]
    lib.argmax_rows.restype = None
    lib.spec_sample.argtypes = [p, i, f, i, f, f, ctypes.c_int64, f, f]
    lib.spec_sample.restype = ctypes.c_int64
    lib.sample_kept.argtypes = [p, i, f, i, f, f, p]
    lib.sample_kept.restype = i


class Q4Matrix(ctypes.Structure):
    _fields_ = [
        ("qs", ctypes.c_void_p),
        ("d", ctypes.c_void_p),
        ("m", ctypes.c_void_p),
        ("n", ctypes.c_int),
        ("k", ctypes.c_int),
        ("sc", ctypes.c_void_p),  # Q4_K's per-block scale and minimum; None for Q4_1
        ("mn", ctypes.c_void_p),
        ("qh", ctypes.c_void_p),  # Q5_K's fifth bits; None for Q4_1 and Q4_K
    ]


class Q8Matrix(ctypes.Structure):
    _fields_ = [
        ("qs", ctypes.c_void_p),
        ("d", ctypes.c_void_p),  # Q8_0's float32 scales; None for Q6_K
        ("n", ctypes.c_int),
        ("k", ctypes.c_int),
        ("sc", ctypes.c_void_p),  # Q6_K's int8 scale per 16 and float16 d per 256
        ("d6", ctypes.c_void_p),
    ]


def q8_matrix(
    qs: torch.Tensor, d: torch.Tensor, n: int, k: int, sc: torch.Tensor | None
) -> Q8Matrix:
    """Q8_0 blocks in the kernel layout as the C structs hold them, or Q6_K's (`sc` given:
    quantized.Q6_K.for_kernel, d its float16 d per 256)."""
    if sc is None:
        return Q8Matrix(qs.data_ptr(), d.data_ptr(), n, k)
    return Q8Matrix(qs.data_ptr(), None, n, k, sc.data_ptr(), d.data_ptr())


# LayerMatrix.format (decode.h): which of its matrices holds the product's weights.
LAYER_Q4_1, LAYER_Q8_0 = 0, 1


class LayerMatrix(ctypes.Structure):
    _fields_ = [
        ("format", ctypes.c_int),
        ("q4", Q4Matrix),
        ("q8", Q8Matrix),
    ]


class LayerWeights(ctypes.Structure):
    _fields_ = [
        ("input_norm", ctypes.c_void_p),
        ("post_norm", ctypes.c_void_p),
        ("q_norm", ctypes.c_void_p),
        ("k_norm", ctypes.c_void_p),
        ("qkv_bias", ctypes.c_void_p),
        ("qkv", LayerMatrix),
        ("o", LayerMatrix),
        ("gate_up", LayerMatrix),
        ("down", LayerMatrix),
        ("qkv_v", LayerMatrix),
        ("qkv_split", ctypes.c_int),
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
        ("kv_type", ctypes.c_int),  # the pool's elements: kv_type(pool)
    ]


# The KV pools the attention kernels read, by their shapes' kv_type (simd.h's KV_*):
# float32, float16, or int8 rows with their scales (kv_codec.py).
KV_TYPES = {torch.float32: 0, torch.float16: 1, torch.int8: 2}
KV_DTYPES = tuple(KV_TYPES)


def kv_type(pool: torch.Tensor) -> int:
    """The kernels' shapes' kv_type for this pool."""
    return KV_TYPES[pool.dtype]


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
        ("kv_type", ctypes.c_int),  # the pool's elements: kv_type(pool)
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
    """The native path's attention alone, as its steps run it (decode_attention.c): qkv [rows,
    heads + 2 * kv_heads, head_dim] float32 contiguous, the rows' K/V already in `pool`
    (of shape.kv_type: [2 * kv_heads, blocks, block_size, kv_codec.row_width]);
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
    (of shape.kv_type: [2 * kv_heads, blocks, block_size, kv_codec.row_width]);
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
    sc: torch.Tensor | None = None,
    mn: torch.Tensor | None = None,
    qh: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [rows, K] float32 contiguous @ the n columns of Q4_1 weights in the kernel layout
    (quantized.Q4_1.for_kernel: qs [N', K/2], d and m [N', K/32], N' = n rounded up to 8).T,
    or Q4_K's (`sc` and `mn` given: quantized.Q4_K.for_kernel, d and m then per 256 k), or
    Q5_K's (`qh` too: quantized.Q5_K.for_kernel)
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
        threads(), None if sc is None else sc.data_ptr(), None if mn is None else mn.data_ptr(),
        None if qh is None else qh.data_ptr(),
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
    lib: ctypes.CDLL,
    qs: torch.Tensor,
    d: torch.Tensor,
    x: torch.Tensor,
    n: int,
    as_rows: int | None = None,
    sc: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [rows, K] float32 contiguous @ the n columns of Q8_0 weights in the kernel layout
    (quantized.Q8_0.for_kernel: qs int8 [N', K], d float32 [N', K/32]).T, or Q6_K's (`sc`
    given: quantized.Q6_K.for_kernel, d then float16 per 256 k), x at 16 bits a block (on
    AMX's tiles from amx_min_rows()[1] rows where they run: both in bf16), by the product a
    step of `as_rows` rows takes (default: x's rows; fewer where the rows must come out as
    a smaller step's would, gemm_dispatch.c)"""
    return _q8_product(lib.q8_0_gemm, qs, d, x, n, as_rows, sc)


def q8_0_layers_gemm(
    lib: ctypes.CDLL,
    qs: torch.Tensor,
    d: torch.Tensor,
    x: torch.Tensor,
    n: int,
    sc: torch.Tensor | None = None,
) -> torch.Tensor:
    """The native path's product of a Q8_0 or Q6_K layer matrix (q8_0_gemm's weights):
    x at 8 bits a block where the kernels have AVX512-VNNI (as llama.cpp takes them), else
    at 16 (gemm_dispatch.c's q8_layers_matmul)."""
    return _q8_product(lib.q8_0_layers_gemm, qs, d, x, n, None, sc)


def _q8_product(
    fn: Callable[..., int],
    qs: torch.Tensor,
    d: torch.Tensor,
    x: torch.Tensor,
    n: int,
    as_rows: int | None,
    sc: torch.Tensor | None,
) -> torch.Tensor:
    """One of the Q8_0/Q6_K entry points (q8_0_gemm, q8_0_layers_gemm: the same arguments)."""
    rows, k = x.shape
    y = torch.empty(rows, n, dtype=torch.float32)
    rc = fn(
        qs.data_ptr(), d.data_ptr(), n, k, x.data_ptr(), rows,
        rows if as_rows is None else as_rows, y.data_ptr(), threads(),
        None if sc is None else sc.data_ptr(),
    )  # fmt: skip
    if rc:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed ({rc})")
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
    """One token per row of logits [rows, vocab] float32 contiguous (sample.c), drawn from
    what sampler.filter_logits + softmax gives: temps, top_p, min_p, u (the draws' uniforms)
    float32 [rows], top_k int32 [rows]."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    lib.sample_rows(
        logits.data_ptr(), rows, vocab, temps.data_ptr(), top_k.data_ptr(), top_p.data_ptr(),
        min_p.data_ptr(), u.data_ptr(), out.data_ptr(), threads(),
    )  # fmt: skip
    if (out == -2).any():
        raise MemoryError("sample_rows: out of memory")
    return out


def argmax_rows(lib: ctypes.CDLL, logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) of logits [rows, vocab] float32 contiguous (sample.c):
    each row's first largest value, or its first NaN; spread over the kernels' threads."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    lib.argmax_rows(logits.data_ptr(), rows, vocab, out.data_ptr(), threads())
    return out


def sample_kept(
    lib: ctypes.CDLL, logits: torch.Tensor, temp: float, top_k: int, top_p: float, min_p: float
) -> torch.Tensor:
    """Which tokens sample_rows draws among for one row of logits [vocab] float32
    contiguous: a bool tensor [vocab] (for tests)."""
    kept = torch.empty(logits.shape[0], dtype=torch.uint8)
    n = lib.sample_kept(
        logits.data_ptr(), logits.shape[0], temp, top_k, top_p, min_p, kept.data_ptr()
    )
    if n == -2:
        raise MemoryError("sample_kept: out of memory")
    return kept.bool()
