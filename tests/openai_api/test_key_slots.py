"""An API key at its concurrency cap may send its next request the moment a response ends:
the slot is given back (in this process and in Redis's shared leases) before the last
byte, not after the client has read it. Real engine on the tiny model; in the PostgreSQL
pass, real Redis leases (chatapp/slots.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from channels.db import database_sync_to_async

from inference.backends.embedded import EmbeddedClient

pytestmark = pytest.mark.django_db(transaction=True)


class HeldStream:
    """One streamed request driven through the ASGI app by hand: the app is held inside
    its `send` of the chunk holding `until` (the client has it, the app has not gone on)."""

    def __init__(self, app: Any, path: str, body: dict[str, Any], key: str, until: bytes) -> None:
        self.app, self.until = app, until
        self.scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 80),
            "headers": [
                (b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                (b"authorization", f"Bearer {key}".encode()),
            ],
        }  # fmt: skip
        self.body = json.dumps(body).encode()
        self.status: int | None = None
        self.chunks: list[bytes] = []
        self.reached = asyncio.Event()
        self.go_on = asyncio.Event()
        self.ended = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self.body is not None:
            body, self.body = self.body, None  # type: ignore[assignment]
            return {"type": "http.request", "body": body, "more_body": False}
        await self.ended.wait()  # the client stays connected until the response ends
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.chunks.append(message.get("body", b""))
            if self.until in self.chunks[-1]:
                self.reached.set()
                await self.go_on.wait()

    async def run(self) -> None:
        try:
            await self.app(self.scope, self.receive, self.send)
        finally:
            self.ended.set()


async def test_a_key_at_its_cap_may_send_again_the_moment_a_stream_ends(
    make_user: Any, tiny_engine: EmbeddedClient
) -> None:
    from chatapp.asgi import application
    from chatapp.openai_api.keys import create_key

    user = await database_sync_to_async(make_user)("apiuser")
    key, raw = await database_sync_to_async(create_key)(user, "test")
    key.max_concurrent = 1
    await database_sync_to_async(key.save)()
    body = {"model": tiny_engine.model_name, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://127.0.0.1",
        headers={"Authorization": f"Bearer {raw}"}, timeout=60,
    ) as http:  # fmt: skip
        for path in ("/v1/completions", "/v1/chat/completions"):
            first = {**body, "stream": True}
            if path.endswith("chat/completions"):
                first = {**first, "messages": [{"role": "user", "content": "Hello"}]}
                del first["prompt"]
            held = HeldStream(application, path, first, raw, b"data: [DONE]")
            task = asyncio.create_task(held.run())
            try:
                await asyncio.wait_for(held.reached.wait(), 60)
                assert held.status == 200
                # The client has the end of the stream: its next request is served.
                second = await http.post("/v1/completions", json=body)
                assert second.status_code == 200, second.text
            finally:
                held.go_on.set()
                await asyncio.wait_for(task, 60)
