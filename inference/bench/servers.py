"""The servers the benchmarks start, through the project's one launcher
(tools/live_server.py): ours as `make run` serves it, and what the programs that compare
servers share (the machine's description, KEY=VALUE settings). llama.cpp's llama-server is
llama_server.py's, on the same launcher's helpers."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from inference.bench.kv_tier import drop_namespace
from inference.engine.config import EngineConfig
from inference.engine.kv_budget import KV_MEMORY_SHARE, available_memory
from tools.live_server import ROOT, LiveServer

# The web app's KV tier when ENGINE_KV_TIER_URL is unset (chatapp/settings/engine.py).
DEFAULT_TIER_URL = "redis://127.0.0.1:6379/4"
THREAD_SETTINGS = ("ENGINE_NUM_THREADS", "ENGINE_SMALL_STEP_THREADS")
# A served model can take minutes to load on a busy machine.
START_TIMEOUT_S = 300


class OurServer(LiveServer):
    """One of our servers as `make run` serves it (daphne, the embedded engine, the served
    default model and settings), on its own SQLite file and KV-tier namespace, with an API
    key without limits (`key`).

    `threads`: both of the engine's thread settings (0: their defaults, neither inherited
    from this environment), the budget llama-server gets. `env`: settings on top; TREE=path
    among them runs that checkout's code (`git worktree add /tmp/base HEAD`) with this
    environment's packages and model."""

    def __init__(self, workdir: Path, threads: int, env: dict[str, str], name: str = "ours"):
        workdir = workdir / name
        workdir.mkdir(parents=True, exist_ok=True)
        env = dict(env)
        root = Path(env.pop("TREE")).resolve() if "TREE" in env else ROOT
        threads_env = {k: str(threads) for k in THREAD_SETTINGS} if threads else {}
        tier = {"ENGINE_KV_TIER_NAMESPACE": f"bench-{os.getpid()}-{name}"}
        super().__init__(workdir, None, root, **{**tier, **threads_env, **env})
        for k in THREAD_SETTINGS:
            if k not in threads_env and k not in env:
                self.env.pop(k, None)
        self.name = name
        self.log = workdir / "ours.log"
        self.key = ""

    def start(self, timeout: float = START_TIMEOUT_S) -> OurServer:
        if self.root != ROOT:
            # Another checkout's kernels are built in its own tree, as its setup builds
            # them: without them it would serve on torch's products, another engine.
            subprocess.run(
                [sys.executable, "-m", "inference.engine.kernels.build"],
                cwd=self.root, check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        super().start(timeout)
        self.make_user("bench", "bench-password-1")
        self.key = self.make_key("bench", max_concurrent=1024, rate_limit_per_minute=1000000)
        return self

    def stop(self, timeout: float = 20) -> None:
        super().stop(timeout)
        # The KV blocks its requests wrote back to the tier go with it.
        url = self.env.get("ENGINE_KV_TIER_URL", DEFAULT_TIER_URL)
        if url:
            drop_namespace(url, self.env["ENGINE_KV_TIER_NAMESPACE"])


POOL_SETTING = "ENGINE_KV_CACHE_MEMORY_MB"
TIER_SETTING = "ENGINE_KV_TIER_MAX_MB"


def equal_pools(servers: int, settings: list[dict[str, str]]) -> dict[str, str]:
    """The KV pool each of `servers` of ours running side by side gets where none of their
    `settings` sizes it: an equal share of what one alone may take (KV_MEMORY_SHARE of the
    memory available now). Unsized, each would take its share of what the ones started
    before it left: unequal pools, whose last variants preempt sooner, and together most
    of the machine's memory, whose page cache then thrashes and stalls steps for seconds.

    Their Redis KV tier caps likewise: one Redis holds every server's blocks, and four
    servers at the default cap each (2 GB) filled it to 7 GB beside their pools and
    llama-server's, until the kernel killed Redis for memory (a 24 GB machine, 64 chats)."""
    if servers < 2:
        return {}
    out = {}
    if not any(POOL_SETTING in s for s in settings):
        share = KV_MEMORY_SHARE * available_memory(torch.device("cpu")) / servers
        out[POOL_SETTING] = str(int(share) >> 20)
    if not any(TIER_SETTING in s for s in settings):
        out[TIER_SETTING] = str(max(1, EngineConfig.kv_tier_max_mb // servers))
    return out


def cpu_model() -> str:
    """The CPU as lscpu names it, with the vector extensions the kernels care about."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name in ("", platform.machine()):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
    return f"{name}, {os.cpu_count()} CPUs, {' '.join(f for f in wanted if f in flags)}"


def settings(ap: argparse.ArgumentParser, pairs: list[str]) -> dict[str, str]:
    """A variant's or --env's KEY=VALUE pairs as a dict; anything else is a usage error."""
    bad = [kv for kv in pairs if "=" not in kv]
    if bad:
        ap.error(f"settings are KEY=VALUE, not {' '.join(bad)}")
    return dict(kv.split("=", 1) for kv in pairs)
