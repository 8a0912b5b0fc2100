"""The KV pool and the weights' arena on huge pages (inference/engine/huge_pages.py): really
on them, where the kernel offers them, and the same values either way."""

from __future__ import annotations

import dataclasses
import mmap
import re
from pathlib import Path

import pytest
import torch

from inference.engine import huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _huge_kb(t: torch.Tensor) -> int:
    """AnonHugePages of the mappings that hold t (this process's smaps: the advice splits
    a mapping at the huge pages' boundaries)."""
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    inside, kb = False, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            inside = int(m[1], 16) < end and start < int(m[2], 16)
        elif inside and line.startswith("AnonHugePages:"):
            kb += int(line.split()[1])
    return kb


@pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages here"
)
def test_a_pool_is_on_huge_pages():
    t = huge_pages.zeros((16, 1024, 1024), torch.float16, torch.device("cpu"))  # 32 MB
    assert torch.count_nonzero(t) == 0
    # All but the partial pages at its two ends (the kernel may lack a few under pressure).
    assert _huge_kb(t) >= 24 * 1024
    if "[madvise]" in THP.read_text():
        # Only where huge pages are given on advice does a plain buffer go without them
        # ("always" gives every large mapping huge pages, advised or not). The plain buffer is
        # a fresh mapping: torch.zeros may reuse malloc's heap where an earlier tensor was
        # advised, and the advice outlives that tensor.
        with mmap.mmap(-1, 32 << 20) as raw:
            plain = torch.frombuffer(raw, dtype=torch.float16)
            plain.fill_(0)
            assert _huge_kb(plain) < _huge_kb(t)
            del plain


def test_small_and_non_cpu_buffers_are_left_alone():
    small = huge_pages.zeros((4, 16), torch.float32, torch.device("cpu"))
    assert small.shape == (4, 16) and torch.count_nonzero(small) == 0
    assert not huge_pages.advise(small)
    assert not huge_pages.advise(torch.empty(0))


def test_the_arena_copies_tensors_side_by_side_and_settles_a_dataclass():
    arena = huge_pages.Arena(torch.device("cpu"))
    a = torch.arange(10, dtype=torch.float16)
    b = torch.arange(7, dtype=torch.uint8)
    ta, tb = arena.take(a), arena.take(b)
    assert torch.equal(ta, a) and torch.equal(tb, b) and ta.dtype == a.dtype
    if not arena.on:
        return  # no madvise here: the tensors stay where they were
    # Compared apart: a failing assert's report would print the slab's 64 MB storage.
    same = ta.untyped_storage().data_ptr() == tb.untyped_storage().data_ptr()
    assert same
    assert ta.data_ptr() % huge_pages.HUGE_PAGE == 0  # a slab starts on a huge page
    assert tb.data_ptr() - ta.data_ptr() == huge_pages.ALIGN
    # A tensor larger than a slab gets a slab of its own.
    big = torch.ones(huge_pages.SLAB_BYTES + 1, dtype=torch.uint8)
    assert torch.equal(arena.take(big), big)
    # Non-contiguous tensors are left as they are (the kernels take contiguous blocks).
    t = torch.ones(4, 4).t()
    assert arena.take(t) is t

    @dataclasses.dataclass
    class Blocks:
        qs: torch.Tensor
        n: int

    held = Blocks(torch.arange(64, dtype=torch.uint8).reshape(8, 8), 8)
    before = held.qs.data_ptr()
    arena.settle(held)
    assert held.n == 8 and torch.equal(held.qs, torch.arange(64, dtype=torch.uint8).reshape(8, 8))
    moved = held.qs.data_ptr()
    assert moved != before and held.qs.untyped_storage().nbytes() >= huge_pages.SLAB_BYTES


def test_a_tensor_made_on_huge_pages_stays_where_it_was_made():
    """huge_pages.empty's tensors (a GGUF's embedding, converted straight into one) and the
    views of them are not copied into the arena: a load holds them once."""
    arena = huge_pages.Arena(torch.device("cpu"))
    made = huge_pages.empty((huge_pages.MIN_BYTES // 2, 2), torch.int8)
    assert made.shape == (huge_pages.MIN_BYTES // 2, 2) and made.dtype == torch.int8
    rows = made[8:16]
    if not arena.on:
        return  # no madvise here: an ordinary tensor
    assert made.data_ptr() % huge_pages.HUGE_PAGE == 0 and huge_pages.placed(rows)
    assert arena.take(made) is made and arena.take(rows) is rows
    # A small one is an ordinary tensor, copied as any other.
    small = huge_pages.empty((16,), torch.float16)
    assert not huge_pages.placed(small) and arena.take(small) is not small


def test_a_loaded_models_blocks_share_the_arena(tiny_model_dir: Path):
    """Every block matrix of a model lies in the load's arena, on huge pages where given."""
    from inference.engine.models import load_model

    model = load_model(str(tiny_model_dir), quantization="int4", dtype=torch.float32)
    linears = [model.lm_head] + [
        p for layer in model.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)
    ]
    blocks = [getattr(x, "blocks", None) for x in linears]
    tensors = [b.qs for b in blocks if b is not None]
    assert tensors
    if not huge_pages.Arena(torch.device("cpu")).on:
        return
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    assert len(storages) == 1, len(storages)  # the tiny model's blocks fit one slab
    if THP.exists() and "[never]" not in THP.read_text():
        assert _huge_kb(tensors[0]) >= 2048
