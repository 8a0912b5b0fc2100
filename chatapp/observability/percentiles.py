"""Percentiles, exact over a list or approximate over a log-bucket histogram.

Histograms are sparse dicts {bucket index: count} over fixed bounds, so any number of
them merge by adding counts (a minute's requests, an hour's minutes).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

# Upper bounds in seconds: 0.5 ms ... ~600 s, each 15% above the last (~5% error at most
# after interpolation inside a bucket).
GROWTH = 1.15
BOUNDS: list[float] = [0.0005 * GROWTH**i for i in range(101)]


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def bucket_of(value: float) -> int:
    return min(bisect.bisect_left(BOUNDS, value), len(BOUNDS) - 1)


def histogram(values: Iterable[float]) -> dict[str, int]:
    hist: dict[str, int] = {}
    for v in values:
        k = str(bucket_of(v))
        hist[k] = hist.get(k, 0) + 1
    return hist


def merge(hists: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for h in hists:
        for k, n in h.items():
            out[k] = out.get(k, 0) + int(n)
    return out


def hist_percentile(hist: dict[str, int], q: float) -> float | None:
    """The q-th percentile, interpolated geometrically inside its bucket."""
    total = sum(hist.values())
    if not total:
        return None
    rank = q / 100 * total
    seen = 0
    for k in sorted(hist, key=int):
        n = hist[k]
        if seen + n >= rank:
            i = int(k)
            hi = BOUNDS[i]
            lo = BOUNDS[i - 1] if i > 0 else hi / GROWTH
            frac = (rank - seen) / n if n else 1.0
            return lo * (hi / lo) ** frac
        seen += n
    return BOUNDS[int(max(hist, key=int))]
