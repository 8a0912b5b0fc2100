"""The native kernels alone: a step's 4-bit products and its 8-bit head, by rows and threads.

    python -m inference.bench.kernels --rows 1 2 4 8 --threads 1 2
    python -m inference.bench.kernels --rows 8 16 32 64 128 256 --kinds int8 bf16 amx onednn
    python -m inference.bench.kernels --rows 8 16 32 64 128 256 --kinds int8 i16 fbgemm

The default model's shapes (30 layers of q/k/v 960x576, o 576x576, gate/up 3072x576, down
576x1536 in Q4_1, the head 49152x576 in Q8_0; `--shapes llama-1b`: a Llama-3.2-1B-shaped
Q4_K_M file's Q4_K layers and Q6_K head) with random weights in the kernels' layout:
ms per step's worth of products and the rate the weights are read at (GB/s; at one row the
products are bound by it: compare with what one core streams). The layers' products by
`--kinds`: int8 (8-bit activations, the native path's grouped kernel alone), panel (the
same activations on panel_gemm.c's tiles at every row count: 512-bit ones where built for
AVX512-VNNI, else AVX2's), bf16
(bf16 activations, exact weights; AVX512-BF16), amx (both rounded to bf16, on AMX tiles),
i16 (x at 16 bits a block against the weights' integers, vpmaddwd; AVX2), onednn (torch's
bf16 F.linear on bf16 copies of the weights, at the same thread count), fbgemm (torch's
fp16-weight products, the large steps' format on CPUs without bf16, likewise); the head's
by the same kinds (int8: its 16-bit activations' kernel; panel: the same on the panels'
tile; no bf16 or i16 one). Variants run interleaved, `--repeat` times; medians (min-max).
Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from inference.engine import cpu_backend, kernels
from inference.engine.kernel_check import random_q4_k, random_q6_k
from inference.engine.quantized import Q4_1, Q8_0

LAYERS = 30
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
HEAD = (49152, 576)
# --shapes llama-1b: a Llama-3.2-1B-shaped model's layers in Q4_K (a Q4_K_M file's most
# bytes; 16 layers of q/k/v 3072x2048, o 2048x2048, gate/up 16384x2048, down 2048x8192) and
# its head 49152x2048 in Q6_K, as a Q4_K_M file holds it.
LLAMA_1B = (16, ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)), (49152, 2048))


@contextmanager
def _row_limits(
    lib: Any,
    amx: tuple[int, int],
    panel: tuple[int, int],
    pairs: tuple[int, int] = cpu_backend.pair_min_rows(),
) -> Iterator[None]:
    """The products' AMX and 512-bit tile row limits, (layers, head) each, and the grouped
    tiles' two-group rows, set for a measurement (0: never), then put back as the kernels
    set them at load."""
    lib.set_amx_min_rows(*amx)
    lib.set_panel_min_rows(*panel)
    lib.set_pair_min_rows(*pairs)
    try:
        yield
    finally:
        if kernels.amx_available():
            lib.set_amx_min_rows(*kernels.amx_min_rows())
        lib.set_panel_min_rows(*kernels.default_panel_min_rows())
        lib.set_pair_min_rows(*cpu_backend.pair_min_rows())


def head_kinds(kinds: list[str]) -> list[str]:
    """The kinds that have a head product of their own."""
    return [k for k in kinds if k not in ("bf16", "i16", "int8-single")]


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def run(
    rows: list[int], threads: list[int], repeat: int, kinds: list[str], shapes: str = "smollm2"
) -> dict[str, Any]:
    lib = kernels.load()
    if lib is None:
        raise SystemExit("the native kernels do not build here (gcc, AVX2/FMA/F16C)")
    if "bf16" in kinds and not kernels.bf16_gemm_available():
        raise SystemExit("kind bf16 needs AVX512-BF16")
    if "amx" in kinds and not kernels.amx_available():
        raise SystemExit("kind amx needs AMX (and the kernels built with it)")
    gen = torch.Generator().manual_seed(0)
    n_layers, layer_shapes, head_shape = (LAYERS, SHAPES, HEAD)
    if shapes == "llama-1b":
        n_layers, layer_shapes, head_shape = LLAMA_1B
        layers: list[Any] = [
            random_q4_k(n, k, gen).for_kernel() for _ in range(n_layers) for n, k in layer_shapes
        ]
    else:
        layers = [
            Q4_1.quantize(torch.randn(n, k, generator=gen) * 0.05).for_kernel()
            for _ in range(n_layers)
            for n, k in layer_shapes
        ]
    head: Q8_0
    if shapes == "llama-1b":
        head = random_q6_k(*head_shape, gen).for_kernel()
    else:
        head = Q8_0.quantize(torch.randn(*head_shape, generator=gen) * 0.05).for_kernel()
    dense, head_dense = [], torch.empty(0)
    if "onednn" in kinds:
        dense = [
            torch.randn(n, k, generator=gen).bfloat16()
            for _ in range(n_layers)
            for n, k in layer_shapes
        ]
        head_dense = torch.randn(*head_shape, generator=gen).bfloat16()
    packed: list[Any] = []
    packed_head: Any = None
    if "fbgemm" in kinds:
        prepack = torch.ops.quantized.linear_prepack_fp16
        packed = [
            prepack(torch.randn(n, k, generator=gen), None)
            for _ in range(n_layers)
            for n, k in layer_shapes
        ]
        packed_head = prepack(torch.randn(*head_shape, generator=gen), None)
    layer_bytes = sum(
        _nbytes(m.qs, m.d, m.m, *(p for p in m.k_parts() if p is not None)) for m in layers
    )
    head_bytes = _nbytes(head.qs, head.d, *(p for p in [head.k_parts()] if p is not None))
    torch.set_num_threads(1)

    def onednn_once(products: list[tuple[torch.Tensor, torch.Tensor]], t: int) -> float:
        """torch's bf16 F.linear over (x, w) pairs on t threads (one outside the timing)."""
        torch.set_num_threads(t)
        try:
            start = time.perf_counter()
            for x, w in products:
                F.linear(x, w)
            return time.perf_counter() - start
        finally:
            torch.set_num_threads(1)

    def fbgemm_once(products: list[tuple[torch.Tensor, Any]], t: int) -> float:
        """torch's fp16-weight products over (x, packed w) pairs on t threads."""
        torch.set_num_threads(t)
        try:
            start = time.perf_counter()
            for x, w in products:
                torch.ops.quantized.linear_dynamic_fp16(x, w)
            return time.perf_counter() - start
        finally:
            torch.set_num_threads(1)

    def layers_once(r: int, kind: str, t: int) -> float:
        xs = {k: torch.randn(r, k) for _, k in layer_shapes}
        if kind == "onednn":
            xb = {k: v.bfloat16() for k, v in xs.items()}
            return onednn_once([(xb[w.shape[1]], w) for w in dense], t)
        if kind == "fbgemm":
            pairs = zip(packed, layer_shapes * n_layers, strict=True)
            return fbgemm_once([(xs[k], w) for w, (_, k) in pairs], t)
        # int8 alone: the native path's product moves to AMX's tiles from AMX_MIN_ROWS rows;
        # int8-single: one column group a tile at every row count (no q4_pair_tile).
        panel = (1, 1) if kind == "panel" else (0, 0)
        pair_rows = (0, 0) if kind == "int8-single" else cpu_backend.pair_min_rows()
        with _row_limits(lib, (0, 0), panel, pair_rows):
            start = time.perf_counter()
            for m in layers:
                sc, mn, qh = m.k_parts()
                kernels.q4_1_gemm(lib, m.qs, m.d, m.m, xs[m.shape[1]], m.n,
                                  "int8" if kind in ("panel", "int8-single") else kind,
                                  sc, mn, qh)  # fmt: skip
            return time.perf_counter() - start

    def head_once(r: int, kind: str, t: int) -> float:
        x = torch.randn(r, head_shape[1])
        if kind == "onednn":
            return onednn_once([(x.bfloat16(), head_dense)], t)
        if kind == "fbgemm":
            return fbgemm_once([(x, packed_head)], t)
        # int8: the 16-bit activations' kernel alone; amx: the tiles at any rows.
        amx = (0, 1 if kind == "amx" else 0)
        with _row_limits(lib, amx, (1, 1) if kind == "panel" else (0, 0)):
            start = time.perf_counter()
            kernels.q8_0_gemm(lib, head.qs, head.d, x, head.n, None, head.k_parts())
            return time.perf_counter() - start

    cases = [(t, r) for t in threads for r in rows]
    heads = head_kinds(kinds)
    parts = [f"layers:{k}" for k in kinds] + [f"head:{k}" for k in heads]
    times: dict[tuple[int, int], dict[str, list[float]]] = {
        c: {p: [] for p in parts} for c in cases
    }
    try:
        for rep in range(repeat):
            for t, r in cases if rep % 2 == 0 else cases[::-1]:
                kernels.set_threads(t)
                for kind in kinds if rep % 2 == 0 else kinds[::-1]:
                    times[(t, r)][f"layers:{kind}"].append(layers_once(r, kind, t))
                for kind in heads:
                    times[(t, r)][f"head:{kind}"].append(head_once(r, kind, t))
    finally:
        kernels.set_threads(None)
    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg()[0],
        "shapes": shapes,
        "layers": n_layers,
        "layer_mb": layer_bytes / 1e6,
        "head_mb": head_bytes / 1e6,
        "kinds": kinds,
        "rows": [],
    }
    for (t, r), v in times.items():
        row: dict[str, Any] = {"threads": t, "rows": r}
        for part in parts:
            nbytes = head_bytes if part.startswith("head") else layer_bytes
            if part == "layers:onednn":
                nbytes = sum(w.numel() * 2 for w in dense)
            if part == "layers:fbgemm":
                nbytes = sum(n * k * 2 for n, k in layer_shapes) * n_layers
            if part == "head:onednn" or part == "head:fbgemm":
                nbytes = head_shape[0] * head_shape[1] * 2
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
    ap.add_argument(
        "--kinds",
        nargs="+",
        default=["int8"],
        choices=["int8", "int8-single", "panel", "bf16", "amx", "i16", "onednn", "fbgemm"],
    )
    ap.add_argument("--shapes", choices=["smollm2", "llama-1b"], default="smollm2")
    ap.add_argument("--json", default="bench_kernels.json")
    args = ap.parse_args()
    r = run(args.rows, args.threads, args.repeat, args.kinds, args.shapes)
    print(
        f"{r['cpus']} CPUs, load (1 min) {r['load_before']:.2f}; layers {r['layer_mb']:.1f} MB, "
        f"head {r['head_mb']:.1f} MB; ms per step's worth, median (min-max), GB/s at the median"
    )
    heads = head_kinds(r["kinds"])
    parts = [f"layers:{k}" for k in r["kinds"]] + [f"head:{k}" for k in heads]
    names = [f"{r['layers']} layers, {k}" for k in r["kinds"]] + [f"head, {k}" for k in heads]
    print(
        "| threads | rows | "
        + " | ".join(f"{n} | GB/s" for n in names)
        + " |\n|"
        + "---|" * (2 + 2 * len(parts))
    )
    for row in r["rows"]:
        cells = []
        for part in parts:
            v = row[part]
            cells.append(
                f"{v['median_ms']:.2f} ({v['min_ms']:.2f}-{v['max_ms']:.2f}) | {v['gb_s']:.1f}"
            )
        print(f"| {row['threads']} | {row['rows']} | {' | '.join(cells)} |")
    Path(args.json).write_text(json.dumps(r, indent=2))
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
