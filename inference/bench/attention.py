"""The native path's decode attention alone (kernels.decode_attention), by rows and context.

    python -m inference.bench.attention --rows 16 64 --context 100 300 --repeat 7
    python -m inference.bench.attention --baseline /tmp/base   # another checkout, interleaved
    python -m inference.bench.attention --kv-dtypes float32 float16   # the pool's two formats

The default model's attention shape (30 layers of 9 query heads over 3 KV heads of 64,
blocks of 16 positions), one pool per layer as a step has, each row a decode of its own
sequence `--context` positions long. Layouts of the rows' blocks (`--layouts`): `scattered`
(every row's blocks its own and out of order, as the blocks of many chats interleave in the
pool), `contiguous` (every row's blocks its own and in order, one run of the pool each) and
`shared` (every row on the same blocks, which then stay in the caches: what the same
arithmetic costs without waiting for memory). ms for the 30 layers, median (min-max) over
`--repeat` rounds, and the rate the rows' own K/V are read at. With `--baseline DIR`
the kernels of that checkout (built from its sources, same flags) run too, interleaved with
these round by round, and the table gives this build's ratio to it; with `--kv-dtypes`
this build (and the baseline: a checkout from before ENGINE_KV_DTYPE reads float32 only)
runs over pools of each element type, interleaved the same way, the ratios to the first.
Writes JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from inference.bench.spread import cell, spread
from inference.engine import kernels
from inference.engine.kernels.build import compiled_library
from inference.engine.kv_codec import row_width, to_pool

LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 30, 9, 3, 64, 16
LAYOUTS = ("scattered", "contiguous", "shared")


def baseline_library(root: Path) -> ctypes.CDLL:
    """The kernels of the checkout at `root`, built with this CPU's flags."""
    src = root / "inference" / "engine" / "kernels"
    lib = compiled_library(
        "quant_gemm_baseline",
        sorted(src.rglob("*.c")),  # its own files: the two checkouts' may differ
        kernels.cpu_build_flags(),
        sorted(src.rglob("*.h")),
    )
    kernels.declare_decode_attention(lib)
    return lib


def _inputs(rows: int, context: int, layout: str, gen: torch.Generator) -> dict[str, Any]:
    """One case's rows, block tables and float32 pools (kv_pools: as another dtype)."""
    width = -(-context // BLOCK)
    blocks = width if layout == "shared" else width * rows
    order = torch.randperm(blocks, generator=gen) if layout == "scattered" else torch.arange(blocks)
    starts = [0] * rows if layout == "shared" else [r * width for r in range(rows)]
    tables = torch.stack([order[s : s + width] for s in starts]).contiguous()
    pools = [torch.randn(2 * KV_HEADS, blocks, BLOCK, HEAD_DIM, generator=gen)
             for _ in range(LAYERS)]  # fmt: skip
    # Contexts a little apart, as chats' are.
    positions = torch.tensor([context - 1 - r % 7 for r in range(rows)], dtype=torch.int64)
    qkv = torch.randn(rows, HEADS + 2 * KV_HEADS, HEAD_DIM, generator=gen)
    shape = kernels.LayerShape(
        HEADS * HEAD_DIM, HEADS, KV_HEADS, HEAD_DIM, 4 * HEADS * HEAD_DIM, 1e-5,
        HEAD_DIM**-0.5, BLOCK, blocks,
    )  # fmt: skip
    kv_mb = 2 * KV_HEADS * int(positions.add(1).sum()) * HEAD_DIM * 4 * LAYERS / 1e6
    return {"tables": tables, "pools": pools, "positions": positions, "qkv": qkv,
            "shape": shape, "kv_mb": kv_mb}  # fmt: skip


def kv_pools(x: dict[str, Any], dtype: torch.dtype) -> tuple[list[torch.Tensor], Any]:
    """The case's pools in `dtype`, and its shape saying so (kv_type)."""
    shape = kernels.LayerShape.from_buffer_copy(x["shape"])
    shape.kv_type = kernels.KV_TYPES[dtype]
    return [to_pool(p, dtype).contiguous() for p in x["pools"]], shape


def _time(
    lib: ctypes.CDLL, x: dict[str, Any], pools: list[torch.Tensor], shape: Any, threads: int
) -> float:
    t0 = time.perf_counter()
    for pool in pools:
        kernels.decode_attention(lib, shape, x["qkv"], x["positions"], x["tables"], pool, threads)
    return (time.perf_counter() - t0) * 1000


def run(
    rows: list[int],
    contexts: list[int],
    threads: int,
    repeat: int,
    baseline: Path | None,
    kv_dtypes: list[str],
    layouts: list[str],
) -> dict[str, Any]:
    lib = kernels.load()
    if lib is None:
        raise SystemExit("the native kernels are not available here")
    # name -> (library, pool dtype); the first is what the others' ratios are to.
    variants = {f"this {dt}": (lib, getattr(torch, dt)) for dt in kv_dtypes}
    if baseline is not None:
        base = baseline_library(baseline)
        variants |= {f"baseline {dt}": (base, getattr(torch, dt)) for dt in kv_dtypes}
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {
        "machine": platform.machine(), "cpus": os.cpu_count(), "threads": threads,
        "repeat": repeat, "load_before": os.getloadavg()[0], "cases": [],
    }  # fmt: skip
    for n in rows:
        for ctx in contexts:
            for layout in layouts:
                x = _inputs(n, ctx, layout, gen)
                pools = {dt: kv_pools(x, dt) for _, dt in variants.values()}
                ms: dict[str, list[float]] = {name: [] for name in variants}
                for one, dt in variants.values():  # warm-up: pools paged in, scores grown
                    _time(one, x, *pools[dt], threads)
                for _ in range(repeat):
                    for name, (one, dt) in variants.items():
                        ms[name].append(_time(one, x, *pools[dt], threads))
                case: dict[str, Any] = {"rows": n, "context": ctx, "layout": layout,
                                        "kv_mb": x["kv_mb"], "variants": {}}  # fmt: skip
                first = None
                for name, (_, dt) in variants.items():
                    v = spread(ms[name])
                    v["kv_mb"] = x["kv_mb"] * row_width(HEAD_DIM, dt) * dt.itemsize / HEAD_DIM / 4
                    first = first or v
                    v["ratio"] = v["median"] / first["median"]
                    case["variants"][name] = v
                out["cases"].append(case)
                del x, pools
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m inference.bench.attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--context", type=int, nargs="+", default=[100, 300])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--baseline", type=Path, help="another checkout's root (git worktree add)")
    ap.add_argument(
        "--kv-dtypes", nargs="+", default=["float32"], choices=["float32", "float16", "int8"]
    )
    ap.add_argument("--layouts", nargs="+", default=["scattered", "shared"], choices=LAYOUTS)
    ap.add_argument("--json", default="bench_attention.json")
    args = ap.parse_args()
    r = run(
        args.rows,
        args.context,
        args.threads,
        args.repeat,
        args.baseline,
        args.kv_dtypes,
        args.layouts,
    )
    print(
        f"{r['machine']}, {r['cpus']} CPUs, {r['threads']} threads, load (1 min) "
        f"{r['load_before']:.2f}; ms for {LAYERS} layers, median (min-max) of {r['repeat']}; "
        f"K/V GB/s for the rows' own blocks; ratios to the first column"
    )
    names = list(r["cases"][0]["variants"])
    print("| rows | context | layout | " + " | ".join(f"{n} | GB/s | ratio" for n in names) + " |")
    print("|---:|---:|---|" + "---|---:|---:|" * len(names))
    for c in r["cases"]:
        line = f"| {c['rows']} | {c['context']} | {c['layout']} |"
        for v in c["variants"].values():
            rate = f"{v['kv_mb'] / v['median']:.1f}" if c["layout"] != "shared" else "-"
            line += f" {cell(v, 2)} | {rate} | {v['ratio']:.2f}x |"
        print(line)
    Path(args.json).write_text(json.dumps(r, indent=2))
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
