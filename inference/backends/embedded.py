"""The engine this app runs itself: in this process (embedded, the default), or in the
`manage.py run_engine` workers (distributed), reached through RemoteEngine (remote.py)
with the same surface as AsyncEngine. Either way this process builds the prompts, as
exact token ids, and keeps the reply memory and the response cache in front."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from django.conf import settings

from inference import metrics, response_cache
from inference.backends.remote import RemoteEngine
from inference.chat_template import Prompt, PromptBuilder, Turn
from inference.engine import Delta, PromptTooLongError, SamplingParams
from inference.engine.fingerprint import model_fingerprint
from inference.model_files import model_name
from inference.response_cache import ResponseCache, is_deterministic

log = logging.getLogger(__name__)


class EmbeddedClient:
    """An AsyncEngine in this process (or, subclassed, the engine workers' RemoteEngine):
    prompts are built here from exact token ids."""

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
        return model_name(settings.ENGINE["MODEL"])

    def chat_prompt(self, turns: list[Turn], cache_salt: str | None = None) -> Prompt:
        """Prompt ids for a conversation; replies the engine wrote keep their exact ids."""
        turns = self.recall_replies(turns, cache_salt)
        user_ids: list[int] = []
        if turns and turns[-1].role == "user" and self.prompts.exact:
            user_ids = self.prompts.turn_ids(turns[-1], first=len(turns) == 1)
        return Prompt(token_ids=self.prompts.build(turns), user_token_ids=user_ids)

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


def distributed_client() -> DistributedClient:
    """A client of the `manage.py run_engine` workers settings.ENGINE names."""
    from transformers import AutoTokenizer  # a second or two: only when distributed

    cfg = settings.ENGINE
    model = str(cfg["MODEL"])
    remote = RemoteEngine(
        AutoTokenizer.from_pretrained(model),
        url=cfg["WORKERS_REDIS_URL"],
        namespace=cfg["WORKERS_NAMESPACE"],
        model=model_name(model),
        model_path=model,
        dead_after_s=float(cfg["WORKER_DEAD_AFTER_S"]),
    )
    return DistributedClient(remote)
