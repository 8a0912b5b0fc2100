"""python -m inference.bench: our engine against transformers on the issue's workloads.

Prints a table, writes a JSON file and a PNG plot. --quick runs small sizes (~3 minutes).

The other benchmark programs run through here too: `python -m inference.bench list` names
them by family, `python -m inference.bench NAME ARGS...` runs one (the same as
`python -m inference.bench.NAME ARGS...`). docs/benchmarks.md says what each measures.
"""

from __future__ import annotations

import argparse
import ast
import json
import platform
import runpy
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from inference.bench import kv_tier, speculative
from inference.bench import workloads as w
from inference.bench.baselines import HFBaselines
from inference.bench.driver import rss_mb
from inference.bench.report import plot, print_table, targets
from inference.engine.config import EngineConfig
from inference.engine.engine import LLMEngine

# The programs by family, each a module of this package with a main of its own. The engine
# in this process; our server (and llama.cpp's) through the OpenAI API, started by
# servers.py on the project's one launcher (tools/live_server.py); a step's parts alone.
PROGRAMS = {
    "engine": ("kv_tier", "followup", "chat_engine", "speculative", "model_switch", "quality",
               "workers", "tp", "scheduler_sim", "invariant"),
    "servers": ("vs_llama", "burst", "api_clients"),
    "steps and kernels": ("step_profile", "step_ab", "mixed_step", "structured",
                          "linear_formats", "kernels", "attention"),
}  # fmt: skip


def summary(name: str) -> str:
    """A program's summary: its docstring's first sentence, read without importing it (the
    imports of some load torch's extensions or a model)."""
    source = (Path(__file__).parent / f"{name}.py").read_text()
    first = " ".join((ast.get_docstring(ast.parse(source)) or "").split("\n\n")[0].split())
    first = first.removeprefix(f"python -m inference.bench.{name}: ").split(". ")[0]
    return first[:1].upper() + first[1:].rstrip(".")


def list_programs() -> None:
    print("python -m inference.bench [--quick ...]: the engine suite (--help for its options)")
    for family, names in PROGRAMS.items():
        print(f"\n{family}:")
        for name in names:
            print(f"  {name:<15}{summary(name)}")
    print("\npython -m inference.bench NAME --help: a program's options")


def run_program(name: str, args: list[str]) -> None:
    """`python -m inference.bench.NAME ARGS` from here."""
    sys.argv = [f"inference.bench.{name}", *args]
    runpy.run_module(f"inference.bench.{name}", run_name="__main__", alter_sys=True)


def parse_args() -> argparse.Namespace:
    from inference.model_files import default_model_path

    p = argparse.ArgumentParser(prog="python -m inference.bench", description=__doc__)
    p.add_argument("--model", default=str(default_model_path()), help="HF model folder")
    p.add_argument("--quick", action="store_true", help="small sizes, about 3 minutes")
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch threads for every system (default 1: on a shared 2-core box, 2 threads "
        "stall on each other and on other processes)",
    )  # fmt: skip
    p.add_argument(
        "--quantization",
        default="auto",
        help="engine weights: auto|none|fp16|int8|int4|hybrid",
    )
    p.add_argument("--skip-hf", action="store_true", help="run our engine only")
    p.add_argument("--skip-hf-cb", action="store_true", help="skip transformers generate_batch")
    p.add_argument(
        "--kv-tier-url",
        default=None,
        help=f"Redis for the KV tier section (default: ENGINE_KV_TIER_URL, else "
        f"{kv_tier.DEFAULT_URL}); it writes under a namespace of its own and drops it",
    )
    p.add_argument("--skip-kv-tier", action="store_true", help="skip the Redis KV tier section")
    p.add_argument(
        "--workers", action="store_true",
        help="add the engine workers section: 1 vs 2 `run_engine` processes (a few minutes)",
    )  # fmt: skip
    p.add_argument(
        "--skip-speculative", action="store_true", help="skip the speculative decoding section"
    )
    p.add_argument(
        "--vs-llama", action="store_true",
        help="add our server against llama.cpp's llama-server through the OpenAI API at 1, 16 "
        "and 64 users (builds llama-server once: make bench-baseline; about 15 minutes)",
    )  # fmt: skip
    p.add_argument("--json", default="bench_results.json", help="where to write the figures")
    p.add_argument("--plot", default="bench_results.png", help="where to draw the plot")
    return p.parse_args()


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "list":
        list_programs()
        return
    if any(command in names for names in PROGRAMS.values()):
        run_program(command, sys.argv[2:])
        return
    suite()


def suite() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    q = args.quick
    stream_counts = [4, 16, 64]
    sizes = {
        "single_tokens": 32 if q else 128,
        "stream_tokens": 16 if q else 64,
        "hf_sequential_sample": 2 if q else 4,
        "turns": 8,
        "conversations": 4 if q else 8,
        "turn_tokens": 8 if q else 32,
        "busy_stream_tokens": 48 if q else 96,
        "long_prompt": 2000,
        "flood": 300,
        "flood_tokens": 2 if q else 8,
    }
    results: dict[str, object] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
        "sizes": {**sizes, "stream_counts": stream_counts},
    }
    rss_start = rss_mb()
    engine = LLMEngine(
        EngineConfig(model=args.model, quantization=args.quantization, num_threads=args.threads)
    )
    results["engine"] = engine_figures = {
        "dtype": str(engine.runner.dtype),
        "quantization": engine.runner.quantization,
        "kv_blocks": engine.kv.num_blocks,
        "rss_after_load_mb": rss_mb(),
        "rss_before_load_mb": rss_start,
    }
    exact = LLMEngine(EngineConfig(model=args.model, quantization="none", kv_cache_memory_mb=64))
    hf = None if args.skip_hf else HFBaselines(args.model)

    def section(name: str, fn: Callable[..., object]) -> None:
        start = time.perf_counter()
        try:
            results[name] = fn()
        except Exception as exc:  # one broken baseline must not sink the whole run
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"[{name}] {time.perf_counter() - start:.1f}s", flush=True)

    single_prompt = w.make_prompts(engine, [60])[0]
    n = sizes["single_tokens"]
    section("single_ours", lambda: w.single_stream(engine, single_prompt, n))
    section("single_ours_exact", lambda: w.single_stream(exact, single_prompt, n))
    exact = None  # free its memory before the baselines load
    if hf:
        section("single_hf", lambda: hf.decode_rate(single_prompt, n))

    for count in stream_counts:
        lengths = [30 + (i * 37) % (100 if q else 200) for i in range(count)]
        prompts = w.make_prompts(engine, lengths)
        t = sizes["stream_tokens"]
        section(f"streams{count}_ours", lambda p=prompts, t=t: w.concurrent(engine, p, t))
        if hf:
            k = sizes["hf_sequential_sample"]
            section(
                f"streams{count}_hf_sequential", lambda p=prompts, t=t, k=k: hf.sequential(p, t, k)
            )
            section(f"streams{count}_hf_static", lambda p=prompts, t=t: hf.static_batch(p, t))
            if not args.skip_hf_cb and count == 4:  # ~3 tok/s here: larger sets take too long
                section(f"streams{count}_hf_cb", lambda p=prompts, t=t: hf.continuous(p, t))

    for on in (True, False):
        section(
            f"multi_turn_{'cache' if on else 'nocache'}",
            lambda on=on: w.multi_turn(
                engine, sizes["conversations"], sizes["turns"], sizes["turn_tokens"], on
            ),
        )
    probe = w.make_prompts(engine, [60])[0]
    long_prompt = w.make_prompts(engine, [sizes["long_prompt"]])[0]
    section(
        "busy",
        lambda: w.busy_streams(engine, 16, sizes["busy_stream_tokens"], probe, long_prompt),
    )
    flood_len = 16 if q else 40
    section("flood", lambda: w.flood(engine, sizes["flood"], sizes["flood_tokens"], flood_len))
    if not args.skip_kv_tier:
        section(
            "kv_tier",
            lambda: kv_tier.run(
                args.model, kv_tier.tier_url(args.kv_tier_url), args.quantization, args.threads
            ),
        )
    if not args.skip_speculative:
        section(
            "speculative",
            lambda: speculative.run(args.model, args.quantization, args.threads, quick=args.quick),
        )
    if args.vs_llama:
        from inference.bench import vs_llama

        section("vs_llama", lambda: vs_llama.run(threads=args.threads))
    if args.workers:
        from inference.bench import workers

        section("workers", lambda: workers.run(args.model, args.threads))
    results["flood_rss_after_load_mb"] = engine_figures["rss_after_load_mb"]
    results["targets"] = targets(results)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")

    with open(args.json, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print_table(results)
    try:
        plot(results, args.plot)
        print(f"plot: {args.plot}")
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
