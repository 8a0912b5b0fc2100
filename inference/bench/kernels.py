"""The native kernels alone: a decode step's 4-bit products and its 8-bit head, by rows and threads.

    python -m inference.bench.kernels --rows 1 2 4 8 --threads 1 2

The default model's shapes (30 layers of q/k/v 960x576, o 576x576, gate/up 3072x576, down
576x1536 in Q4_1, the head 49152x576 in Q8_0) with random weights in the kernels' layout:
ms per step's worth of products and the rate the weights are read at (GB/s; at one row
the products are bound by it: compare with what one core streams). Variants run
interleaved, `--repeat` times; medians (min-max). Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from inference.engine import kernels
from inference.engine.quantized import Q4_1, Q8_0

LAYERS = 30
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
HEAD = (49152, 576)


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def run(rows: list[int], threads: list[int], repeat: int) -> dict[str, Any]:
    lib = kernels.load()
    if lib is None:
        raise SystemExit("the native kernels do not build here (gcc, AVX2/FMA/F16C)")
    gen = torch.Generator().manual_seed(0)
    layers = [
        Q4_1.quantize(torch.randn(n, k, generator=gen) * 0.05).for_kernel()
        for _ in range(LAYERS)
        for n, k in SHAPES
    ]
    head = Q8_0.quantize(torch.randn(*HEAD, generator=gen) * 0.05).for_kernel()
    layer_bytes = sum(_nbytes(m.qs, m.d, m.m) for m in layers)
    head_bytes = _nbytes(head.qs, head.d)
    torch.set_num_threads(1)

    def layers_once(r: int) -> float:
        xs = {k: torch.randn(r, k) for _, k in SHAPES}
        start = time.perf_counter()
        for m in layers:
            kernels.q4_1_gemm(lib, m.qs, m.d, m.m, xs[m.shape[1]], m.n)
        return time.perf_counter() - start

    def head_once(r: int) -> float:
        x = torch.randn(r, HEAD[1])
        start = time.perf_counter()
        kernels.q8_0_gemm(lib, head.qs, head.d, x, head.n)
        return time.perf_counter() - start

    cases = [(t, r) for t in threads for r in rows]
    times: dict[tuple[int, int], dict[str, list[float]]] = {
        c: {"layers": [], "head": []} for c in cases
    }
    try:
        for rep in range(repeat):
            for t, r in cases if rep % 2 == 0 else cases[::-1]:
                kernels.set_threads(t)
                times[(t, r)]["layers"].append(layers_once(r))
                times[(t, r)]["head"].append(head_once(r))
    finally:
        kernels.set_threads(None)
    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg()[0],
        "layer_mb": layer_bytes / 1e6,
        "head_mb": head_bytes / 1e6,
        "rows": [],
    }
    for (t, r), v in times.items():
        row: dict[str, Any] = {"threads": t, "rows": r}
        for part, nbytes in (("layers", layer_bytes), ("head", head_bytes)):
            ms = [x * 1e3 for x in v[part]]
            med = statistics.median(ms)
            row[part] = {"median_ms": med, "min_ms": min(ms), "max_ms": max(ms)}
            row[part]["gb_s"] = nbytes / med / 1e6
        out["rows"].append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m inference.bench.kernels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--json", default="bench_kernels.json")
    args = ap.parse_args()
    r = run(args.rows, args.threads, args.repeat)
    print(
        f"{r['cpus']} CPUs, load (1 min) {r['load_before']:.2f}; layers {r['layer_mb']:.1f} MB, "
        f"head {r['head_mb']:.1f} MB; ms per step's worth, median (min-max), GB/s at the median"
    )
    print("| threads | rows | 30 layers' products | GB/s | head | GB/s |\n|" + "---|" * 6)
    for row in r["rows"]:
        cells = []
        for part in ("layers", "head"):
            v = row[part]
            cells.append(
                f"{v['median_ms']:.2f} ({v['min_ms']:.2f}-{v['max_ms']:.2f}) | {v['gb_s']:.1f}"
            )
        print(f"| {row['threads']} | {row['rows']} | {' | '.join(cells)} |")
    Path(args.json).write_text(json.dumps(r, indent=2))
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
