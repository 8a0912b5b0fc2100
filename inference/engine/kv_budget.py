"""How large the paged KV pool is when no size is set: from the model and the machine.

The pool is zeroed whole at start and held from then on (taken page by page as it filled,
a prompt's step paid up to 40 ms of page faults per 256 tokens), so its size is decided
once, here: every sequence the scheduler may run at its full context, where that fits in a
share of the memory still available once the model is loaded; never more than that share.
A pool too small evicts the prefixes of users about to come back, and preempts under load.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

# The share of the memory available after the weights that an unsized pool may take: the
# rest stays for the web side, the database, a second model, and the step's activations.
KV_MEMORY_SHARE = 0.4
MIN_POOL_BYTES = 64 << 20


def auto_pool_bytes(token_bytes: int, tokens_wanted: int, available: int) -> int:
    """The pool for `tokens_wanted` tokens of `token_bytes` each, within KV_MEMORY_SHARE of
    `available` bytes (but never under MIN_POOL_BYTES)."""
    wanted = token_bytes * tokens_wanted
    return max(MIN_POOL_BYTES, min(wanted, int(KV_MEMORY_SHARE * available)))


def available_memory(device: torch.device) -> int:
    """Bytes a new allocation can take now: on CUDA the device's free memory; on a CPU the
    kernel's MemAvailable, or the room left under the process's cgroup limit (a container's
    memory limit) where that is less, as exceeding it gets the process killed."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    free = [_meminfo_available()]
    room = _cgroup_room()
    if room is not None:
        free.append(room)
    return min(free)


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def _cgroup_room(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Limit minus usage of this process's memory cgroup (v2, else v1); None when unlimited."""
    pairs = (
        (root / "memory.max", root / "memory.current"),
        (root / "memory" / "memory.limit_in_bytes", root / "memory" / "memory.usage_in_bytes"),
    )
    for limit_file, usage_file in pairs:
        try:
            limit = limit_file.read_text().strip()
            usage = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "unlimited" as ~2^63
            return None
        return max(0, int(limit) - usage)
    return None
