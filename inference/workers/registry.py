"""Who is serving: workers' heartbeats and sessions' affinity, as Redis keys.

    <ns>:worker:<id>        JSON entry (channel, load, model, ...), expires after
                            dead_after_s unless the worker beats again: alive == exists
    <ns>:workers            set of worker ids ever seen (pruned when their entry is gone)
    <ns>:affinity:<model>:<session>
                            the worker that served the session last with that model
                            (holds its KV)
    <ns>:prefix-affinity:<digest>
                            the same for a request without a session, keyed by a digest
                            of its model and its prompt's first blocks (remote.prefix_keys)

Each worker restarts with a new `incarnation`, so a restarted worker that reuses its id
(a container's hostname and pid 1) is not mistaken for the one that died.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

AFFINITY_TTL_S = 3600


@dataclass
class WorkerInfo:
    id: str
    channel: str
    incarnation: str
    model: str = ""
    # The folder it loaded (a web process reads the model's tokenizer from it), and when
    # that folder's config was written (/v1/models' `created`).
    model_path: str = ""
    model_created: int = 0
    host: str = ""
    max_model_len: int | None = None
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    # The requests it is serving: a web process ends one its worker no longer lists.
    requests: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    # Stopping (SIGTERM): it beats on while it finishes its replies, so the web side does
    # not count them lost, but no new request is routed to it.
    draining: bool = False

    @property
    def load(self) -> int:
        return self.running + self.waiting

    def as_json(self) -> str:
        return json.dumps(self.__dict__, default=str)

    @classmethod
    def from_json(cls, raw: bytes | str) -> WorkerInfo:
        d = json.loads(raw)
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def summary(self) -> dict[str, Any]:
        """The per-worker load the dashboard and /api/engine show."""
        return {
            "id": self.id,
            "model": self.model,
            "running": self.running,
            "waiting": self.waiting,
            "kv_usage": round(self.kv_usage, 4),
            "max_model_len": self.max_model_len,
        }


class Keys:
    def __init__(self, namespace: str) -> None:
        self.ns = namespace
        self.workers = f"{namespace}:workers"

    def worker(self, worker_id: str) -> str:
        return f"{self.ns}:worker:{worker_id}"

    def affinity(self, session_id: str, model: str = "") -> str:
        return f"{self.ns}:affinity:{model}:{session_id}"

    def prefix_affinity(self, digest: str) -> str:
        return f"{self.ns}:prefix-affinity:{digest}"


def _parse(ids: list[str], raws: list[Any]) -> tuple[list[WorkerInfo], list[str]]:
    live, gone = [], []
    for wid, raw in zip(ids, raws, strict=True):
        if raw is None:
            gone.append(wid)
        else:
            live.append(WorkerInfo.from_json(raw))
    return live, gone


def _ids(members: Any) -> list[str]:
    return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)


class Registry:
    """Async access (redis.asyncio client) for workers and the web side's event loop."""

    def __init__(self, redis: Any, namespace: str, dead_after_s: float) -> None:
        self.redis = redis
        self.keys = Keys(namespace)
        self.dead_after_ms = max(1, int(dead_after_s * 1000))

    async def beat(self, info: WorkerInfo) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.worker(info.id), info.as_json(), px=self.dead_after_ms)
        pipe.sadd(self.keys.workers, info.id)
        await pipe.execute()

    async def remove(self, worker_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(self.keys.worker(worker_id))
        pipe.srem(self.keys.workers, worker_id)
        await pipe.execute()

    async def live_workers(self) -> list[WorkerInfo]:
        return (await self.routing(None))[0]

    async def routing(
        self, session_id: str | None, prefix: list[str] | tuple[str, ...] = (), model: str = ""
    ) -> tuple[list[WorkerInfo], str | None]:
        """The live workers, and the worker the session was served by last with `model`;
        without a session, the worker that served the longest of these prompt-prefix
        digests (the last found in `prefix`, which runs from the shortest prefix to the
        longest). Two round trips."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.smembers(self.keys.workers)
        if session_id:
            pipe.get(self.keys.affinity(session_id, model))
        elif prefix:
            pipe.mget([self.keys.prefix_affinity(d) for d in prefix])
        members, *found = await pipe.execute()
        ids = _ids(members)
        if not ids:
            return [], None
        live, gone = _parse(ids, await self.redis.mget([self.keys.worker(i) for i in ids]))
        if gone:
            await self.redis.srem(self.keys.workers, *gone)
        home = None
        if found and session_id:
            home = found[0]
        elif found:
            home = next((h for h in reversed(found[0]) if h is not None), None)
        return live, home.decode() if isinstance(home, bytes) else home

    async def incarnations(self, worker_ids: list[str]) -> dict[str, str | None]:
        """Each worker's current incarnation, None for a worker that is gone."""
        raws = await self.redis.mget([self.keys.worker(i) for i in worker_ids])
        return {
            wid: None if raw is None else WorkerInfo.from_json(raw).incarnation
            for wid, raw in zip(worker_ids, raws, strict=True)
        }

    async def set_affinity(self, session_id: str, worker_id: str, model: str = "") -> None:
        await self.redis.set(self.keys.affinity(session_id, model), worker_id, ex=AFFINITY_TTL_S)

    async def set_prefix_affinity(self, digest: str, worker_id: str) -> None:
        await self.redis.set(self.keys.prefix_affinity(digest), worker_id, ex=AFFINITY_TTL_S)


def live_workers_sync(redis: Any, namespace: str) -> list[WorkerInfo]:
    """The same read with a synchronous client (stats() runs outside the event loop)."""
    keys = Keys(namespace)
    ids = _ids(redis.smembers(keys.workers))
    if not ids:
        return []
    return _parse(ids, redis.mget([keys.worker(i) for i in ids]))[0]
