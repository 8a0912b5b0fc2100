"""The engine this app runs itself: in this process (embedded, the default), or in the
`manage.py run_engine` workers (distributed), reached through RemoteEngine (remote.py)
with the same surface as AsyncEngine. Either way this process builds the prompts, as
exact token ids, and keeps the reply memory and the response cache in front. One client
per served model: each has its own engine (embedded) or its own model's workers."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from django.conf import settings
from redis import Redis

from inference import metrics, response_cache
from inference.backends.remote import REDIS_TIMEOUT_S, RemoteEngine
from inference.catalog import (
    OWNER,
    ModelInfo,
    ModelSpec,
    created_at,
    is_model_path,
    model_name,
    served_models,
)
from inference.chat_template import Prompt, PromptBuilder, Turn, tokenizer_fingerprint
from inference.engine import Delta, PromptTooLongError, SamplingParams
from inference.engine.fingerprint import model_fingerprint
from inference.response_cache import ResponseCache, is_deterministic
from inference.workers.protocol import (
    REDIS_ERRORS,
    REDIS_OPTIONS,
    EngineUnavailableError,
    ModelNotFoundError,
)
from inference.workers.registry import WorkerInfo, live_workers_sync

log = logging.getLogger(__name__)


class EmbeddedClient:
    """An AsyncEngine in this process (or, subclassed, the engine workers' RemoteEngine):
    prompts are built here from exact token ids."""

    kind = "embedded"

    def __init__(self, engine: Any, name: str | None = None) -> None:
        self.engine = engine
        self.name = name
        self.tokenizer = engine.tokenizer
        self.prompts = PromptBuilder(engine.tokenizer)
        self.tokenizer_id: str | None = tokenizer_fingerprint(engine.tokenizer)
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
        """The name it serves under (the default model's when made without one)."""
        if self.name:
            return self.name
        cfg = settings.ENGINE
        try:
            return served_models(str(cfg["MODEL"]), list(cfg.get("MODELS") or ()))[0].name
        except ValueError:
            return model_name(cfg["MODEL"])

    def chat_prompt(self, turns: list[Turn], cache_salt: str | None = None) -> Prompt:
        """Prompt ids for a conversation; replies the engine wrote keep their exact ids."""
        turns = self.recall_replies(turns, cache_salt)
        user_ids: list[int] = []
        if turns and turns[-1].role == "user" and self.prompts.exact:
            user_ids = self.prompts.turn_ids(turns[-1], first=len(turns) == 1)
        return Prompt(token_ids=self.prompts.build(turns), user_token_ids=user_ids)

    @property
    def tool_format(self) -> str | None:
        return self.prompts.tool_format

    def tool_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Prompt:
        return Prompt(token_ids=self.prompts.build_with_tools(messages, tools))

    def system_prompt(self, text: str) -> Prompt:
        return Prompt(
            token_ids=self.prompts.build([Turn("system", text)], add_generation_prompt=False)
        )

    def with_reply_started(self, prompt: Prompt, text: str) -> Prompt:
        if prompt.token_ids is None:
            return prompt
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return Prompt(token_ids=prompt.token_ids + ids, user_token_ids=prompt.user_token_ids)

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

    def count_tokens(self, text: str) -> int | None:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    # The response cache: None follows settings (response_cache.from_settings); a test
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
        replay: bool = True,
    ) -> AsyncIterator[Delta]:
        """The request's deltas. A deterministic request answered before is replayed from
        the response cache when it is on (inference/response_cache.py); the chat socket
        and the OpenAI API both come through here.

        `cache_salt` (prefix_cache_salt(owner)) scopes both caches to the request's owner;
        only requests no user's text is in (a warm-up) go without one."""
        ids = prompt.token_ids
        assert ids is not None
        cache = self.response_cache or response_cache.from_settings()
        if not replay or cache is None or not is_deterministic(sampling):
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
                kv_dtype=str(stats.get("kv_dtype", stats["dtype"])),
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


class DistributedClient(EmbeddedClient):
    """The engine runs in `manage.py run_engine` workers; this process holds only the
    tokenizer (prompts are built here, with the same code as embedded)."""

    kind = "distributed"


class WorkerModels:
    """The models the live engine workers serve (distributed mode), read from their
    registrations, and a client per model: each routes to that model's workers only."""

    def __init__(self, url: str, namespace: str, dead_after_s: float) -> None:
        self.url = url
        self.namespace = namespace
        self.dead_after_s = dead_after_s
        self.redis = Redis.from_url(url, **{**REDIS_OPTIONS, "socket_timeout": REDIS_TIMEOUT_S})

    @classmethod
    def from_settings(cls) -> WorkerModels:
        cfg = settings.ENGINE
        return cls(cfg["WORKERS_REDIS_URL"], cfg["WORKERS_NAMESPACE"], cfg["WORKER_DEAD_AFTER_S"])

    def close(self) -> None:
        self.redis.close()

    def serving(self) -> dict[str, list[WorkerInfo]]:
        """The live workers by the model they serve (none when Redis does not answer)."""
        try:
            workers = live_workers_sync(self.redis, self.namespace)
        except REDIS_ERRORS as exc:
            log.warning("cannot read the engine workers at %s: %s", self.url, exc)
            return {}
        by_model: dict[str, list[WorkerInfo]] = {}
        for w in workers:
            if w.model:
                by_model.setdefault(w.model, []).append(w)
        return by_model

    def health(self, model: str) -> tuple[bool, str]:
        """Whether a live worker serves `model` now, read afresh (the readiness probe)."""
        try:
            workers = live_workers_sync(self.redis, self.namespace)
        except REDIS_ERRORS as exc:
            log.warning("cannot read the engine workers at %s: %s", self.url, exc)
            return False, "the workers' Redis does not answer"
        # A draining worker finishes what it has and takes nothing new (remote.py's
        # routing skips it): it serves no new chat.
        serving = [w for w in workers if (not w.model or w.model == model) and not w.draining]
        if not serving:
            draining = sum(w.draining for w in workers)
            return False, (
                f"no live engine worker serves {model} ({len(workers)} live in all, "
                f"{draining} draining)"
            )
        return True, f"{len(serving)} live engine worker(s) serve {model}"

    def listed(self, default: str, default_spec: ModelSpec | None) -> list[ModelInfo]:
        """The default model (listed even while no worker serves it, as a single-model
        deployment always was) and every model a live worker serves."""
        serving = self.serving()
        out = []
        for name in dict.fromkeys([default, *sorted(serving)]):
            workers = serving.get(name, [])
            lens = [w.max_model_len for w in workers if w.max_model_len]
            created = max((w.model_created for w in workers), default=0)
            if not created and name == default and default_spec is not None:
                created = created_at(default_spec.path)
            out.append(ModelInfo(name, created, OWNER, context_tokens=min(lens, default=None)))
        return out

    def client(self, name: str, spec: ModelSpec | None, required: bool) -> DistributedClient:
        """The client of model `name`. Its tokenizer comes from the folder this web
        process knows the model by (CHATAPP_MODEL, CHATAPP_MODELS), else from the folder
        its workers registered (the compose file's shared model volume). `required` (the
        default model): its client is made with no worker serving it yet, as before."""
        path = spec.path if spec is not None else ""
        if not path or not is_model_path(path):
            serving = self.serving()
            workers = serving.get(name, [])
            if not workers and not required:
                raise ModelNotFoundError(name, list(serving))
            path = next((w.model_path for w in workers if is_model_path(w.model_path)), path)
            if workers and not is_model_path(path):
                raise EngineUnavailableError(
                    f"the engine workers serve {name!r} from {workers[0].model_path}, which "
                    "this web process cannot read: its tokenizer builds the prompts here "
                    "(mount the folder, or name it in CHATAPP_MODELS)"
                )
        return distributed_client(name, path, self, required)


def distributed_client(
    name: str, path: str, workers: WorkerModels, required: bool = True
) -> DistributedClient:
    """A client of the `manage.py run_engine` workers that serve model `name`."""
    # A second or two (a folder's files or a GGUF's metadata): only when distributed.
    from inference.engine.models.loader import load_tokenizer

    remote = RemoteEngine(
        load_tokenizer(path),
        url=workers.url,
        namespace=workers.namespace,
        model=name,
        model_path=path,
        dead_after_s=float(workers.dead_after_s),
        missing=EngineUnavailableError if required else ModelNotFoundError,
    )
    return DistributedClient(remote, name=name)
