"""A short run of the soak (tools/soak.py) with one engine worker SIGKILLed: its invariants
hold, from the clients' records against the database. The deployment is real and its own
(daphne in distributed mode, two `run_engine` workers on the tiny model, the Redis channel
layer, a fresh PostgreSQL database on 127.0.0.1:5432, dropped at the end); the 30-minute
run with a server kill as well is `python -m tools.soak --duration 1800`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.live_server import ROOT

pytestmark = pytest.mark.slow
# Setting up the deployment (a migrated database, two workers loading, daphne) is most of
# the run; on a busy 2-core machine it took over the default 300 s.
RUN_TIMEOUT_S = 840


def postgres_answers() -> bool:
    import psycopg

    try:
        psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres",
                        connect_timeout=3).close()  # fmt: skip
    except psycopg.OperationalError:
        return False
    return True


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_a_short_soak_with_a_worker_killed_keeps_every_message_and_ends_every_request(
    tmp_path: Path,
) -> None:
    if not postgres_answers():
        pytest.skip("the soak needs PostgreSQL at 127.0.0.1:5432 (user postgres)")
    out = tmp_path / "soak.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.soak", "--duration", "20", "--users", "4",
         "--api-clients", "1", "--faults", "worker", "--ramp", "2", "--think-min", "0.3",
         "--think-max", "1.5", "--json", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the soak stops its deployment and drops its database on SIGTERM
        output, _ = proc.communicate(timeout=60)
        pytest.fail(f"the soak did not end in {RUN_TIMEOUT_S} s:\n{output}")
    assert out.exists(), output
    result = json.loads(out.read_text())
    print(output)
    assert result["violations"] == [], result["violations"]
    assert proc.returncode == 0 and result["ok"], output
    # The run did what it says: requests of both kinds, the kill, a replacement worker.
    assert result["chat_requests"] >= 4 and result["api_requests"] >= 1
    assert [f["fault"] for f in result["faults"]] == ["worker"]
    assert result["faults"][0]["replacement_ready_s"] > 0
    # No reply left marked streaming; every acknowledged chat request ended with `done`.
    assert result["replies_left_streaming_in_db"] == 0
    assert all(end.startswith("done_") for end in result["chat_endings"])
    assert result["worst_text_loss"]["seconds"] <= 1.0
