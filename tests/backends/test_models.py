"""Several models served at once, embedded (issue 17, item 2): CHATAPP_MODELS beside the
default model, one engine each in the process; /v1/models lists them, each request goes
to the model it names, a model nobody serves is a 404 `model_not_found`, and no cache
(prefix, Redis KV tier, response cache) ever hands one model's state to another."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from django.conf import settings
from django.test import override_settings

from inference.backends.embedded import EmbeddedClient
from inference.catalog import ModelSpec, created_at, parse_model_list, served_models
from inference.chat_template import Prompt
from inference.client import (
    EngineUnavailableError,
    ModelNotFoundError,
    get_engine_client,
    list_models,
    set_engine_client,
)
from inference.engine import SamplingParams
from inference.model_files import MODEL_NAME
from inference.response_cache import ResponseCache
from tests.engines import make_engine_client
from tests.servers import PASSWORD
from tests.tiny_model import build_tiny_llama
from tools.live_server import LiveServer

REDIS_URL = "redis://127.0.0.1:6379/4"
METRICS_TOKEN = "models-test-" + uuid.uuid4().hex


# --- the model list ---------------------------------------------------------------------


def test_a_model_list_names_each_folder_by_its_own_name_or_the_one_given() -> None:
    given = parse_model_list(" tiny=/models/tiny-llama , /models/Qwen2.5-0.5B-Instruct/,,")
    assert given == [
        ModelSpec("tiny", "/models/tiny-llama"),
        ModelSpec("Qwen2.5-0.5B-Instruct", "/models/Qwen2.5-0.5B-Instruct/"),
    ]
    assert parse_model_list("") == [] and parse_model_list(" , ") == []
    served = served_models("/models/SmolLM2-135M-Instruct", given)
    assert [s.name for s in served] == ["SmolLM2-135M-Instruct", "tiny", "Qwen2.5-0.5B-Instruct"]


def test_an_entry_naming_the_default_folder_names_the_default_and_keeps_it_first() -> None:
    served = served_models(
        "/models/SmolLM2-135M-Instruct",
        parse_model_list("tiny=/models/tiny,smol=/models/SmolLM2-135M-Instruct/"),
    )
    assert served == [
        ModelSpec("smol", "/models/SmolLM2-135M-Instruct"),
        ModelSpec("tiny", "/models/tiny"),
    ]


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("tiny=", "names no folder"),
        ("=/models/tiny", "must be 1-100 letters"),
        ("bad name=/models/tiny", "must be 1-100 letters"),
        ("-x=/models/tiny", "starting with a letter or digit"),
    ],
)
def test_a_malformed_entry_is_refused_saying_why(raw: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_model_list(raw)


def test_two_models_of_one_name_or_one_folder_twice_are_refused() -> None:
    with pytest.raises(ValueError, match="two models are named 'a'"):
        served_models("/m/default", parse_model_list("a=/m/one,a=/m/two"))
    with pytest.raises(ValueError, match="listed twice"):
        served_models("/m/default", parse_model_list("a=/m/one,b=/m/one/"))


def test_a_malformed_list_stops_the_process_at_start(tmp_path: Path) -> None:
    server = LiveServer(tmp_path, "/nowhere", CHATAPP_MODELS="bad name=/m/x")
    with pytest.raises(RuntimeError, match="must be 1-100 letters"):
        server.manage("check")


# --- the engines of an embedded process ------------------------------------------------


@pytest.fixture
def embedded_two(tmp_path: Path, tiny_model_dir: Path, real_model_dir: Path) -> Iterator[Path]:
    """Settings naming the tiny model (the default) and a twin (CHATAPP_MODELS), no engine
    made yet; the twin's folder."""
    twin = build_tiny_llama(tmp_path / "twin", real_model_dir, seed=1)
    engine = {
        **settings.ENGINE,
        "MODE": "embedded",
        "MODEL": str(tiny_model_dir),
        "MODELS": [ModelSpec("twin", str(twin))],
        "DTYPE": "float32",
        "KV_CACHE_MEMORY_MB": 16,
        "KV_TIER_URL": "",
    }
    set_engine_client(None)
    with override_settings(ENGINE=engine):
        try:
            yield twin
        finally:
            set_engine_client(None)


def test_each_model_gets_its_own_engine_on_first_use(
    embedded_two: Path, tiny_model_dir: Path
) -> None:
    listed = list_models()
    assert [(m.id, m.default, m.context_tokens) for m in listed] == [
        (tiny_model_dir.name, True, None),
        ("twin", False, None),
    ]
    assert listed[1].created == created_at(str(embedded_two))
    twin = get_engine_client("twin")
    assert twin.model_name == "twin" and twin.engine.config.model == str(embedded_two)
    assert get_engine_client("twin") is twin and get_engine_client() is not twin
    assert get_engine_client().engine.config.model == str(tiny_model_dir)
    assert [m.context_tokens for m in list_models()] == [2048, 2048]
    with pytest.raises(ModelNotFoundError) as missing:
        get_engine_client("gpt-4o")
    assert missing.value.served == sorted([tiny_model_dir.name, "twin"])


def test_tensor_parallel_splits_the_default_model_only(embedded_two: Path) -> None:
    split = override_settings(ENGINE={**settings.ENGINE, "TENSOR_PARALLEL_SIZE": 3})
    with split, pytest.raises(EngineUnavailableError, match="run_engine --model twin"):
        get_engine_client("twin")


# --- a server with two models: the default and the tiny one ------------------------------


@pytest.fixture(scope="module")
def two_models(
    tmp_path_factory: pytest.TempPathFactory, real_model_dir: Path, tiny_model_dir: Path
) -> Iterator[LiveServer]:
    srv = LiveServer(
        tmp_path_factory.mktemp("two-models"),
        real_model_dir,
        CHATAPP_MODELS=f"tiny={tiny_model_dir}",
        ENGINE_KV_CACHE_MEMORY_MB="64",
        METRICS_BEARER_TOKEN=METRICS_TOKEN,
    ).start()
    srv.make_user("apiuser", PASSWORD)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api(two_models: LiveServer) -> openai.OpenAI:
    key = two_models.make_key("apiuser")
    return openai.OpenAI(base_url=two_models.url + "/v1", api_key=key, max_retries=0)


def generated_tokens(server: LiveServer, model: str) -> float:
    """vllm:generation_tokens_total of one model, as /metrics says."""
    text = httpx.get(
        server.url + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    ).text
    for line in text.splitlines():
        if line.startswith("vllm:generation_tokens_total{") and f'model_name="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.slow  # the real default model beside the tiny one
def test_v1_models_lists_every_served_model_the_default_first(
    api: openai.OpenAI, real_model_dir: Path, tiny_model_dir: Path
) -> None:
    listed = api.models.list().data
    assert [m.id for m in listed] == [MODEL_NAME, "tiny"]
    assert {m.owned_by for m in listed} == {"chatapp"}
    assert [m.created for m in listed] == [
        created_at(str(real_model_dir)),
        created_at(str(tiny_model_dir)),
    ]
    tiny = api.models.retrieve("tiny").model_dump()
    # What the files hold, as extra fields beside OpenAI's four.
    assert tiny["id"] == "tiny" and tiny["architecture"] == "LlamaForCausalLM"
    assert tiny["weight_format"] == "safetensors fp32" and tiny["context_length"] > 0
    with pytest.raises(openai.NotFoundError) as missing:
        api.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found"


@pytest.mark.slow
def test_each_request_goes_to_the_engine_of_the_model_it_names(
    api: openai.OpenAI, two_models: LiveServer
) -> None:
    messages = [{"role": "user", "content": "Name a color."}]
    before = {m: generated_tokens(two_models, m) for m in (MODEL_NAME, "tiny")}
    for model in (MODEL_NAME, "tiny"):
        answer = api.chat.completions.create(
            model=model, messages=messages, max_tokens=6, temperature=0
        )
        assert answer.model == model and answer.usage and answer.usage.completion_tokens >= 1
        after = generated_tokens(two_models, model)
        assert after - before[model] == answer.usage.completion_tokens, model
    # Their context windows differ (the default's is what its 64 MB KV pool holds, the
    # tiny one's its 2,048 positions): a prompt between the two fits one model only.
    session = two_models.login("apiuser", PASSWORD)
    served = session.get("/api/models/").json()
    session.close()
    window = {m["id"]: m["context_tokens"] for m in served["models"]}
    assert served["default"] == MODEL_NAME and None not in window.values()
    small, large = sorted(window, key=window.get)
    assert window[small] < window[large]
    prompt = "cat " * ((window[small] + window[large]) // 2)
    with pytest.raises(openai.BadRequestError) as too_long:
        api.completions.create(model=small, prompt=prompt, max_tokens=1)
    assert too_long.value.code == "context_length_exceeded"
    fits = api.completions.create(model=large, prompt=prompt, max_tokens=1)
    assert fits.model == large and fits.usage and fits.usage.prompt_tokens > window[small]
    streamed = api.chat.completions.create(
        model="tiny", messages=messages, max_tokens=4, temperature=0, stream=True
    )
    assert {chunk.model for chunk in streamed} == {"tiny"}


@pytest.mark.slow
def test_a_model_nobody_serves_is_a_404_model_not_found_for_every_endpoint(
    api: openai.OpenAI, two_models: LiveServer
) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    calls = [
        lambda: api.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=2),
        lambda: api.chat.completions.create(
            model="gpt-4o", messages=messages, max_tokens=2, stream=True
        ),
        lambda: api.completions.create(model="tiny2", prompt="Hi", max_tokens=2),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        assert missing.value.code == "model_not_found"
        assert missing.value.body["param"] == "model"  # type: ignore[index]
    assert httpx.get(two_models.url + "/healthz").status_code == 200


# --- caches: two models of one shape share nothing --------------------------------------


async def reply(client: EmbeddedClient, ids: list[int], max_tokens: int = 8) -> tuple[Any, Any]:
    tokens, last = [], None
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    async for delta in client.stream(Prompt(token_ids=ids), sampling, cache_salt="owner"):
        tokens.extend(delta.token_ids)
        last = delta
    assert last is not None and last.finished and last.figures is not None
    return tokens, last.figures


@pytest.fixture
def kv_namespace() -> Iterator[str]:
    ns = f"test-models-kv-{uuid.uuid4().hex[:10]}"
    yield ns
    store = redis.Redis.from_url(REDIS_URL)
    keys = list(store.scan_iter(f"{ns}:*", count=1000))
    if keys:
        store.delete(*keys)
    store.close()


def test_two_models_of_one_shape_share_no_kv_and_no_replayed_reply(
    tmp_path: Path, tiny_model_dir: Path, real_model_dir: Path, kv_namespace: str
) -> None:
    """The tiny model and a twin with other weights (same layers, heads, block size): a
    prompt one of them cached, in memory, in the Redis tier or as a whole reply, is new
    to the other, whose output is its own cold output."""
    twin = build_tiny_llama(tmp_path / "twin", real_model_dir, seed=1)
    tier = {"kv_tier_url": REDIS_URL, "kv_tier_namespace": kv_namespace, "block_size": 8}
    replies = ResponseCache(REDIS_URL, ttl_s=60, namespace=f"{kv_namespace}-replies")
    prompt = list(range(1000, 1100))
    made: list[EmbeddedClient] = []

    def serve(folder: Path, **overrides: Any) -> EmbeddedClient:
        client = make_engine_client(folder, **{**tier, **overrides})
        client.fingerprint()
        client.response_cache = replies
        made.append(client)
        return client

    async def check() -> None:
        first = serve(tiny_model_dir)
        other = serve(twin)
        cold_other = make_engine_client(twin, enable_prefix_caching=False)
        made.append(cold_other)
        assert (await reply(first, prompt))[1].cached_tokens == 0
        assert first.engine.engine.kv_tier.flush(10)  # its blocks are in Redis now
        assert (await reply(first, prompt))[1].replayed  # and its reply in the cache
        tokens, m2 = await reply(other, prompt)
        assert m2.cached_tokens == 0 and m2.cached_tokens_redis == 0
        assert not getattr(m2, "replayed", False)
        assert tokens == (await reply(cold_other, prompt))[0]
        # The tier does serve the model that wrote it: a fresh engine of it restores.
        restarted = serve(tiny_model_dir)
        restarted.response_cache = None
        assert (await reply(restarted, prompt))[1].cached_tokens_redis >= 96

    try:
        asyncio.run(check())
    finally:
        for client in made:
            client.shutdown()
        replies.close()


# --- upstream: the models the upstream lists -------------------------------------------


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, two_models: LiveServer) -> Iterator[LiveServer]:
    """This app in front of the two-model server above (ENGINE_UPSTREAM_MODEL unset)."""
    srv = LiveServer(
        tmp_path_factory.mktemp("front"),
        "/nonexistent-model-folder",
        ENGINE_MODE="upstream",
        ENGINE_UPSTREAM_URL=two_models.url + "/v1",
        ENGINE_UPSTREAM_API_KEY=two_models.make_key("apiuser"),
    ).start()
    srv.make_user("apiuser", PASSWORD)
    yield srv
    srv.stop()


@pytest.mark.slow
def test_in_front_of_an_upstream_its_models_are_listed_and_each_request_names_one(
    front: LiveServer, api: openai.OpenAI
) -> None:
    ahead = openai.OpenAI(base_url=front.url + "/v1", api_key=front.make_key("apiuser"))
    listed = ahead.models.list().data
    assert [(m.id, m.created, m.owned_by) for m in listed] == [
        (m.id, m.created, m.owned_by) for m in api.models.list().data
    ]
    assert [m.id for m in listed] == [MODEL_NAME, "tiny"]
    for model in (MODEL_NAME, "tiny"):
        answer = ahead.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
        assert answer.model == model
    with pytest.raises(openai.NotFoundError) as missing:
        ahead.completions.create(model="gpt-4o", prompt="Hi", max_tokens=2)
    assert missing.value.code == "model_not_found"
    session = front.login("apiuser", PASSWORD)
    picker = session.get("/api/models/").json()
    session.close()
    assert picker["default"] == MODEL_NAME  # ENGINE_UPSTREAM_MODEL unset: the first listed
    assert [m["id"] for m in picker["models"]] == [MODEL_NAME, "tiny"]
