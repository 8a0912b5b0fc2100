"""python -m inference.bench.chunk_attention: every tile kind this CPU runs, timed on the
same case, the first kind's ratio 1."""

from __future__ import annotations

import pytest

from inference.bench.chunk_attention import kinds, run
from inference.engine import kernels


def test_the_benchmark_times_each_tile_kind_this_cpu_runs():
    lib = kernels.load()
    if lib is None:
        pytest.skip("the native kernels are not built here")
    out = run(rows=[5], cached=[20], head_dim=64, threads=1, repeat=1)
    (case,) = out["cases"]
    assert list(case["variants"]) == list(kinds())
    assert "float32" in case["variants"] and case["variants"]["float32"]["ratio"] == 1.0
    assert all(v["median"] > 0 for v in case["variants"].values())
    assert ("amx" in case["variants"]) == kernels.amx_available()
