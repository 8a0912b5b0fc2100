"""A stand-in for `python -m inference.bench` in the job tests: it takes the same --model,
--json and --plot arguments and writes a small results file and plot in well under a
second, or holds until a gate file appears (a long job that the test ends when it wants).
The real benchmark job is tested in test_celery_worker.py (slow)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--json", required=True)
p.add_argument("--plot", required=True)
p.add_argument("--gate", help="wait until this file exists (at most 120 s)")
args = p.parse_args()
if args.gate:
    deadline = time.monotonic() + 120
    while not Path(args.gate).exists():
        if time.monotonic() > deadline:
            raise SystemExit("the gate never opened")
        time.sleep(0.1)
Path(args.json).write_text(
    json.dumps({"single_ours": {"decode_tok_s": 2.5}, "targets": [{"name": "t", "met": True}]})
)
Path(args.plot).write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(2048))
