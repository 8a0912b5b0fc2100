"""A GGUF file served as people serve one: CHATAPP_MODEL names the file (or a folder
holding it), and the chat, the OpenAI API and /v1/models answer under the file's name
without `.gguf`. A real server over a Q4_K_M file made by llama.cpp's own tools."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference.catalog import created_at, is_model_path, model_name
from tests.gguf_files import TinyGGUFs, tiny_ggufs
from tools.live_server import LiveServer

PASSWORD = "a-long-test-password"


@pytest.fixture(scope="module")
def ggufs(real_model_path: Path) -> Iterator[TinyGGUFs]:
    files = tiny_ggufs(real_model_path)
    yield files
    files.close()


def test_a_gguf_file_is_served_under_its_name_without_the_extension(tmp_path: Path) -> None:
    file = tmp_path / "Qwen3-0.6B.Q4_K_M.gguf"
    file.write_bytes(b"GGUF")
    os.utime(file, (1_700_000_000, 1_700_000_000))
    assert model_name(file) == "Qwen3-0.6B.Q4_K_M"
    assert is_model_path(str(file)) and is_model_path(str(tmp_path))
    assert not is_model_path(str(tmp_path / "notes.txt"))
    # The file holds the config: it dates the model, named or in a folder of its own.
    assert created_at(str(file)) == created_at(str(tmp_path)) == 1_700_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, ggufs: TinyGGUFs) -> Iterator[LiveServer]:
    srv = LiveServer(
        tmp_path_factory.mktemp("gguf-server"),
        ggufs.file("Q4_K_M"),
        ENGINE_KV_CACHE_MEMORY_MB="32",
    ).start()
    srv.make_user("gguf", PASSWORD)
    yield srv
    srv.stop()


def _frames_until(sock: Any, *types: str) -> list[dict[str, Any]]:
    frames = []
    while True:
        frames.append(json.loads(sock.recv(timeout=60)))
        if frames[-1]["type"] in types:
            return frames


@pytest.mark.slow
def test_a_chat_over_the_websocket_answers_from_a_gguf_file(server: LiveServer) -> None:
    with server.chat_socket("gguf", PASSWORD) as sock:
        sock.send(json.dumps({"type": "send", "conversation_id": None, "text": "Hello",
                              "settings": {"max_tokens": 8, "temperature": 0}}))  # fmt: skip
        frames = _frames_until(sock, "done", "error")
    done = frames[-1]
    assert done["type"] == "done" and done["message"]["status"] == "complete", frames
    assert any(f["type"] == "delta" for f in frames)


@pytest.mark.slow
def test_the_openai_api_lists_and_answers_with_the_gguf_model(
    server: LiveServer, ggufs: TinyGGUFs
) -> None:
    headers = {"Authorization": f"Bearer {server.make_key('gguf')}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=120) as api:
        listed = api.get("/v1/models").json()["data"]
        assert [m["id"] for m in listed] == ["tiny-llama-256.Q4_K_M"]
        assert listed[0]["created"] == created_at(str(ggufs.file("Q4_K_M")))
        answer = api.post(
            "/v1/chat/completions",
            json={"model": "tiny-llama-256.Q4_K_M", "max_tokens": 8, "temperature": 0,
                  "messages": [{"role": "user", "content": "Hello"}]},
        )  # fmt: skip
    assert answer.status_code == 200, answer.text
    reply = answer.json()
    assert reply["model"] == "tiny-llama-256.Q4_K_M"
    assert reply["usage"]["completion_tokens"] >= 1
