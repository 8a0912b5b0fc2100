"""Which weight format multiplies a large step fastest: one decoder layer's four products and
the lm_head of the default model, at 16 / 32 / 64 rows, interleaved.

    python -m inference.bench.linear_formats --rows 16 32 64
    python -m inference.bench.linear_formats --autotune   # + inductor's own GEMM template

- fbgemm-fp16: float16-stored weights, float32 activations (the engine's large steps);
- aten-fp32: float32 weights through F.linear;
- mkldnn-fp32 / mkl-fp32: float32 weights prepacked for the batch size, as inductor's
  freezing prepacks them;
- inductor-frozen: the products compiled with freezing (what a frozen compiled step
  would run);
- inductor-autotune: the same with max-autotune (inductor's C++ GEMM template competes).

Prints ms (the thread's CPU time: less moved by other processes; one torch thread, as the
engine's large steps run on a 2-core machine) per layer + head, median (min-max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

# (out, in) of SmolLM2-135M's fused qkv, o, gate_up, down, and the lm_head.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]


class _Products(torch.nn.Module):
    def __init__(self, weights: list[torch.Tensor]) -> None:
        super().__init__()
        linears = [torch.nn.Linear(w.shape[1], w.shape[0], bias=False) for w in weights]
        for lin, w in zip(linears, weights, strict=True):
            lin.weight.data.copy_(w)
        self.layers = torch.nn.ModuleList(linears)

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = [lin(x) for lin, x in zip(self.layers, xs, strict=True)]
        return out


def _compiled(
    weights: list[torch.Tensor], xs: list[torch.Tensor], autotune: bool
) -> Callable[[], Any]:
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    module = _Products(weights).eval()
    with inductor_config.patch(
        freezing=True, max_autotune=autotune, max_autotune_gemm_backends="CPP,ATEN"
    ):
        fn = torch.compile(module)
        with torch.no_grad():
            fn(xs)
    return lambda: fn(xs)


def variants(rows: int, autotune: bool) -> dict[str, Callable[[], Any]]:
    g = torch.Generator().manual_seed(rows)
    weights = [torch.randn(n, k, generator=g) * 0.02 for n, k in SHAPES]
    xs = [torch.randn(rows, k, generator=g) for _, k in SHAPES]
    fp16 = [torch.ops.quantized.linear_prepack_fp16(w, None) for w in weights]
    mkldnn = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in weights]
    mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, rows) for w in weights]
    linear16 = torch.ops.quantized.linear_dynamic_fp16.default
    out: dict[str, Callable[[], Any]] = {
        "fbgemm-fp16": lambda: [linear16(x, p) for x, p in zip(xs, fp16, strict=True)],
        "aten-fp32": lambda: [F.linear(x, w) for x, w in zip(xs, weights, strict=True)],
        "mkldnn-fp32": lambda: [
            torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
            for x, p in zip(xs, mkldnn, strict=True)
        ],
        "mkl-fp32": lambda: [
            torch.ops.mkl._mkl_linear(x, p, w, None, rows)
            for x, p, w in zip(xs, mkl, weights, strict=True)
        ],
        "inductor-frozen": _compiled(weights, xs, autotune=False),
    }
    if autotune:
        out["inductor-autotune"] = _compiled(weights, xs, autotune=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m inference.bench.linear_formats", description=__doc__
    )
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--autotune", action="store_true")
    ap.add_argument("--json", default="bench_linear_formats.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = []
    for rows in args.rows:
        fns = variants(rows, args.autotune)
        times: dict[str, list[float]] = {k: [] for k in fns}
        with torch.no_grad():
            for _ in range(args.repeat):
                for k, fn in fns.items():
                    start = time.thread_time()
                    fn()
                    times[k].append((time.thread_time() - start) * 1e3)
        base = statistics.median(times["fbgemm-fp16"])
        for k, v in times.items():
            row = {
                "rows": rows, "format": k, "median_ms": statistics.median(v),
                "min_ms": min(v), "max_ms": max(v), "to_fbgemm": statistics.median(v) / base,
            }  # fmt: skip
            results.append(row)
            print(json.dumps(row), flush=True)
    print("\nCPU ms, one layer's four products + the lm_head, 1 thread: median (min-max)")
    print("| rows | format | ms | / fbgemm-fp16 |\n|---|---|---|---|")
    for r in results:
        print(
            f"| {r['rows']} | {r['format']} | {r['median_ms']:.2f} ({r['min_ms']:.2f}-"
            f"{r['max_ms']:.2f}) | {r['to_fbgemm']:.2f} |"
        )
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
