"""ENGINE_MODE=upstream: the chat app in front of another OpenAI-compatible server —
here a second instance of this app, started by the test on another port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.servers import PASSWORD, chat_through_the_socket
from tools.live_server import LiveServer


@pytest.fixture(scope="module")
def front(
    tmp_path_factory: pytest.TempPathFactory, server: LiveServer, api_key: str
) -> Iterator[LiveServer]:
    srv = LiveServer(
        tmp_path_factory.mktemp("front"),
        "/nonexistent-model-folder",  # proves the front never loads a model of its own
        ENGINE_MODE="upstream",
        ENGINE_UPSTREAM_URL=server.url + "/v1",
        ENGINE_UPSTREAM_API_KEY=api_key,
    ).start()
    srv.make_user("apiuser", PASSWORD)
    yield srv
    srv.stop()


def test_the_front_serves_the_upstream_model_over_its_own_api(
    front: LiveServer, model_id: str
) -> None:
    api = openai.OpenAI(
        base_url=front.url + "/v1", api_key=front.make_key("apiuser"), max_retries=0
    )
    assert [m.id for m in api.models.list().data] == [model_id]
    stream = api.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens >= 1


def test_the_chat_ui_socket_streams_through_the_upstream(
    front: LiveServer, server: LiveServer
) -> None:
    done = chat_through_the_socket(front, max_tokens=12)
    # Figures are measured at the app side.
    assert done["figures"]["ttft_ms"] > 0 and done["figures"]["output_tokens"] >= 1


def test_upstream_refusals_become_clear_errors(front: LiveServer, model_id: str) -> None:
    api = openai.OpenAI(
        base_url=front.url + "/v1", api_key=front.make_key("apiuser"), max_retries=0
    )
    with pytest.raises(openai.BadRequestError):
        api.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "word " * 5000}], max_tokens=4
        )
    assert httpx.get(front.url + "/healthz").status_code == 200


def test_tiny_model_dir_is_what_the_upstream_serves(tiny_model_dir: Path, model_id: str) -> None:
    assert tiny_model_dir.name == model_id


def test_the_front_keeps_its_users_apart_in_the_upstream_s_prefix_cache(
    front: LiveServer, model_id: str
) -> None:
    # All the front's users reach the upstream through one key: the per-user cache_salt
    # the front sends is what keeps them apart there.
    def cached(username: str) -> int:
        api = openai.OpenAI(
            base_url=front.url + "/v1", api_key=front.make_key(username), max_retries=0
        )
        reply = api.chat.completions.create(
            model=model_id,
            messages=[{"role": "user", "content": "A line only its writer may reuse. " * 8}],
            max_tokens=1,
            temperature=0,
        )
        return reply.usage.prompt_tokens_details.cached_tokens

    for name in ("front-alice", "front-bob"):
        front.make_user(name, PASSWORD)
    assert cached("front-alice") == 0
    assert cached("front-bob") == 0
    assert cached("front-alice") >= 48
