"""The web app's handle on the engine.

The consumer and the API views call `get_engine_client()` and use only `chat_prompt` /
`completion_prompt`, `stream`, `abort` and `stats`; whether the engine runs in this
process (embedded, the default) or is another OpenAI-compatible server (upstream) is
decided here, from settings.ENGINE.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils.crypto import salted_hmac

from inference import metrics
from inference.chat_template import PromptBuilder, Turn
from inference.engine import Delta, EngineConfig, EngineError, PromptTooLongError, SamplingParams
from inference.engine.fingerprint import model_fingerprint
from inference.response_cache import ResponseCache, is_deterministic

# Defined beside the worker protocol (no Django there), which raises it too.
from inference.workers.protocol import EngineUnavailableError

log = logging.getLogger(__name__)


@dataclass
class Prompt:
    """A request's prompt in whatever form the engine behind the client takes."""

    token_ids: list[int] | None = None  # our engine: exact ids
    messages: list[dict[str, str]] | None = None  # an upstream chat endpoint
    text: str | None = None  # an upstream completions endpoint
    # The ids of the newest user turn (stored with the message), when known.
    user_token_ids: list[int] = field(default_factory=list)

    @property
    def length(self) -> int | None:
        return None if self.token_ids is None else len(self.token_ids)


def prefix_cache_salt(owner_id: int, client_salt: str | None = None) -> str:
    """The salt that scopes a user's prefix reuse (KV cache, memory and Redis alike), the
    response cache and the reply memory to that user (docs/kv-tier.md, "Whose blocks").

    An HMAC of the user id under SECRET_KEY: not guessable, and never taken from a client.
    A `client_salt` (the API's `cache_salt` field, vLLM's name) only splits the user's own
    scope further; no value of it reaches another user's.
    """
    value = str(owner_id) if client_salt is None else f"{owner_id}\0{client_salt}"
    return salted_hmac("inference.prefix-cache", value, algorithm="sha256").hexdigest()[:32]


class EngineClient:
    """Wraps an in-process AsyncEngine."""

    kind = "embedded"

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.prompts = PromptBuilder(engine.tokenizer)
        self._replies: OrderedDict[tuple[str | None, str], list[int]] = OrderedDict()
        self._replies_lock = threading.Lock()
        self._openings: dict[str, list[list[int]]] = {}  # by default system prompt

    # API clients resend a history as text. Re-tokenizing a reply's text does not always
    # give back the ids the engine produced, and then the prefix cache misses from that
    # point on; so remember recent replies' ids by their exact text and splice them back.
    REPLY_MEMORY = 4096

    # Replies are remembered per cache salt (per user): another user's prompt must not get
    # them, or its token count would tell that someone was sent this exact reply.
    def remember_reply(
        self, text: str, token_ids: list[int], cache_salt: str | None = None
    ) -> None:
        if not text or not token_ids:
            return
        key = (cache_salt, text)
        with self._replies_lock:
            self._replies[key] = list(token_ids)
            self._replies.move_to_end(key)
            while len(self._replies) > self.REPLY_MEMORY:
                self._replies.popitem(last=False)

    def recall_replies(self, turns: list[Turn], cache_salt: str | None = None) -> list[Turn]:
        out = []
        with self._replies_lock:
            for turn in turns:
                mine = turn.role == "assistant"
                ids = self._replies.get((cache_salt, turn.text)) if mine else None
                out.append(
                    Turn(turn.role, turn.text, ids) if ids and turn.token_ids is None else turn
                )
        return out

    @property
    def max_model_len(self) -> int | None:
        limit = self.engine.max_model_len  # None: distributed, before any worker was seen
        return None if limit is None else int(limit)

    @property
    def model_name(self) -> str:
        return str(settings.ENGINE["MODEL"]).rstrip("/").rsplit("/", 1)[-1]

    def chat_prompt(self, turns: list[Turn], cache_salt: str | None = None) -> Prompt:
        """Prompt ids for a conversation; replies the engine wrote keep their exact ids."""
        turns = self.recall_replies(turns, cache_salt)
        user_ids: list[int] = []
        if turns and turns[-1].role == "user" and self.prompts.exact:
            user_ids = self.prompts.turn_ids(turns[-1], first=len(turns) == 1)
        return Prompt(token_ids=self.prompts.build(turns), user_token_ids=user_ids)

    def completion_prompt(self, prompt: str | list[int]) -> Prompt:
        if isinstance(prompt, str):
            return Prompt(token_ids=list(self.tokenizer.encode(prompt, add_special_tokens=False)))
        vocab = len(self.tokenizer)
        if any(not 0 <= t < vocab for t in prompt):
            raise ValueError("token ids must be within the model's vocabulary")
        return Prompt(token_ids=list(prompt))

    def check_fits(self, prompt: Prompt) -> None:
        limit = self.max_model_len
        if limit is not None and prompt.length is not None and prompt.length + 1 > limit:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens; "
                f"the prompt has {prompt.length}."
            )

    # The response cache: None follows settings (response_cache_from_settings); a test
    # or a tool may install a ResponseCache here instead.
    response_cache: ResponseCache | None = None
    _fingerprint: str | None = None
    _fingerprint_retry_at = 0.0
    _fingerprinting = False

    def stream(
        self,
        prompt: Prompt,
        sampling: SamplingParams,
        session_id: str | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[Delta]:
        """The request's deltas. A deterministic request answered before is replayed from
        the response cache when it is on (inference/response_cache.py); the chat socket
        and the OpenAI API both come through here.

        `cache_salt` (prefix_cache_salt(owner)) scopes both caches to the request's owner;
        only requests no user's text is in (a warm-up) go without one."""
        ids = prompt.token_ids
        assert ids is not None
        cache = self.response_cache or response_cache_from_settings()
        if cache is None or not is_deterministic(sampling):
            return self.generate(ids, sampling, session_id, request_id, cache_salt)
        return cache.stream(
            key=lambda: self._cache_key(cache, ids, sampling, cache_salt),
            prompt_len=len(ids),
            start_engine=lambda: self.generate(ids, sampling, session_id, request_id, cache_salt),
            request_id=request_id,
            on_lookup=self._count_lookup,
        )

    def _cache_key(
        self,
        cache: ResponseCache,
        ids: list[int],
        sampling: SamplingParams,
        cache_salt: str | None,
    ) -> str | None:
        fingerprint = self.fingerprint(wait=False)
        if fingerprint is None:
            return None
        return cache.key(fingerprint, ids, sampling, scope=cache_salt or "")

    def fingerprint(self, wait: bool = True) -> str | None:
        """The model as it runs here (weights, dtype, quantization, context length); None
        while it cannot be told, and nothing is cached then. Hashing the weights takes a
        second or so, once: with wait=False it runs in the background meanwhile, so the
        first deterministic requests go to the engine rather than wait for it."""
        if self._fingerprint is None and time.monotonic() >= self._fingerprint_retry_at:
            if wait:
                self._compute_fingerprint()
            elif not self._fingerprinting:
                self._fingerprinting = True
                threading.Thread(
                    target=self._compute_fingerprint, name="model-fingerprint", daemon=True
                ).start()
        return self._fingerprint

    def _compute_fingerprint(self) -> None:
        try:
            stats = self.engine.stats()
            self._fingerprint = model_fingerprint(
                str(self.engine.config.model),
                dtype=str(stats["dtype"]),
                quantization=str(stats["quantization"]),
                max_model_len=self.max_model_len,
            )
        except Exception as exc:  # e.g. no engine worker seen yet: try again in a minute
            if not self._fingerprint_retry_at:
                log.warning("response cache unused: no model fingerprint (%r)", exc)
            self._fingerprint_retry_at = time.monotonic() + 60.0
        finally:
            self._fingerprinting = False

    def _count_lookup(self, hit: bool) -> None:
        metrics.response_cache_lookups.labels(self.model_name).inc()
        if hit:
            metrics.response_cache_hits.labels(self.model_name).inc()

    def generate(
        self,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        session_id: str | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[Delta]:
        shared = self.shared_prefix_tokens(prompt_token_ids) if cache_salt is not None else 0
        return self.engine.generate(
            prompt_token_ids,
            sampling,
            session_id=session_id,
            request_id=request_id,
            cache_salt=cache_salt,
            shared_prefix_tokens=shared,
        )

    def shared_prefix_tokens(self, prompt_token_ids: list[int]) -> int:
        """How many leading tokens of a prompt are public text any user's conversation may
        open with (the server's default system prompt, PromptBuilder.public_openings): their
        whole KV blocks stay shared across users; the rest of the prompt is salted."""
        best = 0
        for opening in self._public_openings(str(settings.CHAT_DEFAULTS.get("system_prompt", ""))):
            n = 0
            for a, b in zip(opening, prompt_token_ids, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best

    def _public_openings(self, default_system_prompt: str) -> list[list[int]]:
        found = self._openings.get(default_system_prompt)
        if found is None:
            found = self._openings[default_system_prompt] = self.prompts.public_openings(
                default_system_prompt
            )
        return found

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def stats(self) -> dict[str, Any]:
        return dict(self.engine.stats())

    def shutdown(self) -> None:
        self.engine.shutdown()


_client: Any = None
_lock = threading.Lock()
_load_error: BaseException | None = None
# Why this process must not build an embedded engine (set in a Celery worker), or None.
_embedded_refused: str | None = None


def refuse_embedded_engine(reason: str) -> None:
    """From now on this process builds no embedded engine: `get_engine_client` logs
    `reason` as one error and raises EngineUnavailableError instead of loading the model.
    A Celery worker calls it (inference.tasks): the engine that serves users is the web
    process's, and a second copy would cost its memory and serve nobody."""
    global _embedded_refused
    _embedded_refused = reason


def embedded_engine_refused() -> str | None:
    """Why this process may not build the engine it would need now; None when it may (or
    holds one already, or the engine is elsewhere: distributed or upstream mode)."""
    if _embedded_refused and _client is None and settings.ENGINE["MODE"] == "embedded":
        return _embedded_refused
    return None


def engine_config_from_settings(overrides: dict[str, Any] | None = None) -> EngineConfig:
    cfg = {**settings.ENGINE, **(overrides or {})}
    return EngineConfig(
        model=cfg["MODEL"],
        dtype=cfg["DTYPE"],
        device=cfg["DEVICE"],
        max_num_seqs=cfg["MAX_NUM_SEQS"],
        max_num_batched_tokens=cfg["MAX_NUM_BATCHED_TOKENS"],
        kv_cache_memory_mb=cfg["KV_CACHE_MEMORY_MB"],
        max_model_len=cfg["MAX_MODEL_LEN"],
        max_waiting_requests=cfg["MAX_WAITING_REQUESTS"],
        num_threads=cfg["NUM_THREADS"],
        small_step_threads=cfg.get("SMALL_STEP_THREADS", 0),
        quantization=cfg.get("QUANTIZATION", "auto"),
        compile=cfg.get("COMPILE", "auto"),
        kv_tier_url=cfg.get("KV_TIER_URL", ""),
        kv_tier_ttl_s=cfg.get("KV_TIER_TTL_S", 86400),
        kv_tier_max_mb=cfg.get("KV_TIER_MAX_MB", 2048),
        kv_tier_compression=cfg.get("KV_TIER_COMPRESSION", "none"),
        kv_tier_namespace=cfg.get("KV_TIER_NAMESPACE", "kvtier"),
        tensor_parallel_size=cfg.get("TENSOR_PARALLEL_SIZE", 1),
        speculative_mode=cfg.get("SPECULATIVE_MODE", ""),
        num_speculative_tokens=cfg.get("NUM_SPECULATIVE_TOKENS", 4),
        ngram_min=cfg.get("NGRAM_MIN", 1),
        ngram_max=cfg.get("NGRAM_MAX", 4),
        speculative_draft_model=cfg.get("SPECULATIVE_DRAFT_MODEL", ""),
    )


_response_caches: dict[tuple[str, float], ResponseCache] = {}
_response_caches_lock = threading.Lock()  # not _lock: that one is held while a model loads


def response_cache_from_settings() -> ResponseCache | None:
    """The response cache settings.RESPONSE_CACHE_* describe; None while it is off."""
    if not getattr(settings, "RESPONSE_CACHE_ENABLED", False):
        return None
    spec = (str(settings.RESPONSE_CACHE_URL), float(settings.RESPONSE_CACHE_TTL_S))
    with _response_caches_lock:
        if spec not in _response_caches:
            _response_caches[spec] = ResponseCache(*spec)
        return _response_caches[spec]


def _make_client() -> Any:
    mode = settings.ENGINE["MODE"]
    if mode == "upstream":
        from inference.upstream import UpstreamEngineClient

        return UpstreamEngineClient.from_settings()
    if mode == "distributed":
        return _distributed_client()
    if mode != "embedded":
        raise EngineUnavailableError(f"unknown ENGINE_MODE {mode!r}")
    from inference.engine import AsyncEngine

    return EngineClient(AsyncEngine(engine_config_from_settings()))


class DistributedEngineClient(EngineClient):
    """The engine runs in `manage.py run_engine` workers; this process holds only the
    tokenizer (prompts are built here, with the same code as embedded)."""

    kind = "distributed"


def _distributed_client() -> DistributedEngineClient:
    from transformers import AutoTokenizer

    from inference.workers.remote import RemoteEngine

    cfg = settings.ENGINE
    model = str(cfg["MODEL"])
    remote = RemoteEngine(
        AutoTokenizer.from_pretrained(model),
        url=cfg["WORKERS_REDIS_URL"],
        namespace=cfg["WORKERS_NAMESPACE"],
        model=model.rstrip("/").rsplit("/", 1)[-1],
        model_path=model,
        dead_after_s=float(cfg["WORKER_DEAD_AFTER_S"]),
    )
    return DistributedEngineClient(remote)


def get_engine_client() -> Any:
    """The process-wide client, created (and the model loaded) on first use: an
    EngineClient (embedded) or an UpstreamEngineClient; both have the same methods."""
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
                _client = _make_client()
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


def set_engine_client(client: Any) -> None:
    """Install a client (tests build one over a tiny model) or clear it."""
    global _client
    with _lock:
        if _client is not None and client is not _client:
            _client.shutdown()
        _client = client


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
