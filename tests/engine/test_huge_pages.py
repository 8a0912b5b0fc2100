"""The KV pool on huge pages (inference/engine/huge_pages.py): really on them, where the
kernel offers them, and zeroed either way."""

from __future__ import annotations

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
        # ("always" gives every large mapping huge pages, advised or not).
        plain = torch.zeros((16, 1024, 1024), dtype=torch.float16)
        assert _huge_kb(plain) < _huge_kb(t)


def test_small_and_non_cpu_buffers_are_left_alone():
    small = huge_pages.zeros((4, 16), torch.float32, torch.device("cpu"))
    assert small.shape == (4, 16) and torch.count_nonzero(small) == 0
    assert not huge_pages.advise(small)
    assert not huge_pages.advise(torch.empty(0))
