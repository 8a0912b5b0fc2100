"""4-bit and 8-bit block weights: the GGUF's own blocks, their kernels, and the hybrid step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from inference.engine import cpu_backend, kernels, model_runner
from inference.engine.cpu_backend import (
    AMX_BLOCK_ROWS,
    AMX_COLUMNS,
    BF16_BLOCK_ROWS,
    HYBRID_MAX_ROWS,
    I16_BLOCK_ROWS,
)
from inference.engine.kernel_check import random_q4_k, random_q5_k
from inference.engine.layers.linear import (
    Linear,
    blocks_take_every_row,
    default_native_max_rows,
    head_block_rows,
)
from inference.engine.models.loader import load_blocks, load_weights
from inference.engine.quantized import Q4_1, Q8_0
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence
from tests.engine.conftest import (
    needs_kernels,
    run_in_avx2_build,
    run_to_completion,
    token_ids_of,
)


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def test_q4_1_quantization_is_within_half_a_step_of_each_weight():
    w = _weight(96, 128)
    q = Q4_1.quantize(w)
    step = q.d.repeat_interleave(32, dim=1)
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-6).all()


def test_kernel_layout_keeps_the_same_weights():
    q = Q4_1.quantize(_weight(40, 192))
    torch.testing.assert_close(q.for_kernel().dequantize(), q.dequantize(), atol=2e-3, rtol=1e-3)


@needs_kernels
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_block_products_match_the_dequantized_weights(rows):
    """Activations are quantized to 8 bits per block of 32, as llama.cpp does: the product
    stays within a percent of the float product with the same (dequantized) weights."""
    x = torch.randn(rows, 256)
    q = Q4_1.quantize(_weight(70, 256)).for_kernel()
    assert _rel_err(q.matmul_t(x), x @ q.dequantize().T) < 0.01


def test_q8_0_quantization_is_within_half_a_step_of_each_weight():
    w = _weight(48, 96)
    q = Q8_0.quantize(w)
    step = q.d.repeat_interleave(32, dim=1)
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-6).all()


@needs_kernels
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_q8_0_product_keeps_float_precision_despite_an_outlier(rows):
    """The head's activations go in at 16 bits: with one input 30x the rest (as the final
    hidden state has), the product still matches the float one to ~1e-4, where 8-bit
    activations would be off by about a percent."""
    x = torch.randn(rows, 192)
    x[:, 7] *= 30
    q = Q8_0.quantize(_weight(75, 192))
    want = (x.double() @ q.dequantize().double().T).float()
    assert _rel_err(q.for_kernel().matmul_t(x), want) < 2e-4


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 9, 13, 100])
@pytest.mark.parametrize("n", [70, 96])
def test_i16_products_keep_float_precision_despite_an_outlier(rows, n):
    """Kind "i16" takes x at 16 bits per block of 32 against the weights' integers: with one
    input 30x the rest, within 1e-4 of the float64 product of the exact weights, whatever
    the rows (whole and partial tiles of 4 rows, of 8 with AVX512-VNNI) and columns (a last
    chunk of 16 cut short, a zero-padded group); the 8-bit activations' product is off by
    about a percent."""
    x = torch.randn(rows, 256)
    x[:, 7] *= 30
    q = Q4_1.quantize(_weight(n, 256)).for_kernel()
    want = (x.double() @ q.dequantize().double().T).float()
    assert _rel_err(q.matmul_t(x, kind="i16"), want) < 1e-4
    assert _rel_err(q.matmul_t(x), want) > 1e-3


needs_amx = pytest.mark.skipif(
    not kernels.amx_available(), reason="no AMX tiles here (CPU without AMX, or not granted)"
)


@needs_amx
@pytest.mark.parametrize("rows", [1, 15, 16, 17, 33, 100])
def test_amx_products_round_only_the_weights_and_x_to_bf16(rows):
    """On AMX's tiles the 4-bit weights are unpacked to bf16 (d * q + m, to nearest) and x
    rounded to bf16; sums are float32: the product is the float64 one of those roundings,
    whatever the rows (whole and partial 16-row tiles)."""
    x = torch.randn(rows, 256)
    q = Q4_1.quantize(_weight(96, 256)).for_kernel()
    want = (x.bfloat16().double() @ q.dequantize().bfloat16().double().T).float()
    assert _rel_err(q.matmul_t(x, kind="amx"), want) < 1e-4


@needs_amx
@pytest.mark.parametrize("rows", [4, 16, 37])
def test_amx_head_keeps_an_outliers_neighbours(rows):
    """The head's Q8_0 blocks on the tiles: x in bf16 gives each value its own exponent, so
    an input 30x the rest costs its block nothing (8-bit activations lost ~1%)."""
    x = torch.randn(rows, 192)
    x[:, 7] *= 30
    q = Q8_0.quantize(_weight(96, 192))
    want = (x.bfloat16().double() @ q.dequantize().bfloat16().double().T).float()
    exact = (x.double() @ q.dequantize().double().T).float()
    assert kernels.amx_min_rows()[1] <= 4
    got = q.for_kernel().matmul_t(x)
    assert _rel_err(got, want) < 1e-5 and _rel_err(got, exact) < 5e-3


@needs_amx
def test_native_products_take_the_tiles_from_amx_min_rows():
    """The native path's product (kind int8) is the tiles' from AMX_MIN_ROWS rows, and the
    8-bit one below; a matrix whose outputs are not whole chunks of 32 keeps the 8-bit one
    (the tiles' own entry refuses it)."""
    start = kernels.amx_min_rows()[0]
    q = Q4_1.quantize(_weight(96, 256)).for_kernel()
    x = torch.randn(start, 256)
    assert torch.equal(q.matmul_t(x), q.matmul_t(x, kind="amx"))
    assert not torch.equal(q.matmul_t(x[:-1]), q.matmul_t(x[:-1], kind="amx"))
    odd = Q4_1.quantize(_weight(72, 256)).for_kernel()
    assert _rel_err(odd.matmul_t(x), x @ odd.dequantize().T) < 0.01
    with pytest.raises(RuntimeError, match=r"q4_1_gemm_amx failed \(-2\)"):
        odd.matmul_t(x, kind="amx")


def test_amx_min_rows_reads_its_setting(monkeypatch):
    monkeypatch.setenv("ENGINE_AMX_MIN_ROWS", "0")
    assert kernels.amx_min_rows() == (0, 0)
    monkeypatch.setenv("ENGINE_AMX_MIN_ROWS", "")
    assert kernels.amx_min_rows() == cpu_backend.AMX_MIN_ROWS
    monkeypatch.setenv("ENGINE_AMX_MIN_ROWS", "many")
    with pytest.raises(ValueError, match="ENGINE_AMX_MIN_ROWS must be an integer, got 'many'"):
        kernels.amx_min_rows()


@contextmanager
def _panel_rows(layers: int, head: int) -> Iterator[None]:
    lib = kernels.load()
    assert lib is not None
    lib.set_panel_min_rows(layers, head)
    try:
        yield
    finally:
        lib.set_panel_min_rows(*kernels.default_panel_min_rows())


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 7, 8, 9, 16, 17, 64])
@pytest.mark.parametrize("n", [70, 96, 1000])
def test_panel_tiles_give_the_8bit_kernels_products(rows, n):
    """The native path's products on panel_gemm.c's tiles (512-bit where built for
    AVX512-VNNI, else AVX2's) take the same activations (8 bits a block for the layers, 16
    for the head) and make the same integer sums as the 8-bit kernels, whatever the rows
    (whole and partial tiles of 8 or 4) and columns (a last panel of 16 cut short, a
    zero-padded group): the layers' float sums differ only in their order, the head's not
    at all."""
    _panel_products_agree(rows, n)


def _panel_products_agree(rows: int, n: int) -> None:
    x = torch.randn(rows, 256)
    x[:, 7] *= 30
    q4 = Q4_1.quantize(_weight(n, 256)).for_kernel()
    q8 = Q8_0.quantize(_weight(n, 256, seed=1)).for_kernel()
    with _panel_rows(0, 0):
        want4, want8 = q4.matmul_t(x), q8.matmul_t(x)
    with _panel_rows(1, 1):
        got4, got8 = q4.matmul_t(x), q8.matmul_t(x)
    torch.testing.assert_close(got4, want4, rtol=1e-5, atol=1e-5)
    assert torch.equal(got8, want8)


@needs_kernels
def test_the_avx2_builds_panel_tiles_where_the_cpu_has_avx512_too():
    """The AVX2 tiles serve CPUs without AVX512-VNNI; on one that has it they are built only
    when asked (ENGINE_KERNELS_AVX512=0, as for comparisons), so a process of its own checks
    them here as the test above does, wherever the suite runs."""
    code = (
        "from inference.engine import kernels\n"
        "from tests.engine.test_quantized import _panel_products_agree\n"
        "assert not kernels.i16_vnni_available()\n"
        "for rows in (1, 3, 4, 5, 17, 64):\n"
        "    for n in (70, 1000):\n"
        "        _panel_products_agree(rows, n)\n"
        "print('agreed')\n"
    )
    run_in_avx2_build(code)


def test_panel_min_rows_reads_its_setting(monkeypatch):
    monkeypatch.setenv("ENGINE_PANEL_MIN_ROWS", "")
    assert cpu_backend.panel_min_rows() == cpu_backend.PANEL_MIN_ROWS["avx512"]
    assert cpu_backend.panel_min_rows(vnni=False) == cpu_backend.PANEL_MIN_ROWS["avx2"]
    monkeypatch.setenv("ENGINE_PANEL_MIN_ROWS", "0")
    assert cpu_backend.panel_min_rows() == (0, 0)
    monkeypatch.setenv("ENGINE_PANEL_MIN_ROWS", "12")
    assert cpu_backend.panel_min_rows(vnni=False) == (12, 12)
    monkeypatch.setenv("ENGINE_PANEL_MIN_ROWS", "many")
    with pytest.raises(ValueError, match="ENGINE_PANEL_MIN_ROWS must be an integer, got 'many'"):
        cpu_backend.panel_min_rows()


def test_without_avx512_the_engine_chooses_as_on_an_avx2_only_cpu(monkeypatch):
    """ENGINE_KERNELS_AVX512=0 stands for an AVX2-only CPU in comparisons: not the AVX2
    build beside choices made for this CPU's AVX512-BF16 or AMX (bf16 large steps on
    oneDNN, the tiles' row limits, unsplit mixed steps), which no such CPU takes."""
    monkeypatch.setenv("ENGINE_KERNELS_AVX512", "1")
    assert cpu_backend.engine_cpu_flags() == cpu_backend.cpu_flags()
    monkeypatch.setenv("ENGINE_KERNELS_AVX512", "0")
    flags = cpu_backend.engine_cpu_flags()
    assert not any(f.startswith(("avx512", "amx")) for f in flags)
    assert cpu_backend.AVX2.needs <= flags or not cpu_backend.AVX2.needs <= cpu_backend.cpu_flags()
    assert cpu_backend.runnable_isas() in ([cpu_backend.AVX2], [])
    assert not cpu_backend.cpu_has_native_bf16() and not cpu_backend.cpu_has_amx()
    backend = cpu_backend.Backend(cpu_backend.AVX2)
    assert backend.large_format(torch.float32) == "fp16"
    assert backend.prompt_product(backend.large_format(torch.float32)) == "i16"
    assert backend.split_mixed("auto")


def test_hybrid_linear_takes_blocks_for_small_steps_and_fp16_for_large_ones():
    w = _weight(64, 128)
    lin = Linear(w, "fp16", Q4_1.quantize(w), HYBRID_MAX_ROWS)
    x = torch.randn(HYBRID_MAX_ROWS + 1, 128)
    small = lin(x[:HYBRID_MAX_ROWS])
    torch.testing.assert_close(small, lin.blocks.matmul_t(x[:HYBRID_MAX_ROWS]))  # type: ignore[union-attr]
    large = lin(x)
    fp16_ref = torch.ops.quantized.linear_dynamic_fp16(x, lin.packed)
    torch.testing.assert_close(large, fp16_ref)


def _generate(make_engine, native: bool, prompts: list[list[int]], **config: object):
    # A float32 pool: the paths' K/V a float32 ulp apart can round to neighbouring float16s,
    # and this random tiny model's near-ties then flip (test_kv_dtype.py has float16's).
    config.setdefault("kv_dtype", "float32")
    engine = make_engine(quantization="hybrid", **config)
    assert engine.runner.model.native is not None
    if not native:
        engine.runner.model.native = None
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=24, temperature=0.0), f"r{i}")
    return {k: token_ids_of(v) for k, v in run_to_completion(engine).items()}


@needs_kernels
def test_native_decode_steps_give_the_torch_paths_tokens(make_engine):
    """The one-call-per-layer path (native_decode.py) is the same maths as the torch
    forward on the same 4-bit weights: greedy output is token-for-token the same."""
    prompts = [[5 + i, 17, 300 + 7 * i, 42] * (3 + i) for i in range(3)]
    assert _generate(make_engine, True, prompts) == _generate(make_engine, False, prompts)


@needs_kernels
def test_decode_rows_attend_over_many_blocks_like_the_torch_path(make_engine):
    """Decode rows alone attend block by block, a row's query heads that share a KV head one
    after the other on one core, the values summed in registers (on 512-bit vectors where
    the kernels are built for AVX512: this model's head_dim is 16): over contexts of 17 to
    ~160 positions (whole and partial blocks, many blocks a row), greedy tokens equal the
    torch path's."""
    prompts = [[3 + (5 * i + j) % 400 for j in range(n)] for i, n in enumerate((17, 33, 100, 131))]
    assert _generate(make_engine, True, prompts) == _generate(make_engine, False, prompts)


@needs_kernels
def test_native_steps_on_several_threads_give_the_same_tokens(make_engine):
    """The kernels' own thread pool splits each product's columns and the attention's
    heads: more threads, the same sums, so the same greedy tokens (and no hang when the
    pool starts or grows mid-run)."""
    prompts = [[5 + i, 17, 300 + 7 * i, 42] * (3 + i) for i in range(3)]
    one = _generate(make_engine, True, prompts, num_threads=1, small_step_threads=1)
    assert _generate(make_engine, True, prompts, num_threads=3, small_step_threads=3) == one
    assert _generate(make_engine, True, prompts, num_threads=2, small_step_threads=2) == one


@needs_kernels
@pytest.mark.parametrize("threads", [2, 7])
def test_products_claimed_by_many_threads_equal_one_threads(threads):
    """Each product's chunks of columns are claimed one at a time by whichever of the pool's
    threads comes first (more threads than cores: some start late, or not at all): every
    chunk is computed exactly once, by the same code, so the results are bit for bit one
    thread's, for every row count the kernels tile (and column counts that are not whole
    groups of 8; from 17 and 25 rows, the 512-bit tiles' panels of 16 where built)."""
    w4 = Q4_1.quantize(_weight(1000, 192)).for_kernel()
    w8 = Q8_0.quantize(_weight(1003, 96)).for_kernel()
    xs = [torch.randn(rows, 192) for rows in (1, 3, 4, 9, 17, 25)]
    try:
        kernels.set_threads(1)
        want = [(w4.matmul_t(x), w8.matmul_t(x[:, :96].contiguous())) for x in xs]
        kernels.set_threads(threads)
        for _ in range(20):
            for x, (y4, y8) in zip(xs, want, strict=True):
                assert torch.equal(w4.matmul_t(x), y4)
                assert torch.equal(w8.matmul_t(x[:, :96].contiguous()), y8)
    finally:
        kernels.set_threads(None)


def _product_in_child(out: object) -> None:
    q = Q4_1.quantize(_weight(256, 128)).for_kernel()
    out.put(q.matmul_t(torch.ones(2, 128)).sum().item())  # type: ignore[attr-defined]


@needs_kernels
def test_a_forked_child_gets_a_thread_pool_of_its_own():
    """fork() copies only the calling thread: a child of a process whose kernel pool had
    started must not wait for the parent's workers (it would hang forever)."""
    import multiprocessing

    kernels.set_threads(2)
    try:
        q = Q4_1.quantize(_weight(256, 128)).for_kernel()
        want = q.matmul_t(torch.ones(2, 128)).sum().item()  # the parent's pool is running
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_product_in_child, args=(out,))
        child.start()
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
            pytest.fail("the forked child hung in the kernels' thread pool")
        assert child.exitcode == 0 and out.get(timeout=5) == pytest.approx(want)
    finally:
        kernels.set_threads(None)


@needs_kernels
def test_native_path_prefills_short_prompts_causally(make_engine):
    """Prompts of 2-4 tokens go through the native path whole: each row attends only to
    the positions up to its own. Together 8 rows, so the torch path they are compared with
    takes the same 4-bit blocks (past 8 rows it runs prompts in the float format) on every
    CPU."""
    prompts = [[11, 12], [40, 41], [7, 8, 9, 10]]
    assert _generate(make_engine, True, prompts) == _generate(make_engine, False, prompts)


@needs_kernels
def test_chunks_on_the_native_path_attend_like_the_torch_path(make_engine):
    """A follow-up turn's chunk of 8 rows over a 300-token context (a step the native path
    takes whole, 19 blocks) attends row by row as the torch path's chunk attention does in
    tiles: greedy tokens equal the torch path's."""
    first = [(7 * i) % 500 + 3 for i in range(292)]
    # It parts from `first` right after its 18 full blocks (first's partial tail, kept for
    # a follow-up, would otherwise serve 4 more tokens).
    follow = first[:288] + [(13 * i) % 300 + 7 for i in range(4)]
    follow += [(11 * i) % 400 + 5 for i in range(7)]

    def run(native: bool) -> list[int]:
        engine = make_engine(quantization="hybrid", kv_dtype="float32")  # as _generate's
        model = engine.runner.model
        assert model.native is not None and model.native.handles(8, [8])
        if not native:
            model.native = None
        engine.add_request(first, SamplingParams(max_tokens=1, temperature=0.0), "a")
        run_to_completion(engine)
        engine.add_request(follow, SamplingParams(max_tokens=16, temperature=0.0), "b")
        out = run_to_completion(engine)["b"]
        assert out[-1].figures is not None and out[-1].figures.cached_tokens == 288
        return token_ids_of(out)

    assert run(True) == run(False)


@needs_kernels
def test_past_8_rows_the_native_path_takes_decodes_and_guesses_not_prompts(make_engine):
    model = make_engine(quantization="hybrid", native_max_rows=64).runner.model
    native = model.native
    assert native is not None
    # The torch path takes the 4-bit blocks no further: its steps past 8 rows are prompts.
    assert model.layers[0].qkv.block_rows == HYBRID_MAX_ROWS == 8
    assert native.handles(64) and native.handles(40, [5, 5, 4]) and not native.handles(65)
    assert native.handles(8, [8]) and not native.handles(9, [9]) and not native.handles(20, [5, 9])


@needs_kernels
def test_native_path_checks_speculative_guesses_like_the_torch_path(make_engine):
    # (With [5, 6, 7, 8, 9] * 6 the tiny model's 19th token is a near-tie that the two
    # paths' attention sums, in different orders, break differently.)
    prompts = [[6, 7, 8, 9, 10] * 6, [4, 6, 8, 10] * 8]
    spec = {"speculative_mode": "ngram", "num_speculative_tokens": 3}
    native = _generate(make_engine, True, prompts, **spec)
    assert native == _generate(make_engine, False, prompts, **spec)
    assert native == _generate(make_engine, True, prompts)


@needs_kernels
def test_int4_engine_runs_on_blocks_alone(make_engine):
    engine = make_engine(quantization="int4")
    layer = engine.runner.model.layers[0]
    assert layer.qkv.kind == "blocks" and layer.qkv.weight is None and layer.qkv.packed is None
    engine.add_request([7, 8, 9, 10] * 20, SamplingParams(max_tokens=8, temperature=0.0), "a")
    out = run_to_completion(engine)
    assert len(token_ids_of(out["a"])) == 8


@needs_kernels
def test_hybrid_head_takes_8bit_blocks_for_a_row_or_two_and_floats_beyond(make_engine):
    engine = make_engine(quantization="hybrid")
    head = engine.runner.model.lm_head
    assert isinstance(head.blocks, Q8_0) and head.kind in ("fp16", "bf16")
    rows_max = head_block_rows(head.kind, default_native_max_rows(head.kind))
    assert head.block_rows == rows_max
    hidden = torch.randn(rows_max + 1, head.blocks.shape[1])
    blocks_ref = (hidden.double() @ head.blocks.dequantize().double().T).float()
    float_ref = hidden @ engine.runner.model.embed.T  # the tiny model's head is tied
    w = head.blocks.dequantize()
    tiles_ref = (hidden.bfloat16().double() @ w.bfloat16().double().T).float()
    for rows in (1, rows_max):
        got = engine.runner.model.compute_logits(hidden[:rows])
        if kernels.amx_available() and rows >= kernels.amx_min_rows()[1]:
            # on AMX's tiles: d * q and x rounded to bf16, float32 sums
            assert _rel_err(got, tiles_ref[:rows]) < 1e-5
        else:
            assert _rel_err(got, blocks_ref[:rows]) < 2e-4
    got = engine.runner.model.compute_logits(hidden)
    assert _rel_err(got, float_ref) < 5e-3  # fp16 or bf16 weights


@pytest.mark.slow
def test_gguf_blocks_are_exactly_the_converted_checkpoints_weights(real_model_path):
    """The engine multiplies by the GGUF's own 4-bit blocks: dequantized, they are bit for
    bit the float weights transformers converted from the same file (q/k rows included,
    which llama.cpp stores reordered for its rope)."""
    blocks = load_blocks(str(real_model_path))
    assert blocks is not None
    weights = {k.removeprefix("model."): v for k, v in load_weights(str(real_model_path)).items()}
    linears = [k for k in blocks if k.startswith("layers.")]
    assert len(linears) == 30 * 7
    assert all(isinstance(blocks[k], Q4_1) for k in linears)
    assert isinstance(blocks["lm_head.weight"], Q8_0)
    for name, b in blocks.items():
        ref = weights["embed_tokens.weight" if name == "lm_head.weight" else name]
        assert torch.equal(b.dequantize(), ref.float()), name


def test_auto_keeps_float_weights_for_a_model_the_4bit_kernels_cannot_tile():
    from inference.engine.model_runner import resolve_quantization

    cpu = torch.device("cpu")
    assert resolve_quantization("auto", cpu, torch.float32, model_fits_blocks=False) == "fp16"
    fits = resolve_quantization("auto", cpu, torch.float32, model_fits_blocks=True)
    assert fits == ("hybrid" if kernels.load() is not None else "fp16")


def _mixed_batch(engine):
    """Three sequences with one token left (decodes) and one 40-token prompt with nothing
    computed, their context in the cache: a step the native path alone cannot take."""
    seqs = [
        Sequence(f"s{i}", [(13 * i + 7 * j) % 900 + 5 for j in range(n)], SamplingParams())
        for i, n in enumerate((20, 33, 12, 40))
    ]
    for seq in seqs[:3]:
        n = len(seq) - 1
        assert engine.kv.allocate(seq, n)
        engine.runner.run(ScheduledBatch([seq], [n]))
        seq.num_computed_tokens = n
    for seq in seqs:
        assert engine.kv.allocate(seq, len(seq))
    return seqs, [seq.num_uncomputed_tokens for seq in seqs]


@needs_kernels
def test_a_mixed_step_runs_its_decodes_natively_and_its_chunk_on_the_float_path(
    make_engine, monkeypatch
):
    """With split_mixed_steps on, a step of decodes and a long prompt's chunk is two
    forwards: its logits are those of the decodes' step alone (the native path) followed by
    the chunk's step alone (the torch path)."""
    monkeypatch.setattr(model_runner, "SPLIT_MIN_ROWS", 3)
    one_thread = {"num_threads": 1, "small_step_threads": 1}  # the same sums either way
    split = make_engine(quantization="hybrid", split_mixed_steps="on", **one_thread)
    paths: list[tuple[int, bool]] = []
    forward = split.runner._forward

    def traced(ids, meta, native):
        paths.append((ids.shape[0], native))
        return forward(ids, meta, native)

    split.runner._forward = traced
    seqs, counts = _mixed_batch(split)
    paths.clear()
    got_seqs, got = split.runner.run(ScheduledBatch(seqs, counts))
    assert paths == [(3, True), (40, False)]
    assert [s.request_id for s in got_seqs] == ["s2", "s0", "s1", "s3"]

    alone = make_engine(quantization="hybrid", split_mixed_steps="off", **one_thread)
    seqs, _ = _mixed_batch(alone)
    decodes = alone.runner.run(ScheduledBatch(seqs[:3], [1, 1, 1]))
    chunk = alone.runner.run(ScheduledBatch(seqs[3:], [40]))
    torch.testing.assert_close(got, torch.cat([decodes[1], chunk[1]]))


@needs_kernels
def test_a_mixed_step_stays_one_forward_when_off_or_below_its_rows(make_engine, monkeypatch):
    monkeypatch.setattr(model_runner, "SPLIT_MIN_ROWS", 4)  # above the batch's 3 decodes
    for mode in ("off", "on"):
        engine = make_engine(quantization="hybrid", split_mixed_steps=mode)
        seqs, counts = _mixed_batch(engine)
        assert engine.runner._split(seqs, counts) is None
    monkeypatch.setattr(model_runner, "SPLIT_MIN_ROWS", 1)
    engine = make_engine(quantization="hybrid", split_mixed_steps="on")
    seqs, counts = _mixed_batch(engine)
    assert engine.runner._split(seqs[:3], counts[:3]) is None  # decodes alone: native already
    parts = engine.runner._split(seqs, counts)
    assert parts is not None and [c for _, c in parts] == [[1, 1, 1], [40]]


@needs_kernels
def test_torch_path_steps_of_one_or_two_streams_take_every_core(make_engine):
    """A prompt's chunk with at most one other stream takes the small steps' threads; a
    step of more streams keeps num_threads (the web side is busy serving them), unless its
    products run in the pool by a product measured to win on every core (ALL_CORES_POOLED:
    the 16-bit prompt products of AVX2 CPUs, AMX's tiles). Where its products run in the
    kernels' pool, torch stays on one thread and the pool gets that count."""
    before = torch.get_num_threads()
    engine = make_engine(quantization="hybrid", num_threads=1, small_step_threads=2)
    runner = engine.runner
    seqs, counts = _mixed_batch(engine)

    def threads_of(rows: int) -> int:
        if runner._pooled(rows):
            assert torch.get_num_threads() == 1
            return kernels.threads()
        return torch.get_num_threads()

    try:
        runner.run(ScheduledBatch(seqs[2:], counts[2:], num_decodes=1))
        assert threads_of(41) == 2
        runner.run(ScheduledBatch(seqs, counts, num_decodes=3))
        assert threads_of(43) == (2 if runner._pooled(43) in model_runner.ALL_CORES_POOLED else 1)
    finally:
        torch.set_num_threads(before)
        kernels.set_threads(None)


@needs_kernels
def test_prompt_rows_take_the_blocks_with_bf16_activations_where_built(make_engine, monkeypatch):
    """Past the 8-bit rows and up to BF16_BLOCK_ROWS, a layer's product takes the 4-bit
    blocks with bf16 activations where the kernels have them (AVX512-BF16) and not the
    16-bit product's AVX512-VNNI tile (made absent here, so every such CPU runs this): the
    weights exact, x rounded to bf16 as torch's bf16 products round it, float32 sums."""
    monkeypatch.setattr(cpu_backend.Backend, "vnni", property(lambda self: False))
    lin = make_engine(quantization="hybrid").runner.model.layers[0].gate_up
    if lin.prompt_product != "bf16" or not lin.prompt_rows:
        pytest.skip("no bf16 prompt products here (no AVX512-BF16, or AMX's tiles)")
    assert lin.prompt_rows == BF16_BLOCK_ROWS and lin.prompt_product == "bf16"
    w = lin.blocks.dequantize().double()  # type: ignore[union-attr]
    for rows in (9, 21, BF16_BLOCK_ROWS):
        x = torch.randn(rows, w.shape[1])
        want = (x.bfloat16().double() @ w.T).float()
        assert _rel_err(lin(x), want) < 1e-5
    x = torch.randn(BF16_BLOCK_ROWS + 1, w.shape[1])  # beyond: the float weights
    assert lin.weight is not None
    torch.testing.assert_close(
        lin(x), torch.nn.functional.linear(x.to(lin.weight.dtype), lin.weight).float()
    )


@needs_kernels
def test_prompt_rows_take_the_blocks_on_amx_tiles_where_they_run(make_engine):
    """With AMX, every torch-path step's product takes the 4-bit blocks on the tiles:
    weights unpacked to bf16 (rounded to nearest), x in bf16, float32 sums. A product whose
    outputs are not whole chunks of 32 keeps the float weights."""
    layer = make_engine(quantization="hybrid").runner.model.layers[0]
    lin = layer.gate_up
    if lin.prompt_product != "amx":
        assert not kernels.amx_available()
        pytest.skip("no AMX tiles for the kernels here")
    assert lin.prompt_rows == AMX_BLOCK_ROWS and lin.out_features % AMX_COLUMNS == 0
    w = lin.blocks.dequantize()  # type: ignore[union-attr]
    for rows in (9, 17, 40, 300):  # past the 8-bit rows (block_rows)
        x = torch.randn(rows, w.shape[1])
        want = (x.bfloat16().double() @ w.bfloat16().double().T).float()
        # the unpacking's fused d * q + m can round a weight to the other bf16 neighbour
        assert _rel_err(lin(x), want) < 1e-4
    for other in (layer.qkv, layer.o, layer.down):
        assert other.prompt_rows == (AMX_BLOCK_ROWS if other.out_features % AMX_COLUMNS == 0 else 0)


@pytest.fixture(params=["this CPU", "as on AVX2"])
def large_steps(request, monkeypatch) -> str:
    """This CPU as it is, and as one whose large steps are fp16 (AVX2, no bf16 products):
    the 16-bit products build on every CPU with the kernels (their AVX512-VNNI tile where
    the kernels are built for it)."""
    if request.param == "as on AVX2":
        monkeypatch.setattr(cpu_backend, "cpu_has_native_bf16", lambda: False)
        monkeypatch.setattr(kernels, "cpu_has_native_bf16", lambda: False)
    return request.param


@needs_kernels
def test_prompt_rows_take_the_16bit_blocks_where_large_steps_are_fp16(make_engine, large_steps):
    """Where large steps are fp16 (no bf16 products: AVX2), or bf16 without AMX where the
    16-bit product has its AVX512-VNNI tile, every torch-path step's product past the 8-bit
    rows takes the 4-bit blocks with x at 16 bits a block: the float product of the GGUF's
    weights to ~1e-4, not of fp16 / bf16 copies."""
    lin = make_engine(quantization="hybrid").runner.model.layers[0].gate_up
    if lin.prompt_product != "i16":
        assert kernels.cpu_has_native_bf16()
        assert kernels.cpu_has_amx() or not kernels.i16_vnni_available()
        pytest.skip("large steps here are bf16 on AMX, or without the 16-bit VNNI tile")
    assert lin.prompt_rows == I16_BLOCK_ROWS
    w = lin.blocks.dequantize().double()  # type: ignore[union-attr]
    for rows in (9, 17, 40, 300):  # past the 8-bit rows (block_rows)
        x = torch.randn(rows, w.shape[1])
        assert _rel_err(lin(x), (x.double() @ w.T).float()) < 1e-4


@needs_kernels
def test_products_the_blocks_take_at_every_size_hold_no_float_copy(make_engine, large_steps):
    """Where the torch path's steps take a layer's 4-bit blocks at any number of rows (the
    16-bit products, AMX's tiles), the layer holds no fp16 / bf16 copy: it would
    never be multiplied. The head keeps its float copy for steps past its blocks' rows."""
    engine = make_engine(quantization="hybrid")
    model = engine.runner.model
    layers = [(lay.qkv, lay.o, lay.gate_up, lay.down) for lay in model.layers]
    every_row = [
        blocks_take_every_row(x.blocks, x.prompt_rows, x.prompt_product) for x in layers[0]
    ]
    if layers[0][0].prompt_product == "i16":
        assert all(every_row)  # the 16-bit product has no constraint on the columns
    for lins in layers:
        for lin, blocks_only in zip(lins, every_row, strict=True):
            if blocks_only:
                assert lin.weight is None and lin.packed is None and lin.kind == "blocks"
                assert lin.block_rows <= HYBRID_MAX_ROWS  # past them: the 16-bit / tile product
            else:
                assert lin.weight is not None or lin.packed is not None
    assert model.lm_head.weight is not None or model.lm_head.packed is not None
    # and a prompt past the native rows still runs, on the blocks alone
    engine.add_request(list(range(1, 80)), SamplingParams(max_tokens=4, temperature=0.0), "r")
    assert len(token_ids_of(run_to_completion(engine)["r"])) == 4


def test_split_mixed_steps_takes_auto_on_or_off():
    assert model_runner.split_mixed("on") and not model_runner.split_mixed("off")
    assert model_runner.split_mixed("auto") == (not kernels.cpu_has_amx())
    with pytest.raises(ValueError, match="split_mixed_steps must be one of auto, on, off"):
        model_runner.split_mixed("yes")


def _q8_layer_products_agree(n: int) -> None:
    """A Q8_0 layer (a GGUF's layers of more than 4 bits) serves every step from its blocks
    alone, x at 16 bits a block against the weights' integers: q8_0_gemm's grouped tiles
    for a few rows, its 16-bit panels from the head's panel rows, never AMX's bf16 tiles
    (q8_0_layers_gemm.c). Within 2e-4 of dequantize(blocks) @ x at every size, with an
    input 30x the rest: far within the 8-bit activations' percent (the head's kind, on the
    tiles where they run, is ~2.5e-3 off)."""
    q = Q8_0.quantize(_weight(n, 256))
    lin = Linear(None, "none", q, HYBRID_MAX_ROWS, q8_kind="i16")
    assert lin.kind == "blocks" and lin.block_rows > 1 << 30 and lin.prompt_rows == 0
    w = q.dequantize().double()
    for rows in (1, 3, 4, 8, 9, 23, 24, 64, 130):
        x = torch.randn(rows, 256)
        x[:, 7] *= 30
        err = _rel_err(lin(x), (x.double() @ w.T).float())
        assert err < 2e-4, (n, rows, err)


@needs_kernels
@pytest.mark.parametrize("n", [70, 96])
def test_q8_0_layers_products_match_the_dequantized_blocks_at_every_size(n):
    _q8_layer_products_agree(n)
    assert blocks_take_every_row(Q8_0.quantize(_weight(n, 256)), 0, "int8")


@needs_kernels
def test_q8_0_layers_products_in_the_avx2_build():
    code = (
        "from tests.engine.test_quantized import _q8_layer_products_agree\n"
        "for n in (70, 96):\n"
        "    _q8_layer_products_agree(n)\n"
        "print('agreed')\n"
    )
    run_in_avx2_build(code)


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 9, 17, 24])
@pytest.mark.parametrize("n", [72, 200, 1000])
def test_two_column_groups_a_tile_give_the_same_bits(rows, n):
    """The grouped tiles' 512-bit form (two column groups a tile, q4_pair_tile) makes each
    column's sums with the same operations in the same order as one group a tile: Q4_1's,
    Q4_K's and Q5_K's products are equal to the bit, whatever the rows (whole and partial
    tiles) and columns (an odd group at a chunk's end, a zero-padded one)."""
    if not kernels.backend().vnni:
        pytest.skip("this build has no 512-bit tiles (AVX512-VNNI)")
    lib = kernels.load()
    assert lib is not None
    x = torch.randn(rows, 512)
    x[:, 7] *= 30
    g = torch.Generator().manual_seed(n)
    formats = [
        Q4_1.quantize(_weight(n, 512)).for_kernel(),
        random_q4_k(n, 512, g).for_kernel(),
        random_q5_k(n, 512, g).for_kernel(),
    ]
    for w in formats:
        with _panel_rows(0, 0):
            try:
                lib.set_pair_min_rows(0, 0)
                one = w.matmul_t(x)
                lib.set_pair_min_rows(1, 1)
                two = w.matmul_t(x)
            finally:
                lib.set_pair_min_rows(*cpu_backend.pair_min_rows())
        assert torch.equal(one, two), type(w).__name__
