"""The benchmark's table, its target checks and its plot."""

from __future__ import annotations

from typing import Any

from inference.bench.kv_tier import print_section
from inference.bench.kv_tier import targets as kv_tier_targets
from inference.bench.speculative import print_section as print_speculative
from inference.bench.speculative import targets as speculative_targets
from inference.bench.targets import checked, fmt, print_targets


def _get(results: dict[str, Any], section: str, key: str) -> float | None:
    value = results.get(section)
    if isinstance(value, dict) and isinstance(value.get(key), int | float):
        return float(value[key])
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue: the measured ratio, the bar, met or missed."""
    turn = r.get("multi_turn_cache", {}).get("ttft_p50_by_turn", {})
    turn_off = r.get("multi_turn_nocache", {}).get("ttft_p50_by_turn", {})
    hf_single = _get(r, "single_hf", "decode_tok_s")
    rows = [
        ("single-stream decode vs (b) HF generate", ">=", 2.5,
         _ratio(_get(r, "single_ours", "decode_tok_s"), hf_single)),
        ("single-stream decode, exact fp32 path, vs (b)", ">=", 2.5,
         _ratio(_get(r, "single_ours_exact", "decode_tok_s"), hf_single)),
        ("64 streams tok/s vs (c) HF static batching", ">=", 2.0,
         _ratio(_get(r, "streams64_ours", "tok_s"), _get(r, "streams64_hf_static", "tok_s"))),
        ("64 streams tok/s vs (b) HF one at a time", ">=", 15.0,
         _ratio(_get(r, "streams64_ours", "tok_s"), _get(r, "streams64_hf_sequential", "tok_s"))),
        ("multi-turn TTFT p50 turn 8 / turn 2", "<=", 1.3,
         _ratio(turn.get(8), turn.get(2))),
        ("multi-turn TTFT p50 turn 8, cache on / off", "<=", 0.25,
         _ratio(turn.get(8), turn_off.get(8))),
        ("TTFT p99 while 16 decode / alone", "<=", 3.0, _get(r, "busy", "ttft_ratio_p99")),
        ("stream ITL p99 during 2k prefill / median", "<=", 3.0, _get(r, "busy", "itl_ratio")),
    ]  # fmt: skip
    if isinstance(r.get("kv_tier"), dict) and "restore" in r["kv_tier"]:
        rows += kv_tier_targets(r["kv_tier"])
    if isinstance(r.get("speculative"), dict) and "grounded" in r["speculative"]:
        rows += speculative_targets(r["speculative"])
    out = checked(rows)
    flood = r.get("flood", {})
    if "submitted" in flood:
        ok = flood["other"] == 0
        out.append({
            "target": f"{flood['submitted']} at once: each completes or is refused busy",
            "measured": f"{flood['completed']} done, {flood['refused_busy']} busy",
            "bar": "no other outcome", "met": ok,
        })  # fmt: skip
    return out


def print_table(r: dict[str, Any]) -> None:
    print(f"\nengine: {r.get('engine')}   machine: {r.get('machine')}\n")
    print(
        f"{'workload':<28}{'ours':>12}{'(b) HF 1-by-1':>15}{'(c) HF static':>15}{'(d) HF CB':>12}"
    )
    print("-" * 82)
    print(
        f"{'single stream decode tok/s':<28}{fmt(_get(r, 'single_ours', 'decode_tok_s')):>12}"
        f"{fmt(_get(r, 'single_hf', 'decode_tok_s')):>15}{'':>15}{'':>12}"
    )
    print(f"{'  exact fp32 path tok/s':<28}{fmt(_get(r, 'single_ours_exact', 'decode_tok_s')):>12}")
    print(
        f"{'single stream TTFT s':<28}{fmt(_get(r, 'single_ours', 'ttft'), 3):>12}"
        f"{fmt(_get(r, 'single_hf', 'ttft'), 3):>15}"
    )
    for n in (4, 16, 64):
        print(
            f"{f'{n} streams output tok/s':<28}{fmt(_get(r, f'streams{n}_ours', 'tok_s')):>12}"
            f"{fmt(_get(r, f'streams{n}_hf_sequential', 'tok_s')):>15}"
            f"{fmt(_get(r, f'streams{n}_hf_static', 'tok_s')):>15}"
            f"{fmt(_get(r, f'streams{n}_hf_cb', 'tok_s')):>12}"
        )
    on = r.get("multi_turn_cache", {})
    off = r.get("multi_turn_nocache", {})
    if "ttft_p50_by_turn" in on:
        print("\nmulti-turn TTFT p50 (s) by turn, prefix cache on / off, cached prompt tokens:")
        for t, v in on["ttft_p50_by_turn"].items():
            print(
                f"  turn {t}: {v:.3f} / {fmt(off.get('ttft_p50_by_turn', {}).get(t), 3)}"
                f"   cached {on['cached_tokens_by_turn'][t]:.0f}"
            )
    busy = r.get("busy", {})
    if "ttft_alone" in busy:
        print("\nwhile 16 streams decode:")
        for k, v in busy.items():
            print(f"  {k:<30}{fmt(v, 3)}")
    flood = r.get("flood", {})
    if flood:
        print("\nflood:", {k: fmt(v, 1) for k, v in flood.items()})
    if "kv_tier" in r:
        print_section(r["kv_tier"])
    if "speculative" in r:
        print_speculative(r["speculative"])
    print_targets(r.get("targets", []))


def plot(r: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = ["1", "4", "16", "64"]
    systems = [("ours", "ours"), ("hf_sequential", "(b) HF 1-by-1"),
               ("hf_static", "(c) HF static"), ("hf_cb", "(d) HF CB")]  # fmt: skip
    for k, (suffix, name) in enumerate(systems):
        values = []
        for n in labels:
            if n == "1":
                sec = "single_ours" if suffix == "ours" else "single_hf"
                v = _get(r, sec, "decode_tok_s") if suffix in ("ours", "hf_sequential") else None
            else:
                v = _get(r, f"streams{n}_{suffix}", "tok_s")
            values.append(v or 0.0)
        a.bar([i + 0.2 * k for i in range(len(labels))], values, width=0.2, label=name)
    a.set_xticks([i + 0.3 for i in range(len(labels))], labels)
    a.set_xlabel("concurrent streams")
    a.set_ylabel("output tokens / s")
    a.set_yscale("log")
    a.legend()
    a.set_title("throughput")
    for key, name in (("multi_turn_cache", "prefix cache on"), ("multi_turn_nocache", "off")):
        by_turn = r.get(key, {}).get("ttft_p50_by_turn", {})
        if by_turn:
            b.plot([int(t) for t in by_turn], list(by_turn.values()), marker="o", label=name)
    b.set_xlabel("turn")
    b.set_ylabel("TTFT p50 (s)")
    b.set_title("multi-turn chats, whole history each turn")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
