"""Tensor parallelism: the model split across ranks says exactly what the whole model says.

The tiny model (4 heads, 2 KV heads, MLP width 128) splits across 2 ranks; the default model
(9 heads, 3 KV heads) across 3. Ranks are real processes talking over gloo.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine
from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence
from inference.engine.tensor_parallel import ShardSpec, TensorParallelModel
from tests.engine.conftest import greedy, run_to_completion, token_ids_of


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


def _generate(engine: LLMEngine, max_tokens: int = 16) -> dict[str, list[int]]:
    """Three short prompts decode together; a long one arrives later and prefills in chunks
    of at most 16 tokens, in the same steps as the others' decodes."""
    steps: list[list[int]] = []  # tokens per sequence, per step
    run = engine.runner.run

    def recording_run(batch: ScheduledBatch, *args: object) -> object:
        steps.append(list(batch.num_tokens))
        return run(batch, *args)

    engine.runner.run = recording_run  # type: ignore[method-assign]
    try:
        for i, n in enumerate((5, 12, 20)):
            engine.add_request(
                _prompt(n, seed=i), greedy(max_tokens, ignore_eos=True), request_id=f"r{i}"
            )
        deltas = _steps(engine, 3)
        long = _prompt(90, seed=9)
        engine.add_request(long, greedy(max_tokens, ignore_eos=True), request_id="long")
        for rid, d in run_to_completion(engine).items():
            deltas.setdefault(rid, []).extend(d)
    finally:
        del engine.runner.run
    assert any(1 in n and 1 < max(n) <= 16 for n in steps)  # a chunk beside decodes
    return {rid: token_ids_of(d) for rid, d in sorted(deltas.items())}


def _steps(engine: LLMEngine, n: int) -> dict[str, list]:
    out: dict[str, list] = {}
    for _ in range(n):
        for delta in engine.step():
            out.setdefault(delta.request_id, []).append(delta)
    return out


SETTINGS = {"max_num_batched_tokens": 32, "max_prefill_tokens_during_decode": 16}


@pytest.fixture(scope="module")
def one_and_two_ranks(tiny_model_path: Path) -> Iterator[tuple[LLMEngine, LLMEngine]]:
    def make(size: int) -> LLMEngine:
        return LLMEngine(
            EngineConfig(
                model=str(tiny_model_path),
                dtype="float32",
                quantization="none",
                kv_cache_memory_mb=8,
                tensor_parallel_size=size,
                **SETTINGS,  # type: ignore[arg-type]
            )
        )

    one, two = make(1), make(2)
    try:
        yield one, two
    finally:
        two.runner.model.close()


def test_two_ranks_generate_the_same_greedy_tokens_as_one(one_and_two_ranks):
    one, two = one_and_two_ranks
    expected = _generate(one)
    assert set(expected) == {"r0", "r1", "r2", "long"}
    assert all(len(ids) == 16 for ids in expected.values())
    assert _generate(two) == expected


def _logits_at_every_position(engine: LLMEngine) -> torch.Tensor:
    seq = Sequence("x", _prompt(40, seed=5), SamplingParams())
    rows = []
    for n in (16, 16, 7, 1):  # chunked prefill through the paged cache, then a decode
        assert engine.kv.allocate(seq, seq.num_computed_tokens + n)
        rows.append(engine.runner.run(ScheduledBatch([seq], [n]), all_logits=True)[1])
        seq.num_computed_tokens += n
    engine.kv.free(seq)
    return torch.cat(rows)


def test_two_ranks_give_the_same_logits_as_one_at_every_position(one_and_two_ranks, monkeypatch):
    # The ranks run the work between products as torch ops (row_ops.py); the one rank
    # takes the same here, not its kernels' pool, so that only the order of the products'
    # sums differs.
    monkeypatch.setattr(one_and_two_ranks[0].runner.model, "pool_ops", None)
    one, two = (_logits_at_every_position(e) for e in one_and_two_ranks)
    torch.testing.assert_close(two, one, atol=1e-5, rtol=1e-5)


def test_each_rank_holds_half_the_heads_and_half_the_kv_pool(one_and_two_ranks):
    one, two = one_and_two_ranks
    assert (two.runner.model.num_heads, two.runner.model.num_kv_heads) == (2, 1)
    assert two.runner.kv_caches[0].shape[0] == one.runner.kv_caches[0].shape[0] // 2
    # The pool budget is per rank, so each rank's half-width shard holds twice the blocks.
    assert two.runner.num_blocks == 2 * one.runner.num_blocks


def test_step_figures_count_two_all_reduces_per_layer(one_and_two_ranks):
    _, two = one_and_two_ranks
    model = two.runner.model
    model.reset_tp_stats()
    two.add_request(_prompt(8, seed=3), greedy(4, ignore_eos=True), request_id="figures")
    run_to_completion(two)
    stats = model.tp_stats()
    assert stats["steps"] == 4
    assert stats["allreduces"] == 2 * model.num_layers * stats["steps"]
    assert 0 < stats["allreduce_seconds"] < stats["forward_seconds"]


def test_a_size_that_does_not_split_the_heads_is_refused_with_the_sizes_that_fit(make_engine):
    children = set(multiprocessing.active_children())
    with pytest.raises(ValueError) as err:
        make_engine(tensor_parallel_size=3)
    message = str(err.value)
    assert "tensor_parallel_size=3" in message
    assert "4 attention heads, 2 KV heads" in message
    assert message.endswith("sizes that fit: 1, 2")
    assert set(multiprocessing.active_children()) == children  # nothing was started


def _spec(folder: Path) -> ShardSpec:
    return ShardSpec(str(folder), torch.float32, "cpu", "none", None, cpu_threads=1)


# One tensor-parallel model per process at a time (it owns the default process group), so
# this test closes the module's model and must stay the last one to use it.
def test_rank_processes_are_gone_after_close(one_and_two_ranks):
    model = one_and_two_ranks[1].runner.model
    (worker,) = model.workers
    assert worker.is_alive()
    model.close()
    assert not worker.is_alive()
    assert worker.exitcode == 0  # it stopped when told, it was not killed
    model.close()  # twice is harmless


def _hold_a_model(folder: str, pids: multiprocessing.Queue) -> None:
    model = TensorParallelModel(_spec(Path(folder)), 2)
    pids.put([p.pid for p in model.workers])
    time.sleep(600)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_rank_processes_exit_when_the_engine_process_is_killed(tiny_model_path):
    ctx = multiprocessing.get_context("spawn")
    pids: multiprocessing.Queue = ctx.Queue()
    engine_process = ctx.Process(target=_hold_a_model, args=(str(tiny_model_path), pids))
    engine_process.start()
    try:
        (rank_pid,) = pids.get(timeout=120)
        assert _alive(rank_pid)
    finally:
        engine_process.kill()  # no close(), no atexit: the hard way
        engine_process.join()
    deadline = time.monotonic() + 30
    while _alive(rank_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(rank_pid)


@pytest.mark.slow
def test_default_model_on_three_ranks_says_what_it_says_on_one(real_model_dir):
    prompts = [
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    ]
    outputs = []
    for size in (1, 3):
        engine = LLMEngine(
            EngineConfig(
                model=str(real_model_dir),
                dtype="float32",
                quantization="none",
                kv_cache_memory_mb=64,
                tensor_parallel_size=size,
            )
        )
        try:
            for i, text in enumerate(prompts):
                ids = engine.tokenizer.encode(text)
                engine.add_request(ids, greedy(24), request_id=f"p{i}")
            out = run_to_completion(engine)
            outputs.append({rid: token_ids_of(d) for rid, d in out.items()})
        finally:
            if size > 1:
                engine.runner.model.close()
    assert outputs[1] == outputs[0]
    assert all(len(ids) > 4 for ids in outputs[0].values())
