"""The benchmarks' statistics: a figure over repeated runs as every benchmark reports it,
the median with its min and max (these machines are noisy: a ratio is read against its
spread), and the percentile of one run's samples."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence


def spread(values: Sequence[float]) -> dict[str, float]:
    """{"median", "min", "max"} of at least one value."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank, a tie rounded up; nan for none."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def cell(s: Mapping[str, float] | None, digits: int = 1) -> str:
    """A table cell, "median (min-max)"; "-" where the figure is missing."""
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"
