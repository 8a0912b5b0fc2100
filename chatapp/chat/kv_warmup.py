"""Upkeep of the Redis KV tier, run as a periodic offline job (chatapp.observability.tasks).

1. Report the tier's size (entries, bytes) and keep its books straight: entries whose TTL
   ran out leave their last-use and size records behind; those are dropped, and the size
   cap is enforced again (inference.engine.kv_tier.upkeep).
2. Warm the tier with the system prompts conversations use most: each is prefilled once by
   the serving engine (one greedy token; never an engine of this job's own: in embedded
   mode the web process runs this job, in distributed mode it goes through the engine
   workers, docs/titles.md), which writes its full KV blocks back to Redis, so a new
   conversation with that prompt starts warm on any worker, even one that just started.
   Prefix reuse is scoped by owner (docs/kv-tier.md, "Whose blocks"): the server's default
   system prompt is public and is warmed once, shared by everyone; any other system prompt
   is one user's text and is warmed in that user's scope, for that user only.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from django.conf import settings
from django.db.models import Count

from chatapp.chat.models import Conversation
from chatapp.jobs.models import Job
from inference.client import get_engine_client, prefix_cache_salt
from inference.engine import SamplingParams
from inference.engine.kv_tier.redaction import redacted
from inference.engine.kv_tier.upkeep import upkeep_url

log = logging.getLogger(__name__)


def most_used_system_prompts(limit: int) -> list[tuple[str, int, int | None]]:
    """(system prompt, conversations, owner), most conversations first. The server's default
    prompt counts for everyone at once (owner None: it is warmed shared); another prompt
    counts per user, as only its owner's conversations can reuse its warm blocks."""
    default = str(settings.CHAT_DEFAULTS.get("system_prompt", ""))
    with_prompt = Conversation.objects.exclude(system_prompt="")
    found: list[tuple[str, int, int | None]] = []
    if default.strip():
        n = with_prompt.filter(system_prompt=default).count()
        if n:
            found.append((default, n, None))
    rows = (
        with_prompt.exclude(system_prompt=default)
        .values("owner_id", "system_prompt")
        .annotate(n=Count("id"))
        .order_by("-n", "system_prompt", "owner_id")[:limit]
    )
    found += [(r["system_prompt"], r["n"], r["owner_id"]) for r in rows]
    found.sort(key=lambda row: -row[1])
    return found[:limit]


def warm(prompts: list[tuple[str, int | None]]) -> list[dict[str, Any]]:
    """Prefill each (prompt, owner)'s system turn on the engine, in the owner's cache scope
    (None: shared); what each cost."""
    client = get_engine_client()
    sampling = SamplingParams(max_tokens=1, temperature=0.0)

    async def one(text: str, owner: int | None) -> dict[str, Any]:
        # The system turn alone, as every conversation with this prompt starts.
        prompt = client.system_prompt(text)
        salt = None if owner is None else prefix_cache_salt(owner)
        started = time.perf_counter()
        last = None
        rid = f"warm-{uuid.uuid4().hex}"
        # replay=False: a reply from the response cache would warm nothing.
        stream = client.stream(prompt, sampling, request_id=rid, cache_salt=salt, replay=False)
        async for delta in stream:
            last = delta
        m = last.figures if last is not None else None
        return {
            "prompt_tokens": prompt.length or 0,
            "cached_memory": m.cached_tokens if m else 0,
            "cached_redis": int(getattr(m, "cached_tokens_redis", 0) or 0) if m else 0,
            "seconds": round(time.perf_counter() - started, 3),
        }

    async def all_of_them() -> list[dict[str, Any]]:
        return [await one(p, owner) for p, owner in prompts]

    return asyncio.run(all_of_them())


def run() -> dict[str, Any]:
    """One upkeep pass; the result is stored with the job and shown on the dashboard."""
    cfg = settings.ENGINE
    url = str(cfg["KV_TIER_URL"] or "")
    if not url or cfg["MODE"] == "upstream":  # an upstream server keeps its own cache
        return {"enabled": False}
    report: dict[str, Any] = {"enabled": True, "url": redacted(url)}
    try:
        report.update(
            upkeep_url(
                url,
                namespace=str(cfg["KV_TIER_NAMESPACE"]),
                max_mb=int(cfg["KV_TIER_MAX_MB"]),
            )
        )
    except Exception as exc:  # Redis away: say so in the job's result, do not crash beat
        log.warning("KV tier upkeep: Redis at %s did not answer: %s", redacted(url), exc)
        report["error"] = f"{type(exc).__name__}: {exc}"
        return report
    prompts = most_used_system_prompts(int(settings.KV_TIER_WARM_PROMPTS))
    costs = warm([(text, owner) for text, _, owner in prompts])
    report["warmed"] = [
        {"conversations": n, "chars": len(text), "shared": owner is None, **cost}
        for (text, n, owner), cost in zip(prompts, costs, strict=True)
    ]
    return report


def upkeep_job(job: Job) -> dict[str, Any]:
    """One pass as a Job (kind kv_tier): its report is the Job's result."""
    report = run()
    Job.objects.filter(pk=job.pk).update(result=report)
    if report.get("error"):
        raise RuntimeError(report["error"])
    return report
