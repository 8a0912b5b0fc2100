"""The web app's handle on the engine: one interface, whichever backend serves.

The chat, the OpenAI API and the jobs call `get_engine_client(model)` and use only the
`EngineClient` protocol below; `list_models()` says which models are served, and
`default_model()` which one a request naming none gets. Which backend it is
(inference/backends/) is decided here, from settings.ENGINE["MODE"]: `embedded` (one
engine per model folder in this process, the default), `distributed` (the `manage.py
run_engine` workers, each serving one model) or `upstream` (another OpenAI-compatible
server and the models it lists). There is one client per model, made on first use.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
from collections.abc import AsyncIterator
from typing import Any, Protocol

from django.conf import settings
from django.utils.crypto import salted_hmac

from inference.backends.embedded import EmbeddedClient, WorkerModels
from inference.backends.upstream import UpstreamModels
from inference.catalog import (
    OWNER,
    ModelInfo,
    ModelSpec,
    created_at,
    is_model_path,
    served_models,
)
from inference.chat_template import Prompt, Turn
from inference.engine import Delta, EngineConfig, EngineError, SamplingParams
from inference.engine.errors import UnsupportedModelError
from inference.engine.models.describe import describe_model
from inference.workers.protocol import EngineUnavailableError, ModelNotFoundError

log = logging.getLogger(__name__)

__all__ = [
    "EngineClient",
    "EngineUnavailableError",
    "ModelInfo",
    "ModelNotFoundError",
    "Prompt",
    "default_model",
    "engine_config_from_settings",
    "engine_health",
    "engine_ready",
    "get_engine_client",
    "install_engine_clients",
    "list_models",
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

    @property
    def tokenizer_id(self) -> str | None:
        """The fingerprint of the tokenizer the prompts' and replies' token ids are in
        (chat_template.tokenizer_fingerprint); None when the backend takes text only."""

    def chat_prompt(self, turns: list[Turn], cache_salt: str | None = None) -> Prompt:
        """A conversation's prompt; replies the engine wrote keep their exact ids."""

    @property
    def tool_format(self) -> str | None:
        """The tool-call format the model's chat template writes ("hermes"), None when it
        has none this server parses (PromptBuilder.tool_format)."""

    def tool_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Prompt:
        """The prompt of OpenAI-shaped messages (tool calls and results) and tools, rendered
        whole by the model's chat template."""

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


def served_model_specs() -> list[ModelSpec]:
    """The models settings name (CHATAPP_MODEL, CHATAPP_MODELS), the default first."""
    cfg = settings.ENGINE
    try:
        return served_models(str(cfg["MODEL"]), list(cfg.get("MODELS") or ()))
    except ValueError as exc:
        raise EngineUnavailableError(str(exc)) from exc


def default_model() -> str:
    """The name of the model a request that names none gets (a new conversation's)."""
    if _default is not None:
        return _default
    if settings.ENGINE["MODE"] == "upstream":
        return _upstream_models().default()
    return served_model_specs()[0].name


def list_models() -> list[ModelInfo]:
    """Every model served now, the default first: the configured folders (embedded), the
    default and whatever the live workers serve (distributed), the upstream's list; and
    the clients installed here (set_engine_client), the installed default in the
    configured default's place."""
    default = default_model()
    mode = settings.ENGINE["MODE"]
    if mode == "upstream":
        found = _upstream_models().listed()
    elif mode == "distributed":
        found = _worker_models().listed(default, _spec_of(default))
    else:
        specs = served_model_specs()
        if _default is not None:
            specs = [ModelSpec(default, _folder_of(default)), *specs[1:]]
        found = [ModelInfo(s.name, created_at(s.path), OWNER) for s in specs]
    listed = {m.id for m in found}
    found += [ModelInfo(n, created_at(_folder_of(n)), OWNER) for n in _clients if n not in listed]
    found.sort(key=lambda m: m.id != default)
    return [
        dataclasses.replace(
            m,
            default=m.id == default,
            context_tokens=_context(m.id, m),
            architecture=(files := _files(m.id))[0],
            weight_format=files[1],
        )
        for m in found
    ]


def _files(name: str) -> tuple[str | None, str | None]:
    """A model's architecture and weight format, where its files are here to read (an
    upstream's, or a worker's on another machine, are not)."""
    spec = _spec_of(name) if settings.ENGINE["MODE"] != "upstream" else None
    path = _folder_of(name) or (spec.path if spec is not None else "")
    if not path or not is_model_path(path):
        return None, None
    try:
        files = describe_model(path)
    except (UnsupportedModelError, OSError, ValueError):
        return None, None
    return files.architecture, files.weight_format


def _context(name: str, info: ModelInfo) -> int | None:
    """A model's context window: its client's, once made here, else as listed."""
    client = _clients.get(name)
    known = client.max_model_len if client is not None else None
    return known if known is not None else info.context_tokens


def _folder_of(name: str) -> str:
    """The folder a model's engine here loaded (blank when it is not one of ours)."""
    engine = getattr(_clients.get(name), "engine", None)
    return str(getattr(getattr(engine, "config", None), "model", "") or "")


def _spec_of(name: str) -> ModelSpec | None:
    return next((s for s in served_model_specs() if s.name == name), None)


def make_client(name: str) -> EngineClient:
    """The client of model `name` in the backend settings.ENGINE["MODE"] names;
    ModelNotFoundError when nothing serves a model of that name."""
    mode = settings.ENGINE["MODE"]
    if mode == "upstream":
        return _upstream_models().client(name)
    if mode == "distributed":
        return _worker_models().client(name, _spec_of(name), required=name == default_model())
    if mode != "embedded":
        raise EngineUnavailableError(f"unknown ENGINE_MODE {mode!r}")
    spec = _spec_of(name)
    if spec is None:
        raise ModelNotFoundError(name, [s.name for s in served_model_specs()])
    size = int(settings.ENGINE.get("TENSOR_PARALLEL_SIZE") or 1)
    if size > 1 and name != default_model():
        raise EngineUnavailableError(
            f"ENGINE_TENSOR_PARALLEL_SIZE={size} splits one model per process: serve "
            f"{name!r} from a `manage.py run_engine --model {name}` worker instead"
        )
    # Torch and transformers load with the engine, in the process that runs one only.
    from inference.engine.async_engine import AsyncEngine

    engine = AsyncEngine(engine_config_from_settings({"MODEL": spec.path}))
    return EmbeddedClient(engine, name=spec.name)


# The clients made so far, by model name; `_default` names the default model's when one
# was installed (set_engine_client), else settings name it.
_clients: dict[str, EngineClient] = {}
_default: str | None = None
_lock = threading.Lock()
_loading: dict[str, threading.Lock] = {}
_load_error: BaseException | None = None
# Why this process must not build an embedded engine (set in a Celery worker), or None.
_embedded_refused: str | None = None
_upstream: UpstreamModels | None = None
# The exit status of a server whose model the engine refuses at start.
REFUSED_MODEL_EXIT = 3
_workers: WorkerModels | None = None


def _upstream_models() -> UpstreamModels:
    global _upstream
    if _upstream is None:
        _upstream = UpstreamModels.from_settings()
    return _upstream


def _worker_models() -> WorkerModels:
    global _workers
    if _workers is None:
        _workers = WorkerModels.from_settings()
    return _workers


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
    if _embedded_refused and not _clients and settings.ENGINE["MODE"] == "embedded":
        return _embedded_refused
    return None


def get_engine_client(model: str | None = None) -> EngineClient:
    """The process-wide client of `model` (default: the default model), created (and its
    engine loaded) on first use: an EngineClient of the backend settings.ENGINE["MODE"]
    names. ModelNotFoundError when no engine serves a model of that name."""
    global _load_error
    name = model or default_model()
    client = _clients.get(name)
    if client is not None:
        return client
    refused = _embedded_refused if settings.ENGINE["MODE"] == "embedded" else None
    if refused:
        log.error("no engine built here: %s", refused)
        raise EngineUnavailableError(refused)
    with _lock:
        loading = _loading.setdefault(name, threading.Lock())
    # One lock per model: loading one model's weights holds up no request for another.
    with loading:
        client = _clients.get(name)
        if client is not None:
            return client
        try:
            client = make_client(name)
        except ModelNotFoundError:
            raise
        except Exception as exc:
            _load_error = exc
            log.exception("the engine of model %s failed to start", name)
            raise EngineUnavailableError(f"the engine failed to start: {exc}") from exc
        _load_error = None
        with _lock:
            _clients[name] = client
        # Stop the engine thread before the interpreter tears torch down under it.
        atexit.register(client.shutdown)
    return client


def engine_ready() -> bool:
    """Whether the default model's client exists in this process."""
    name = _default
    if name is None:
        try:
            name = default_model()
        except EngineError:
            return False
    return name in _clients


def engine_health() -> tuple[str, str]:
    """The engine's state now, for the readiness probe: ("ok" | "loading" | "down", what).
    Distributed and upstream modes ask the workers' registry or the upstream afresh."""
    mode = settings.ENGINE["MODE"]
    try:
        if mode == "distributed":
            ok, what = _worker_models().health(default_model())
        elif mode == "upstream":
            ok, what = _upstream_models().health()
        elif engine_ready():
            return "ok", "the model is loaded in this process"
        elif _load_error is not None:
            return "down", "the engine failed to start"
        else:
            return "loading", "the model is loading"
    except EngineError as exc:
        return "down", str(exc)
    return ("ok" if ok else "down"), what


def loaded_clients() -> dict[str, EngineClient]:
    """The clients made so far in this process, by model name (never builds one)."""
    return dict(_clients)


def set_engine_client(client: EngineClient | None, name: str | None = None) -> None:
    """Install a client as the default model's (tests build one over a tiny model, the
    tuning job restarts the engine with new settings; `name` defaults to the client's own
    model_name), or clear every client (None: the next use reads settings afresh). Clients
    replaced are shut down."""
    global _default, _upstream, _workers
    with _lock:
        if client is None:
            doomed = list(_clients.values())
            _clients.clear()
            if _workers is not None:
                _workers.close()
            _default = _upstream = _workers = None
        else:
            name = name or client.model_name
            doomed = [c for n, c in _clients.items() if n in (name, _default) and c is not client]
            for n in {name, _default}:
                _clients.pop(n or "", None)
            _clients[name] = client
            _default = name
    for old in doomed:
        old.shutdown()


def install_engine_clients(clients: dict[str, EngineClient]) -> None:
    """Serve these clients, by model name, the first as the default model's (tests serve
    two real models so); every client installed before is shut down."""
    global _default
    with _lock:
        doomed = [c for c in _clients.values() if all(c is not new for new in clients.values())]
        _clients.clear()
        _clients.update(clients)
        _default = next(iter(clients), None)
    for old in doomed:
        old.shutdown()


def loaded_engine_stats() -> dict[str, Any] | None:
    """The default model's engine stats if its client exists in this process (the model
    loaded or the workers' client made), else None: never builds one."""
    try:
        client = _clients.get(default_model())
    except EngineError:
        return None
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
    """Load the models in a thread, the default first, so the server answers at once and
    no first message pays for loading. A model the engine refuses (UnsupportedModelError:
    an unknown architecture, rope type, weight type, a missing tensor) ends the process
    with its message and a non-zero status: its config is checked here, before the thread,
    so that the server never starts; what shows only while loading the weights exits from
    the thread. A server that stayed up could never serve it."""
    if settings.ENGINE["MODE"] == "embedded":
        # Torch and transformers load with the engine, in the process that runs one only.
        from inference.engine.models import check_model

        for spec in served_model_specs():
            check_model(spec.path)

    def load() -> None:
        try:
            names = [default_model()]
            if settings.ENGINE["MODE"] == "embedded":
                names += [s.name for s in served_model_specs()[1:]]
        except EngineError:
            log.exception("the served models cannot be told")
            return
        for name in names:
            try:
                get_engine_client(name)
                log.info("engine ready: %s", name)
            except EngineError as exc:
                if isinstance(exc.__cause__, UnsupportedModelError):
                    log.critical("model %s is refused: %s", name, exc.__cause__)
                    os._exit(REFUSED_MODEL_EXIT)
                # Otherwise already logged; the first message will report it to the user.

    threading.Thread(target=load, name="engine-preload", daemon=True).start()
