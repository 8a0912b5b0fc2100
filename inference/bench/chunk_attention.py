"""The prompts' chunk attention alone (kernels.chunk_attention), by chunk rows and the
context cached before them, on each of its tile kinds this CPU runs.

    python -m inference.bench.chunk_attention --rows 4 16 64 256 512 --cached 0 300 2000

The default model's attention shape (30 layers of 9 query heads over 3 KV heads of 64,
blocks of 16 positions, a float16 pool; `--head-dim 128` for the larger models' heads),
one sequence's chunk of `--rows` rows after `--cached` positions, its blocks out of
order. Kinds: `float32` (the float32 tiles), `bf16` (the AVX512-BF16 tiles, where the build
has them) and `amx` (AMX's tiles, where they run). ms for the 30 layers, median (min-max)
over `--repeat` rounds, the kinds interleaved round by round, and each kind's ratio to the
first. Writes JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from inference.bench.spread import cell, spread
from inference.engine import kernels
from inference.engine.kv_codec import to_pool

LAYERS, HEADS, KV_HEADS, BLOCK = 30, 9, 3, 16


def kinds() -> dict[str, tuple[bool, bool]]:
    """The tile kinds this build and CPU run: name -> (bf16 products, AMX's tiles)."""
    out = {"float32": (False, False)}
    if "-mavx512bf16" in kernels.cpu_build_flags():
        out["bf16"] = (True, False)
    if kernels.amx_available():
        out["amx"] = (True, True)
    return out


def _case(rows: int, cached: int, head_dim: int, gen: torch.Generator) -> dict[str, Any]:
    ctx = cached + rows
    width = -(-ctx // BLOCK)
    blocks = width + 8
    table = torch.randperm(blocks, generator=gen)[:width].to(torch.int64)
    pools = [
        to_pool(torch.randn(2 * KV_HEADS, blocks, BLOCK, head_dim, generator=gen), torch.float16)
        for _ in range(LAYERS)
    ]
    qkv = torch.randn(rows, HEADS + 2 * KV_HEADS, head_dim, generator=gen)
    positions = torch.arange(cached, ctx, dtype=torch.int64)
    return {"table": table, "pools": pools, "qkv": qkv, "positions": positions}


@contextmanager
def amx_tiles(lib: ctypes.CDLL, on: bool) -> Iterator[None]:
    """Chunks on AMX's tiles or not (where they run), then as the kernels set it at load."""
    lib.set_chunk_amx(int(on))
    try:
        yield
    finally:
        lib.set_chunk_amx(int(kernels.backend().chunk_amx))


def _time(lib: ctypes.CDLL, x: dict[str, Any], bf16: bool, amx: bool, threads: int) -> float:
    head_dim = x["qkv"].shape[-1]
    shape = kernels.ChunkShape(
        heads=HEADS, kv_heads=KV_HEADS, head_dim=head_dim, block_size=BLOCK,
        num_blocks=x["pools"][0].shape[1], scale=head_dim**-0.5,
        kv_type=kernels.kv_type(x["pools"][0]), bf16=int(bf16),
    )  # fmt: skip
    with amx_tiles(lib, amx):
        t0 = time.perf_counter()
        for pool in x["pools"]:
            kernels.chunk_attention(lib, shape, x["qkv"], x["positions"], x["table"], pool, threads)
        return (time.perf_counter() - t0) * 1000


def run(
    rows: list[int], cached: list[int], head_dim: int, threads: int, repeat: int
) -> dict[str, Any]:
    lib = kernels.load()
    if lib is None:
        raise SystemExit("the native kernels are not available here")
    variants = kinds()
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {
        "machine": platform.machine(), "cpus": os.cpu_count(), "threads": threads,
        "head_dim": head_dim, "repeat": repeat, "load_before": os.getloadavg()[0], "cases": [],
    }  # fmt: skip
    for n in rows:
        for c in cached:
            x = _case(n, c, head_dim, gen)
            for bf16, amx in variants.values():  # warm-up
                _time(lib, x, bf16, amx, threads)
            ms: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(repeat):
                for name, (bf16, amx) in variants.items():
                    ms[name].append(_time(lib, x, bf16, amx, threads))
            case: dict[str, Any] = {"rows": n, "cached": c, "variants": {}}
            first = None
            for name in variants:
                v = spread(ms[name])
                first = first or v
                v["ratio"] = v["median"] / first["median"]
                case["variants"][name] = v
            out["cases"].append(case)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m inference.bench.chunk_attention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 16, 64, 256, 512])
    ap.add_argument("--cached", type=int, nargs="+", default=[0, 300, 2000])
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", default="bench_chunk_attention.json")
    a = ap.parse_args()
    out = run(a.rows, a.cached, a.head_dim, a.threads, a.repeat)
    names = list(out["cases"][0]["variants"]) if out["cases"] else []
    print(f"{out['machine']}, {out['cpus']} CPUs, {a.threads} threads, head_dim {a.head_dim}")
    print("ms for 30 layers, median (min-max); ratio to the first kind")
    head = " | ".join(f"{n} | {n} ratio" for n in names)
    print(f"| rows | cached | {head} |\n|" + "---|" * (2 + 2 * len(names)))
    for case in out["cases"]:
        cells = " | ".join(
            f"{cell(case['variants'][n], 2)} | {case['variants'][n]['ratio']:.2f}" for n in names
        )
        print(f"| {case['rows']} | {case['cached']} | {cells} |")
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"json: {a.json}")


if __name__ == "__main__":
    main()
