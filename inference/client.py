"""The web app's handle on the engine: one interface, whichever backend serves.

The chat, the OpenAI API and the jobs call `get_engine_client()` and use only the
`EngineClient` protocol below. Which backend it is (inference/backends/) is decided here,
once per process, from settings.ENGINE["MODE"]: `embedded` (the engine in this process,
the default), `distributed` (the `manage.py run_engine` workers) or `upstream` (another
OpenAI-compatible server).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any, Protocol

from django.conf import settings
from django.utils.crypto import salted_hmac

from inference.backends.embedded import EmbeddedClient, distributed_client
from inference.backends.upstream import UpstreamClient
from inference.chat_template import Prompt, Turn
from inference.engine import Delta, EngineConfig, EngineError, SamplingParams
from inference.workers.protocol import EngineUnavailableError

log = logging.getLogger(__name__)

__all__ = [
    "EngineClient",
    "EngineUnavailableError",
    "Prompt",
    "engine_config_from_settings",
    "engine_ready",
    "get_engine_client",
    "prefix_cache_salt",
    "set_engine_client",
]


class EngineClient(Protocol):
    """What every backend offers the web app."""

    kind: str  # "embedded", "distributed" or "upstream"

    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int | None: ...

    def chat_prompt(self, turns: list[Turn], cache_salt: str | None = None) -> Prompt:
        """A conversation's prompt; replies the engine wrote keep their exact ids."""

    def system_prompt(self, text: str) -> Prompt:
        """A conversation's opening alone (its system turn, no generation prompt)."""

    def with_reply_started(self, prompt: Prompt, text: str) -> Prompt:
        """The prompt with the assistant's reply begun by `text`, where the backend takes
        token ids; otherwise the prompt as it is."""

    def completion_prompt(self, prompt: str | list[int]) -> Prompt: ...

    def check_fits(self, prompt: Prompt) -> None:
        """Raise PromptTooLongError when the prompt leaves no room for a token."""

    def count_tokens(self, text: str) -> int | None:
        """How many tokens `text` is for the served model; None where this process does
        not tokenize (an upstream server)."""

    def remember_reply(
        self, text: str, token_ids: list[int], cache_salt: str | None = None
    ) -> None: ...

    def stream(
        self,
        prompt: Prompt,
        sampling: SamplingParams,
        session_id: str | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        replay: bool = True,
    ) -> AsyncIterator[Delta]:
        """The request's deltas; `replay=False` keeps the response cache out of it."""

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def shutdown(self) -> None: ...


def prefix_cache_salt(owner_id: int, client_salt: str | None = None) -> str:
    """The salt that scopes a user's prefix reuse (KV cache, memory and Redis alike), the
    response cache and the reply memory to that user (docs/kv-tier.md, "Whose blocks").

    An HMAC of the user id under SECRET_KEY: not guessable, and never taken from a client.
    A `client_salt` (the API's `cache_salt` field, vLLM's name) only splits the user's own
    scope further; no value of it reaches another user's.
    """
    value = str(owner_id) if client_salt is None else f"{owner_id}\0{client_salt}"
    return salted_hmac("inference.prefix-cache", value, algorithm="sha256").hexdigest()[:32]


def engine_config_from_settings(overrides: dict[str, Any] | None = None) -> EngineConfig:
    """The EngineConfig settings.ENGINE describes (one entry per field, FIELD in capitals:
    chatapp/settings/engine.py), with `overrides` of the same keys on top."""
    cfg = {**settings.ENGINE, **(overrides or {})}
    return EngineConfig(
        **{
            f.name: cfg[f.name.upper()]
            for f in dataclasses.fields(EngineConfig)
            if f.name.upper() in cfg
        }
    )


def make_client() -> EngineClient:
    """The backend settings.ENGINE["MODE"] names."""
    mode = settings.ENGINE["MODE"]
    if mode == "upstream":
        return UpstreamClient.from_settings()
    if mode == "distributed":
        return distributed_client()
    if mode != "embedded":
        raise EngineUnavailableError(f"unknown ENGINE_MODE {mode!r}")
    # Torch and transformers load with the engine, in the process that runs one only.
    from inference.engine.async_engine import AsyncEngine

    return EmbeddedClient(AsyncEngine(engine_config_from_settings()))


_client: EngineClient | None = None
_lock = threading.Lock()
_load_error: BaseException | None = None
# Why this process must not build an embedded engine (set in a Celery worker), or None.
_embedded_refused: str | None = None


def refuse_embedded_engine(reason: str) -> None:
    """From now on this process builds no embedded engine: `get_engine_client` logs
    `reason` as one error and raises EngineUnavailableError instead of loading the model.
    A Celery worker calls it (chatapp/jobs/queue.py): the engine that serves users is the web
    process's, and a second copy would cost its memory and serve nobody."""
    global _embedded_refused
    _embedded_refused = reason


def embedded_engine_refused() -> str | None:
    """Why this process may not build the engine it would need now; None when it may (or
    holds one already, or the engine is elsewhere: distributed or upstream mode)."""
    if _embedded_refused and _client is None and settings.ENGINE["MODE"] == "embedded":
        return _embedded_refused
    return None


def get_engine_client() -> EngineClient:
    """The process-wide client, created (and the model loaded) on first use: an
    EngineClient of the backend settings.ENGINE["MODE"] names (make_client)."""
    global _client, _load_error
    if _client is not None:
        return _client
    refused = embedded_engine_refused()
    if refused:
        log.error("no engine built here: %s", refused)
        raise EngineUnavailableError(refused)
    with _lock:
        if _client is None:
            try:
                _client = make_client()
                _load_error = None
                # Stop the engine thread before the interpreter tears torch down under it.
                atexit.register(_client.shutdown)
            except Exception as exc:
                _load_error = exc
                log.exception("the engine failed to start")
                raise EngineUnavailableError(f"the engine failed to start: {exc}") from exc
    return _client


def engine_ready() -> bool:
    return _client is not None


def set_engine_client(client: EngineClient | None) -> None:
    """Install a client (tests build one over a tiny model) or clear it."""
    global _client
    with _lock:
        if _client is not None and client is not _client:
            _client.shutdown()
        _client = client


def loaded_engine_stats() -> dict[str, Any] | None:
    """The engine's stats if its client exists in this process (the model loaded or the
    workers' client made), else None: never builds one."""
    client = _client
    if client is None:
        return None
    try:
        return client.stats()
    except Exception:
        log.exception("engine stats failed")
        return None


def serving_engine_busy() -> bool:
    """Whether the engine that serves users has requests waiting: in embedded mode this
    process's (generation jobs run in the serving process), in distributed mode the
    workers' summed queue. An upstream server's queue cannot be seen: never busy."""
    mode = settings.ENGINE["MODE"]
    if mode == "embedded":
        stats = loaded_engine_stats()
    elif mode == "distributed":
        try:
            stats = get_engine_client().stats()
        except Exception as exc:  # the job itself will say what is wrong
            log.warning("could not read the engine workers' load: %s", exc)
            return False
    else:
        return False
    return bool(stats and int(stats.get("waiting") or 0) > 0)


def preload_in_background() -> None:
    """Load the model in a thread so the server answers at once and the first message
    does not pay for loading."""

    def load() -> None:
        try:
            get_engine_client()
            log.info("engine ready: %s", settings.ENGINE["MODEL"])
        except EngineError:
            pass  # already logged; the first message will report it to the user

    threading.Thread(target=load, name="engine-preload", daemon=True).start()
