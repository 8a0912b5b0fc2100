"""What streaming OpenAI clients measure against a running server.

    python -m inference.bench.api_clients --url http://127.0.0.1:8000/v1 --key sk-chat-... \\
        --concurrency 1 16 --turns 4 --max-tokens 64

Each client holds a conversation: every turn streams a chat completion with the whole
history so far (its earlier questions and the server's own answers) plus a new question,
as a chat UI does. It records the time to the first content chunk (TTFT), the time per
output token after the first (TPOT: from first to last chunk over tokens - 1), and the
tokens the server reports; where the server reports its own per-token time in the stream
(llama-server's `timings`), that too. Prints a table and, with --json, a file.

Workloads (`--workload`): `chat-mix` (chat_workload.py: short and long questions and a few
pasted documents, different conversations for each `--seed`; the default), `chat` (eight
short questions, then follow-ups), `rewrite` (the first turn asks to repeat or edit a
passage given in the prompt: output that prompt lookup can guess) and `story` (open-ended
stories: output it cannot) and `json-schema` (each turn asks for a record as a JSON
object: every reply is parsed and validated against SCHEMA, and counted; the request
carries the schema as `response_format` where `sampling` holds RESPONSE_FORMAT). Tokens
are those each server reports it generated (its `usage`; the content chunks where it
reports none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any, cast

import jsonschema

from inference.bench.chat_workload import Conversation, conversations, messages
from inference.bench.spread import pct

QUESTIONS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a KV cache is.",
    "Give me three tips for sleeping better.",
    "How do plants make food from sunlight?",
    "Tell me a fun fact about octopuses.",
    "What should I pack for a weekend hike?",
    "Summarise the story of Cinderella.",
]
FOLLOW_UPS = ["Tell me more.", "Can you make it shorter?", "Why is that?", "Give an example."]
PASSAGE = (
    "The old lighthouse stood at the end of the harbour wall for nearly two hundred years. "
    "Every evening the keeper climbed the one hundred and twelve steps to light the lamp, "
    "and every morning he climbed them again to put it out. Ships coming home in a storm "
    "looked for its beam before anything else, and the town grew up around the promise "
    "that someone would always be there to keep it burning."
)
REWRITES = [
    f"Repeat the following passage exactly, word for word.\n\n{PASSAGE}",
    f"Rewrite the following passage, replacing 'lighthouse' with 'tower'.\n\n{PASSAGE}",
    "Correct the spelling in this passage and return it in full.\n\n"
    + PASSAGE.replace("harbour", "harbuor").replace("morning", "mornig"),
    f"Rewrite the following passage in the present tense.\n\n{PASSAGE}",
]
REWRITE_FOLLOW_UPS = [
    "Now repeat your answer exactly.",
    "Repeat it once more, replacing 'keeper' with 'guardian'.",
    "Write it again, word for word.",
    "Repeat the original passage again.",
]
STORIES = [
    "Write a short story about a robot who learns to paint.",
    "Tell me a story about a dragon who is afraid of the dark.",
    "Write a story about two friends lost in a forest.",
    "Tell me a bedtime story about a little cloud.",
]
STORY_FOLLOW_UPS = ["Continue the story.", "What happens next?", "Tell me another one."]
JSON_SCHEMA = "json-schema"
# The json-schema workload's record: a nested object, an array of strings, an enum and
# integers with bounds, all of which both servers' grammars enforce.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 60},
        "kind": {"enum": ["book", "film", "album", "game"]},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "rating": {"type": "integer", "minimum": 1, "maximum": 10},
        "tags": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 24},
            "minItems": 1,
            "maxItems": 5,
        },
        "creator": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 40},
                "country": {"type": "string", "minLength": 1, "maxLength": 40},
            },
            "required": ["name", "country"],
            "additionalProperties": False,
        },
    },
    "required": ["title", "kind", "year", "rating", "tags", "creator"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "record", "schema": SCHEMA, "strict": True},
}
_RECORD = (
    "Reply with only a JSON object with the keys title, kind (book, film, album or game), "
    "year (1900 to 2030), rating (1 to 10), tags (one to five short words) and creator "
    "(an object with name and country)."
)
RECORDS = [
    f"Invent {thing}. {_RECORD}"
    for thing in (
        "a science fiction novel", "a jazz album", "a video game about farming",
        "a documentary film about the sea", "a fantasy book for children",
        "a rock album from the seventies", "a puzzle game", "a romantic comedy film",
    )
]  # fmt: skip
RECORD_FOLLOW_UPS = [
    f"Now another one, different from the last. {_RECORD}",
    f"One more, by someone from another country. {_RECORD}",
    f"Another one, from a different decade. {_RECORD}",
]
WORKLOADS = {
    "chat": (QUESTIONS, FOLLOW_UPS),
    "rewrite": (REWRITES, REWRITE_FOLLOW_UPS),
    "story": (STORIES, STORY_FOLLOW_UPS),
    JSON_SCHEMA: (RECORDS, RECORD_FOLLOW_UPS),
}
# The workloads whose conversations come from chat_workload.py.
CHAT_MIX = "chat-mix"
WORKLOAD_NAMES = (CHAT_MIX, *WORKLOADS)


def workload_conversations(workload: str, n: int, turns: int, seed: int = 0) -> list[Conversation]:
    """The user turns of n clients' conversations."""
    if workload == CHAT_MIX:
        return conversations(n, turns, seed)
    firsts, follow_ups = WORKLOADS[workload]
    return [
        Conversation(workload, tuple(
            firsts[i % len(firsts)] if t == 0 else follow_ups[(i + t) % len(follow_ups)]
            for t in range(turns)
        ))
        for i in range(n)
    ]  # fmt: skip


def schema_check(reply: str) -> tuple[bool, bool]:
    """(parses, validates): whether a reply is JSON, and whether it is a SCHEMA record."""
    try:
        value = json.loads(reply)
    except ValueError:
        return False, False
    return True, jsonschema.Draft202012Validator(SCHEMA).is_valid(value)


async def one_client(
    client: Any,
    model: str,
    conv: Conversation,
    max_tokens: int,
    sampling: dict[str, Any],
) -> list[dict[str, Any]]:
    # Fields beyond OpenAI's own (ignore_eos) travel in the body as they are.
    extra = {k: sampling[k] for k in ("ignore_eos",) if k in sampling}
    sampling = {k: v for k, v in sampling.items() if k not in extra}
    out: list[dict[str, Any]] = []
    replies: list[str] = []
    for turn in range(len(conv.turns)):
        start = time.perf_counter()
        first = last = None
        tokens = chunks = prompt_tokens = 0
        finish = ""
        server_tpot = None
        text: list[str] = []
        stream = await client.chat.completions.create(
            model=model,
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=max_tokens,
            messages=messages(conv, turn, replies),
            extra_body=extra or None,
            **sampling,
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                last = time.perf_counter()
                first = first or last
                chunks += 1
                text.append(chunk.choices[0].delta.content)
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
                prompt_tokens = chunk.usage.prompt_tokens
            timings = (chunk.model_extra or {}).get("timings")
            if isinstance(timings, dict) and timings.get("predicted_per_token_ms"):
                server_tpot = timings["predicted_per_token_ms"] / 1000
        replies.append("".join(text))
        if first is None or last is None:
            continue
        # A server that reports no usage: its content chunks, about a token each.
        tokens = tokens or chunks
        tpot = (last - first) / (tokens - 1) if tokens > 1 and last > first else float("nan")
        row = {"ttft": first - start, "tokens": tokens, "tpot": tpot, "e2e": last - start,
               "prompt_tokens": prompt_tokens, "capped": finish == "length",
               "turn": turn}  # fmt: skip
        if server_tpot is not None:
            row["server_tpot"] = server_tpot
        if conv.kind == JSON_SCHEMA:
            row["parsed"], row["valid"] = schema_check(replies[-1])
        out.append(row)
    return out


async def run_level(
    url: str,
    key: str,
    model: str,
    concurrency: int,
    turns: int,
    max_tokens: int,
    sampling: dict[str, Any] | None = None,
    workload: str = CHAT_MIX,
    seed: int = 0,
) -> dict[str, Any]:
    """c clients, each holding one conversation of `turns` turns (the workload's, drawn
    from `seed`), all at once; the figures of the level."""
    import httpx
    from openai import AsyncOpenAI

    # A new connection per request: llama-server's HTTP library closes a kept-alive
    # connection after a few requests, and a client reusing it then fails the request.
    http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0), timeout=600)
    # openai 3 still takes an httpx client (its legacy path); its types name httpx2 only.
    client = AsyncOpenAI(
        base_url=url, api_key=key, max_retries=0, timeout=600, http_client=cast(Any, http)
    )
    started = time.perf_counter()
    convs = workload_conversations(workload, concurrency, turns, seed)
    results = await asyncio.gather(
        *(one_client(client, model, conv, max_tokens, sampling or {}) for conv in convs)
    )
    wall = time.perf_counter() - started
    await client.close()
    rows = [r for rs in results for r in rs]
    ttft = [r["ttft"] for r in rows]
    tpot = [r["tpot"] for r in rows if r["tpot"] == r["tpot"]]
    server_tpot = [r["server_tpot"] for r in rows if "server_tpot" in r]
    tokens = sum(r["tokens"] for r in rows)
    out = {
        "concurrency": concurrency,
        "requests": len(rows),
        "tok_s": round(tokens / wall, 1),
        "tokens": tokens,
        "seconds": round(wall, 3),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "capped": sum(r["capped"] for r in rows),
        "ttft_p50_ms": round(statistics.median(ttft) * 1000, 1),
        "ttft_p90_ms": round(pct(ttft, 0.9) * 1000, 1),
        # The first turns arrive together (every client starts at once); the later ones
        # arrive one by one as each client's previous reply ends: the steady state.
        **{
            f"ttft_{part}_p90_ms": round(pct(t, 0.9) * 1000, 1)
            for part, t in (
                ("first", [r["ttft"] for r in rows if r["turn"] == 0]),
                ("later", [r["ttft"] for r in rows if r["turn"] > 0]),
            )
            if t
        },
        "tpot_p50_ms": round(statistics.median(tpot) * 1000, 2) if tpot else None,
    }
    if server_tpot:
        # The server's own time per token (llama-server's timings), without the client's.
        out["server_tpot_p50_ms"] = round(statistics.median(server_tpot) * 1000, 2)
    if workload == JSON_SCHEMA:
        # Of the replies asked for (a reply with no content is in none of `requests`), those
        # that parse as JSON and those that validate against the schema.
        out["asked"] = len(convs) * turns
        out["parsed"] = sum(r["parsed"] for r in rows)
        out["valid"] = sum(r["valid"] for r in rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", required=True, help="the server's /v1 base URL")
    ap.add_argument("--key", required=True)
    ap.add_argument("--model", default="", help="default: the first model the server lists")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--turns", type=int, default=4, help="turns per conversation (client)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--workload", choices=WORKLOAD_NAMES, default=CHAT_MIX)
    ap.add_argument("--seed", type=int, default=0, help="the chat-mix conversations' seed")
    ap.add_argument("--schema", action="store_true", help="send SCHEMA as response_format")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from openai import OpenAI

    model = args.model or OpenAI(base_url=args.url, api_key=args.key).models.list().data[0].id
    sampling: dict[str, Any] = {"temperature": args.temperature, "top_p": 0.95}
    if args.schema:
        sampling["response_format"] = RESPONSE_FORMAT
    levels = []
    for c in args.concurrency:
        level = run_level(
            args.url, args.key, model, c, args.turns, args.max_tokens, sampling, args.workload,
            args.seed,
        )  # fmt: skip
        levels.append(asyncio.run(level))
    cols = list(levels[0])
    print(" | ".join(cols))
    for row in levels:
        print(" | ".join(str(row[c]) for c in cols))
    if args.json:
        args.json.write_text(json.dumps({"model": model, "levels": levels}, indent=2))


if __name__ == "__main__":
    main()
