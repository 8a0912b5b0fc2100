"""ENGINE_MODE=upstream: the chat app in front of another OpenAI-compatible server —
here a second instance of this app, started by the test on another port."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from inference.backends.upstream import UpstreamRefusal, _error_for
from inference.engine import EngineError
from tests.servers import PASSWORD, chat_through_the_socket, started, users_code
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
    )
    started(srv, users_code("apiuser"))
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


def test_logprobs_and_sampling_extras_pass_through_the_front(
    front: LiveServer, model_id: str
) -> None:
    # This app as the upstream: OpenAI's completion logprobs shape (parallel lists) and
    # vLLM's name for the repetition penalty.
    api = openai.OpenAI(
        base_url=front.url + "/v1", api_key=front.make_key("apiuser"), max_retries=0
    )
    chat = api.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Hello"}], max_tokens=3,
        temperature=0, logprobs=True, top_logprobs=2,
        extra_body={"repetition_penalty": 1.3, "top_k": 5, "min_p": 0.01},
        frequency_penalty=0.5, presence_penalty=0.5, logit_bias={"0": -100},
    )  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    text = api.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=3, temperature=0,
        logprobs=2,
    )  # fmt: skip
    lp = text.choices[0].logprobs
    assert "".join(lp.tokens) == text.choices[0].text and len(lp.token_logprobs) == 3
    assert all(len(alternatives) == 2 for alternatives in lp.top_logprobs)


def test_tools_go_upstream_and_its_refusal_comes_back_as_a_400(
    front: LiveServer, model_id: str
) -> None:
    # This app says nothing of its templates: the tools go to it, and its 400 (the model's
    # template has no tool format) is the front's, with its words and param.
    api = openai.OpenAI(
        base_url=front.url + "/v1", api_key=front.make_key("apiuser"), max_retries=0
    )
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            api.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                tools=tools, tool_choice="required", stream=stream,  # type: ignore[arg-type]
            )  # fmt: skip
        error = caught.value.body
        assert isinstance(error, dict) and error["param"] == "tools", error
        assert model_id in error["message"] and "tools" in error["message"], error


def test_an_upstream_s_refusals_of_a_field_are_the_client_s_400s() -> None:
    # As llama-server, vLLM, TGI and FastAPI word them: never a 500 or a 503 here.
    llama = _error_for(400, json.dumps({"error": {
        "code": 400, "type": "invalid_request_error",
        "message": "Field 'n': Value must be between 1 <= value <= 1, but got 2"}}))  # fmt: skip
    assert isinstance(llama, UpstreamRefusal) and llama.param == "n"
    vllm = _error_for(400, json.dumps({"error": {
        "message": "top_k must be -1", "type": "BadRequestError", "param": "top_k"}}))  # fmt: skip
    assert isinstance(vllm, UpstreamRefusal) and vllm.param == "top_k"
    tgi = _error_for(422, json.dumps({"error": "`top_k` must be strictly positive"}))
    assert isinstance(tgi, UpstreamRefusal) and "top_k" in str(tgi) and tgi.param is None
    typed = _error_for(500, json.dumps({"error": {
        "message": "bad logit_bias", "type": "invalid_request_error"}}))  # fmt: skip
    assert isinstance(typed, UpstreamRefusal)
    assert type(_error_for(500, json.dumps({"error": {"message": "boom"}}))) is EngineError
    assert isinstance(_error_for(400, "<html>bad request</html>"), UpstreamRefusal)
