"""Where a step's time goes, by weight format, number of streams and step path.

    python -m inference.bench.step_profile --streams 1 16 64 --prefill 512
    python -m inference.bench.step_profile --variants eager compiled --streams 16 32 64

For each variant (a weight format, and ENGINE_COMPILE off or on) and stream count it decodes
that many streams together (temperature 0.7 / top-p 0.95 by default, the chat UI's) and
splits the wall time of the decode steps into:

- forward: the model's layers, itself split by a second, profiled pass (torch.profiler's
  self time per op) into matmuls, attention (the K/V writes, the block gather and SDPA, or
  the native paged-attention call), the native layer calls of small steps (4-bit matmuls
  and attention in C: the profiler cannot see inside them), norms / rope / elementwise,
  and what is left of the forward's wall time: Python and dispatch around the ops;
- logits (the lm_head), sampling;
- Python outside the forward: scheduling, `_prepare` (the batch's tensors), detokenizing,
  and the rest of the engine's bookkeeping; and, apart (not in the step), the text the
  consumer decodes as the async front hands it each delta (LLMEngine.defer_text).

With --prefill N it also times one step that prefills a single N-token prompt, split the
same way. Prints tables (ms per step, median over --repeat runs with min-max) and writes
JSON. Variants run interleaved in one process, so compare them as ratios.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import platform
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from inference.bench.spread import cell, spread
from inference.engine.config import EngineConfig
from inference.engine.detokenizer import IncrementalDetokenizer
from inference.engine.engine import LLMEngine
from inference.engine.heap import freeze_loaded
from inference.engine.sampling_params import SamplingParams

TIMED = ("forward", "logits", "sampling", "schedule", "prepare", "detokenize")
FORWARD_PARTS = ("matmuls", "attention", "native_layers", "elementwise", "forward_python")
COLUMNS = ("step_ms", *TIMED, "other_python", "consumer_detokenize", *FORWARD_PARTS)

_MATMUL_OPS = (
    "quantized::linear_dynamic",
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::linear",
    "mkldnn::",
    "mkl::",
    "aten::_weight_int",
    "engine::linear",
)
_ATTENTION_OPS = ("attention", "aten::index_select", "aten::index_copy", "engine::paged")
_NATIVE_LAYER_OPS = ("native::decode_layer",)
# The timers' clock: wall time, or the engine thread's CPU time (--clock cpu: less moved by
# other processes on a shared machine, but blind to the kernels' pool threads).
CLOCK: list[Callable[[], float]] = [time.perf_counter]


def category(op: str) -> str:
    """Which part of the forward a profiled op's self time belongs to."""
    if op.startswith(_NATIVE_LAYER_OPS):
        return "native_layers"
    if "attention" in op or op.startswith(_ATTENTION_OPS):
        return "attention"
    if op.startswith(_MATMUL_OPS):
        return "matmuls"
    return "elementwise"


class Timers:
    """Wraps the engine's step parts with wall-clock timers (restored by `restore`)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.acc: dict[str, float] = dict.fromkeys(TIMED, 0.0)
        self._undo: list[Callable[[], None]] = []
        model, runner = engine.runner.model, engine.runner
        self._wrap(*_forward_owner(engine), "forward")
        self._wrap(model, "compute_logits", "logits")
        self._wrap(engine.scheduler, "schedule", "schedule")
        self._wrap(runner, "_prepare", "prepare")
        sampler = engine.sampler
        engine.sampler = self._timed("sampling", sampler)  # type: ignore[assignment]
        self._undo.append(lambda: setattr(engine, "sampler", sampler))
        add_token = IncrementalDetokenizer.add_token
        IncrementalDetokenizer.add_token = self._timed("detokenize", add_token)  # type: ignore[method-assign]
        self._undo.append(lambda: setattr(IncrementalDetokenizer, "add_token", add_token))

    def _timed(self, key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        acc = self.acc

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = CLOCK[0]()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[key] += CLOCK[0]() - start

        return wrapper

    def _wrap(self, obj: Any, name: str, key: str) -> None:
        had = name in vars(obj)
        original = getattr(obj, name)
        setattr(obj, name, self._timed(key, original))
        self._undo.append(lambda: setattr(obj, name, original) if had else delattr(obj, name))

    def reset(self) -> None:
        for k in self.acc:
            self.acc[k] = 0.0

    def restore(self) -> None:
        undo, self._undo = self._undo, []
        for u in reversed(undo):
            u()


def forward_split(engine: LLMEngine, steps: int) -> dict[str, float]:
    """ms per step of each forward part, from `steps` profiled steps (the profiler's own
    overhead inflates the ops a little; the forward's wall time comes from an unprofiled
    run)."""
    parts: dict[str, float] = defaultdict(float)
    done = 0
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        while engine.has_work() and done < steps:
            engine.step()
            done += 1
    forward_ops = _forward_ops(prof)
    for name, self_us in forward_ops.items():
        parts[category(name)] += self_us / 1e3 / max(1, done)
    return dict(parts)


def _forward_ops(prof: Any) -> dict[str, float]:
    """Self CPU time (us) per op name, of the ops run inside the model's forward (under the
    `engine::forward` range) only: the lm_head and the sampler run ops of the same names."""
    events = prof.events()
    ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == "engine::forward"]
    totals: dict[str, float] = defaultdict(float)
    if not ranges:
        return totals
    ranges.sort()

    starts = [r[0] for r in ranges]
    for e in events:
        if e.name == "engine::forward":
            continue
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i >= 0 and e.time_range.end <= ranges[i][1]:
            totals[e.name] += e.self_cpu_time_total
    return totals


def _forward_owner(engine: LLMEngine) -> tuple[Any, str]:
    """Where the step's forward is called: the runner's dispatch between the compiled and
    the eager forward, or (an engine from before it) the model's own."""
    runner = engine.runner
    if hasattr(runner, "_forward"):
        return runner, "_forward"
    return runner.model, "forward"


class _MarkedLib:
    """A ctypes library whose `name` calls show up in the profiler as `label`."""

    def __init__(self, lib: Any, name: str, label: str) -> None:
        self._lib, self._name, self._label = lib, name, label

    def __getattr__(self, attr: str) -> Any:
        fn = getattr(self._lib, attr)
        if attr != self._name:
            return fn

        def marked(*args: Any) -> Any:
            with torch.profiler.record_function(self._label):
                return fn(*args)

        return marked


def _with_forward_range(engine: LLMEngine) -> Callable[[], None]:
    """Mark each forward as a profiler range, so its ops can be told apart, and the native
    calls inside it as ops of their own (returns the restorer)."""
    model = engine.runner.model
    undo: list[Callable[[], None]] = []
    owner, name = _forward_owner(engine)
    had = name in vars(owner)
    forward = getattr(owner, name)

    def marked(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function("engine::forward"):
            return forward(*args, **kwargs)

    setattr(owner, name, marked)
    undo.append(lambda: setattr(owner, name, forward) if had else delattr(owner, name))
    for holder, fn_name, label in (
        (getattr(model, "native", None), "decode_layer", "native::decode_layer"),
        (getattr(model, "paged", None), "paged_attention", "engine::paged_attention"),
    ):
        if holder is not None:
            lib = holder.lib
            holder.lib = _MarkedLib(lib, fn_name, label)
            undo.append(functools.partial(setattr, holder, "lib", lib))

    def restore() -> None:
        for u in reversed(undo):
            u()

    return restore


def _prompt(engine: LLMEngine) -> list[int]:
    ids: list[int] = engine.tokenizer.encode(
        "<|im_start|>user\nTell me a long story about a dragon.<|im_end|>\n<|im_start|>assistant\n"
    )
    return ids


def _resolve(delta: Any) -> None:
    """What the async front does with each delta as its consumer takes it."""
    resolve = getattr(delta, "resolve_text", None)
    if resolve is not None:
        resolve()


def _serve_like(engine: LLMEngine) -> None:
    # As AsyncEngine runs it: text decoded by the consumer, off the step's path, and what
    # startup loaded out of the garbage collector's full passes.
    if hasattr(engine, "defer_text"):
        engine.defer_text = True
    freeze_loaded()


def profile_decode(
    engine: LLMEngine, streams: int, tokens: int, temperature: float, top_p: float, split: bool
) -> dict[str, float]:
    prompt = _prompt(engine)
    for i in range(streams):
        p = SamplingParams(max_tokens=tokens, temperature=temperature, top_p=top_p, ignore_eos=True)
        engine.add_request([*prompt, 100 + i], p)
    while any(s.num_uncomputed_tokens > 1 for s in engine.scheduler.running) or (
        engine.scheduler.waiting or engine._inbox
    ):
        engine.step()  # prefill: not what this measures
    restore_range = _with_forward_range(engine)  # first: the timers wrap the marked forward
    timers = Timers(engine)
    try:
        profiled = max(2, tokens // 4) if split else 0
        steps, total, consumer = 0, 0.0, 0.0
        while engine.has_work() and steps < tokens - profiled - 1:
            start = CLOCK[0]()
            deltas = engine.step()
            total += CLOCK[0]() - start
            steps += 1
            in_step = timers.acc["detokenize"]  # the consumer's decoding is not the step's
            start = CLOCK[0]()
            for d in deltas:
                _resolve(d)
            consumer += CLOCK[0]() - start
            timers.acc["detokenize"] = in_step
        acc = dict(timers.acc)
        acc["consumer_detokenize"] = consumer
        timers.restore()
        parts = forward_split(engine, profiled) if split else {}
        while engine.has_work():
            engine.step()
    finally:
        restore_range()
        timers.restore()
    return _row(total, steps, acc, parts)


def profile_prefill(engine: LLMEngine, length: int, split: bool) -> dict[str, float]:
    """One step prefilling a single `length`-token prompt (nothing cached: a fresh prefix)."""
    base = _prompt(engine)
    salt = int(time.perf_counter_ns() % 40000)
    prompt = [(salt + i) % 40000 + 200 for i in range(length - len(base))] + base
    engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    restore_range = _with_forward_range(engine)  # first: the timers wrap the marked forward
    timers = Timers(engine)
    try:
        start = CLOCK[0]()
        engine.step()
        total = CLOCK[0]() - start
        acc = dict(timers.acc)
        timers.restore()
        while engine.has_work():
            engine.step()
        parts: dict[str, float] = {}
        if split:
            engine.add_request([p + 1 for p in prompt], SamplingParams(max_tokens=1))
            parts = forward_split(engine, 1)
            while engine.has_work():
                engine.step()
    finally:
        restore_range()
        timers.restore()
    return _row(total, 1, acc, parts)


def _row(
    total: float, steps: int, acc: dict[str, float], parts: dict[str, float]
) -> dict[str, float]:
    steps = max(1, steps)
    row = {"step_ms": total / steps * 1e3, **{k: v / steps * 1e3 for k, v in acc.items()}}
    row["other_python"] = row["step_ms"] - sum(row[k] for k in TIMED)
    row.setdefault("consumer_detokenize", 0.0)
    if parts:
        ops = sum(parts.values())
        for k in FORWARD_PARTS[:-1]:
            row[k] = parts.get(k, 0.0)
        row["forward_python"] = max(0.0, row["forward"] - ops)
    return row


def _cell(row: dict[str, Any], key: str) -> str:
    return cell(row.get(key), digits=2)


def print_tables(rows: list[dict[str, Any]]) -> None:
    print("\nms per step, median (min-max)")
    head = (
        "step", "forward", "logits", "sampling", "schedule", "prepare", "detokenize", "other",
        "detokenize (consumer)",
    )  # fmt: skip
    print("| variant | step | streams | " + " | ".join(head) + " |\n|" + "---|" * (len(head) + 3))
    for row in rows:
        keys = ("step_ms", *TIMED, "other_python", "consumer_detokenize")
        cells = " | ".join(_cell(row, k) for k in keys)
        print(f"| {row['variant']} | {row['kind']} | {row['streams']} | {cells} |")
    if any("matmuls" in r for r in rows):
        print("\nthe forward, split (profiled pass; forward python = forward wall - ops)")
        print("| variant | step | streams | " + " | ".join(FORWARD_PARTS) + " |\n|" + "---|" * 8)
        for row in rows:
            cells = " | ".join(_cell(row, k) for k in FORWARD_PARTS)
            print(f"| {row['variant']} | {row['kind']} | {row['streams']} | {cells} |")


VARIANTS = {
    "eager": {"compile": "off"},
    "compiled": {"compile": "on"},
    # The torch path as before the native paged attention: each group's blocks gathered
    # for SDPA (the same engine with the kernel taken away).
    "gather": {"compile": "off"},
}


def _variant(name: str) -> dict[str, str]:
    # An engine from before ENGINE_COMPILE existed runs eager only (the "before" figures).
    fields = EngineConfig.__dataclass_fields__
    if name == "compiled" and "compile" not in fields:
        raise SystemExit("this engine has no compiled step (EngineConfig.compile)")
    return {k: v for k, v in VARIANTS[name].items() if k in fields}


def main() -> None:
    from inference.model_files import default_model_path

    ap = argparse.ArgumentParser(prog="python -m inference.bench.step_profile", description=__doc__)
    ap.add_argument("--model", default=str(default_model_path()))
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--prefill", type=int, nargs="*", default=[], help="prompt lengths to time")
    ap.add_argument("--quantization", nargs="+", default=["auto"])
    ap.add_argument("--variants", nargs="+", default=["eager"], choices=sorted(VARIANTS))
    ap.add_argument("--threads", type=int, default=0, help="ENGINE_NUM_THREADS (0: default)")
    ap.add_argument("--small-step-threads", type=int, default=0)
    ap.add_argument(
        "--native-max-rows", type=int, nargs="+", default=[0],
        help="ENGINE_NATIVE_MAX_ROWS values to compare (0: the default)",
    )  # fmt: skip
    ap.add_argument("--tokens", type=int, default=48, help="tokens decoded per stream")
    ap.add_argument("--temperature", type=float, default=0.7, help="0 for greedy")
    ap.add_argument("--top-p", type=float, default=0.95, help="the chat UI's default")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-split", action="store_true", help="skip the profiled forward split")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--json", default="bench_step_profile.json")
    args = ap.parse_args()
    if args.clock == "cpu":
        CLOCK[0] = time.thread_time
    engines: dict[str, LLMEngine] = {}
    for q in args.quantization:
        for v in args.variants:
            for native_rows in args.native_max_rows:
                name = f"{q}/{v}" + (f"/native<={native_rows}" if native_rows else "")
                engines[name] = LLMEngine(
                    EngineConfig(
                        model=args.model, quantization=q, num_threads=args.threads,
                        small_step_threads=args.small_step_threads, kv_tier_url="",
                        max_num_seqs=max(args.streams), native_max_rows=native_rows,
                        **_variant(v),  # type: ignore[arg-type]
                    )
                )  # fmt: skip
                _serve_like(engines[name])
                if v == "gather":
                    engines[name].runner.model.paged = None
    any_engine = next(iter(engines.values()))
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {platform.processor() or '?'}",
        "torch": torch.__version__,
        "threads": any_engine.config.cpu_threads(),
        "small_step_threads": any_engine.config.small_step_cpu_threads(),
        "clock": args.clock,
        "rows": [],
    }
    split = not args.no_split
    cases = [("decode", n) for n in args.streams] + [("prefill", n) for n in args.prefill]
    for kind, n in cases:
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
        for _ in range(args.repeat):  # interleaved: every variant once per round
            for name, engine in engines.items():
                if kind == "decode":
                    r = profile_decode(engine, n, args.tokens, args.temperature, args.top_p, split)
                else:
                    r = profile_prefill(engine, n, split)
                runs[name].append(r)
        for name, rs in runs.items():
            row: dict[str, Any] = {"variant": name, "kind": kind, "streams": n}
            for key in COLUMNS:
                vals = [r[key] for r in rs if key in r]
                if vals:
                    row[key] = spread(vals)
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
    for engine in engines.values():
        engine.close()
    print(
        f"\n{results['machine']}; torch {results['torch']}; threads {results['threads']}; "
        f"clock {args.clock}"
    )
    print_tables(results["rows"])
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"json: {args.json}")


if __name__ == "__main__":
    main()
