"""A benchmark's targets: each a measured figure against a bar, met or missed, printed in
one table (report.py and each section's program use them)."""

from __future__ import annotations

from typing import Any

Target = tuple[str, str, float, float | None]  # name, "<" / "<=" / ">=", bar, measured


def checked(rows: list[Target]) -> list[dict[str, Any]]:
    """Each target row with its verdict: met, missed, or None when nothing was measured."""
    out = []
    for name, op, bar, value in rows:
        met = None
        if value is not None:
            met = value >= bar if op == ">=" else value < bar if op == "<" else value <= bar
        out.append({"target": name, "measured": value, "bar": f"{op} {bar}", "met": met})
    return out


def print_targets(rows: list[dict[str, Any]]) -> None:
    print("\ntargets:")
    for t in rows:
        mark = {True: "MET", False: "MISSED", None: "n/a"}[t["met"]]
        print(f"  {t['target']:<48}{fmt(t['measured']):>10}  {t['bar']:<8} {mark}")


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)
