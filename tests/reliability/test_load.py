"""The 30-second version of the soak (`python -m tools.load --users 64 --duration 600`):
simulated people chatting multi-turn over real sockets against a real server with the
real model. Nothing they saw may be lost, and no error other than a polite refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import load

pytestmark = pytest.mark.slow


def test_sixteen_people_chat_for_half_a_minute_and_nothing_is_lost(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    status = load.main(
        [
            "--users",
            "16",
            # Each of the 16 has several turns in this (one reply is asserted below); the
            # long soak is tools.load's own run.
            "--duration",
            "30",
            "--ramp",
            "5",
            "--max-tokens",
            "48",
            "--json",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert status == 0 and result["lost_messages"] == 0, result["errors"]
    assert result["replies"] >= 16
    unexpected = {k: v for k, v in result["errors"].items() if k not in {"busy", "rate_limited"}}
    assert not unexpected, unexpected
    rss = result["rss_mb"]
    assert rss["end"] < rss["start"] * 1.5, rss  # no unbounded growth over the run
