"""vllm:prompt_tokens_total counts what the engine prefilled (vLLM's definition): the
prompts of requests it scheduled, never those it refused before scheduling them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import started, users_code
from tools.live_server import LiveServer

TOKEN = "prompt-tokens-metric"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LiveServer]:
    # A short context window (a long prompt is refused before the engine sees it) and a
    # small waiting-token budget (a prompt past it is the engine's to refuse as busy).
    srv = LiveServer(
        tmp_path_factory.mktemp("prompt-tokens"),
        tiny_model_dir,
        METRICS_BEARER_TOKEN=TOKEN,
        ENGINE_MAX_MODEL_LEN="128",
        ENGINE_MAX_WAITING_TOKENS="40",
    )
    started(srv, users_code("metrics-user", password="a-long-test-password-1"))
    yield srv
    srv.stop()


def prompt_tokens_total(server: LiveServer) -> float:
    text = httpx.get(
        server.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    ).text
    found = re.findall(r"^vllm:prompt_tokens_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return sum(float(v) for v in found)


def stored_prompt_tokens(server: LiveServer) -> tuple[int, int]:
    """The prompts stored: of the requests the engine scheduled, and of all of them."""
    return tuple(
        int(n)
        for n in server.python(
            "from django.db.models import Q; "
            "from chatapp.observability.models import RequestRecord as R; "
            "s = R.objects.filter(Q(queue_time__isnull=False) | Q(output_tokens__gt=0)); "
            "print(sum(r.prompt_tokens for r in s), sum(r.prompt_tokens for r in R.objects.all()))"
        ).split()
    )  # type: ignore[return-value]


def test_refused_prompts_are_not_counted_as_prefilled(
    server: LiveServer, tiny_model_dir: Path
) -> None:
    key = server.make_key("metrics-user")
    api = httpx.Client(
        base_url=server.url + "/v1", headers={"Authorization": f"Bearer {key}"}, timeout=60
    )
    model = tiny_model_dir.name

    def complete(prompt: str) -> httpx.Response:
        body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}
        return api.post("/completions", json=body)

    served = [complete("Hello there, how are you?"), complete("The sky is")]
    assert [r.status_code for r in served] == [200, 200]
    too_long = [complete("word " * 400), complete("many words " * 300)]
    assert [r.status_code for r in too_long] == [400, 400], [r.text for r in too_long]
    busy = [complete("word " * 60), complete("other words " * 30)]
    assert [r.status_code for r in busy] == [503, 503], [r.text for r in busy]
    api.close()

    prefilled = sum(r.json()["usage"]["prompt_tokens"] for r in served)
    assert prompt_tokens_total(server) == prefilled
    scheduled, stored = stored_prompt_tokens(server)
    # The refused requests stay on record with their prompts' length; /metrics leaves
    # them out, as the scheduled records do.
    assert scheduled == prefilled and stored > prefilled
