"""The engine is plain Python + torch: it imports, builds and generates with redis not
installed at all (redis is the `kv-tier` extra), and asking it for the Redis tier then says
what to install. Run in a subprocess whose imports of redis fail, as they would there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

NO_REDIS = """
import importlib.abc, sys

class NoRedis(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("redis", "hiredis"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name.split(".")[0])
        return None

sys.meta_path.insert(0, NoRedis())
"""

USE_THE_ENGINE = """
import inference.engine
from inference.engine import AsyncEngine, EngineConfig, SamplingParams
from inference.engine.engine import LLMEngine

config = dict(model=sys.argv[1], dtype="float32", quantization="none", kv_cache_memory_mb=8)
engine = LLMEngine(EngineConfig(**config))
engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=3, temperature=0.0), request_id="r")
out = []
while engine.has_work():
    out += [d for d in engine.step() if d.token_ids]
print("generated", sum(len(d.token_ids) for d in out))
assert not any(m.split(".")[0] == "redis" for m in sys.modules), "redis was imported"
try:
    LLMEngine(EngineConfig(**config, kv_tier_url="redis://127.0.0.1:6379/4"))
except RuntimeError as exc:
    print("tier:", exc)
"""


def test_the_engine_imports_builds_and_generates_without_redis(tiny_model_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_REDIS + USE_THE_ENGINE, str(tiny_model_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "generated 3" in done.stdout
    assert "needs the redis package" in done.stdout and "kv-tier" in done.stdout


def test_the_subprocess_really_has_no_redis() -> None:
    """The finder above stands in for an environment without the package."""
    code = NO_REDIS + "import redis"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0 and "No module named 'redis'" in done.stderr
