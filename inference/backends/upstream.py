"""An OpenAI-compatible server as the engine: vLLM, SGLang, TGI, llama.cpp server,
Ollama, or another instance of this product.

The chat app keeps doing everything else (conversations, the UI, /metrics): figures are
measured here, at the app side — arrival when the request leaves, first token when the
first text arrives, one timestamp per streamed chunk. Prompts go out as chat messages
(the upstream applies its own model's template), so token ids are not known here and
replies are stored as text; prefix reuse is then the upstream's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings

from inference.catalog import ModelInfo
from inference.chat_template import Prompt, Turn
from inference.engine import (
    Delta,
    EngineBusyError,
    EngineError,
    PromptTooLongError,
    RequestFigures,
    SamplingParams,
)
from inference.engine.errors import InvalidRequestError
from inference.engine.outputs import TokenLogprob
from inference.engine.streaming import until_finished
from inference.workers.protocol import EngineUnavailableError, ModelNotFoundError

log = logging.getLogger(__name__)

# The structured outputs (SamplingParams.structured) an upstream is sent, on a chat.
UPSTREAM_STRUCTURED = ("json", "json_schema")
# llama.cpp's server lists its models with this owner; it names some fields its own way.
LLAMA_CPP = "llamacpp"
# The field named in a llama.cpp refusal ("Field 'n': Value must be ...").
_FIELD_IN_MESSAGE = re.compile(r"^Field '([A-Za-z_]+)'")


@dataclass
class UpstreamLogprob(TokenLogprob):
    """A token's logprob as an upstream names it: by its text and bytes (its ids mean
    nothing here), with its alternatives as (text, bytes, logprob), most likely first."""

    token: str = ""
    bytes: list[int] | None = None
    top_tokens: list[tuple[str, list[int] | None, float]] = field(default_factory=list)


@dataclass
class UpstreamDelta(Delta):
    """A delta with the tool calls the upstream parsed from its reply, as OpenAI streams
    them (`index`, then `id`, `type`, `function.name` and `arguments` pieces)."""

    tool_calls: list[dict[str, Any]] | None = None


@dataclass
class UpstreamPrompt(Prompt):
    """A chat prompt with tools: the upstream's own template renders them and its own
    parser reads the calls back."""

    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True


class UpstreamRefusal(InvalidRequestError):
    """The upstream refused the request as a client mistake (its 400 or 422, or an error
    it types invalid_request_error): the API's 400, naming the field where the upstream
    named one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UpstreamModels:
    """The models the upstream lists (its /models, read again after LIST_TTL_S), the
    default among them (ENGINE_UPSTREAM_MODEL, else the first listed), and a client each."""

    LIST_TTL_S = 30.0

    def __init__(
        self, base_url: str, api_key: str = "", default: str = "", send_cache_salt: bool = True
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.send_cache_salt = send_cache_salt
        self._default = default
        self._listed: list[ModelInfo] = []
        self._listed_at = float("-inf")
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls) -> UpstreamModels:
        cfg = settings.ENGINE
        if not cfg.get("UPSTREAM_URL"):
            raise EngineUnavailableError("ENGINE_MODE=upstream needs ENGINE_UPSTREAM_URL")
        return cls(
            cfg["UPSTREAM_URL"],
            cfg.get("UPSTREAM_API_KEY", ""),
            cfg.get("UPSTREAM_MODEL", ""),
            send_cache_salt=bool(cfg.get("UPSTREAM_CACHE_SALT", True)),
        )

    def listed(self) -> list[ModelInfo]:
        """The upstream's models as it last listed them; EngineUnavailableError when it
        never answered (a failed read keeps the last list until it answers again)."""
        with self._lock:
            if time.monotonic() - self._listed_at < self.LIST_TTL_S:
                return list(self._listed)
            try:
                self._listed = self._read()
            except EngineUnavailableError:
                if not self._listed:
                    raise
                log.warning("the upstream at %s did not list its models", self.base_url)
            self._listed_at = time.monotonic()
            return list(self._listed)

    def _read(self) -> list[ModelInfo]:
        try:
            answer = httpx.get(self.base_url + "/models", headers=self.headers, timeout=10)
            answer.raise_for_status()
            data = answer.json()["data"]
            models = [
                ModelInfo(
                    str(m["id"]), int(m.get("created") or 0), str(m.get("owned_by") or "upstream")
                )
                for m in data
            ]
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise EngineUnavailableError(
                f"the upstream at {self.base_url} did not list a model: {exc}"
            ) from exc
        if not models:
            raise EngineUnavailableError(f"the upstream at {self.base_url} lists no model")
        return models

    def default(self) -> str:
        return self._default or self.listed()[0].id

    def health(self) -> tuple[bool, str]:
        """Whether the upstream lists a model now, asked afresh (the readiness probe: the
        cached list would hide an upstream that went down after it was read)."""
        try:
            answer = httpx.get(self.base_url + "/models", headers=self.headers, timeout=2)
            answer.raise_for_status()
            listed = answer.json()["data"]
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            return False, f"the upstream does not answer ({type(exc).__name__})"
        if not listed:
            return False, "the upstream lists no model"
        return True, f"the upstream lists {len(listed)} model(s)"

    def client(self, name: str) -> UpstreamClient:
        """The client of model `name`; ModelNotFoundError when the upstream lists no such
        model (the configured default is taken on trust, as before)."""
        if name != self._default:
            listed = [m.id for m in self.listed()]
            if name not in listed:
                raise ModelNotFoundError(name, listed)
        return UpstreamClient(
            self.base_url,
            self.api_key,
            name,
            send_cache_salt=self.send_cache_salt,
            owner=self._owner(name),
        )

    def _owner(self, name: str) -> str:
        """Who the upstream says owns `name` ("" when it cannot be asked now)."""
        try:
            return next((m.owned_by for m in self.listed() if m.id == name), "")
        except EngineUnavailableError:
            return ""


class UpstreamClient:
    kind = "upstream"
    max_model_len: int | None = None
    tokenizer_id: str | None = None  # the upstream tokenizes its own prompts

    def __init__(
        self,
        base_url: str,
        api_key: str = "",
        model: str = "",
        timeout: float = 600,
        send_cache_salt: bool = True,
        owner: str = "",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # llama.cpp's server takes repeat_penalty where vLLM and this app take
        # repetition_penalty (and ignores a field it does not know).
        self.llama_cpp = owner == LLAMA_CPP
        self.send_cache_salt = send_cache_salt
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self.model_name = model
        self._streams: dict[str, asyncio.Task[None]] = {}
        self.requests_total = 0
        self._tools_known: tuple[float, bool | None] = (float("-inf"), None)

    # --- the EngineClient protocol (inference/client.py) ------------------------------

    def chat_prompt(self, turns: list[Turn], cache_salt: str | None = None) -> Prompt:
        return Prompt(messages=[{"role": t.role, "content": t.text} for t in turns])

    tool_format: str | None = None  # the upstream parses its own calls (UpstreamDelta)

    def tool_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool = True,
    ) -> Prompt:
        """OpenAI-shaped messages (calls with their arguments as JSON text) and tools, sent
        as they are. llama-server takes a named tool_choice as "auto" without a word: it is
        sent "required" with the named tool alone, which is the same promise."""
        if tools and isinstance(tool_choice, dict) and self.llama_cpp:
            name = (tool_choice.get("function") or {}).get("name")
            tools = [t for t in tools if (t.get("function") or {}).get("name") == name]
            tool_choice = "required"
        return UpstreamPrompt(
            messages=messages,
            tools=tools or None,
            tool_choice=tool_choice if tools else None,
            parallel_tool_calls=parallel_tool_calls,
        )

    async def supports_tools(self) -> bool | None:
        """Whether the upstream's template for this model has a tool format, where it says
        (llama-server's /props: it renders and parses tools only then, and drops them
        without a word otherwise); None when it does not say (read again after
        UpstreamModels.LIST_TTL_S)."""
        at, known = self._tools_known
        if not self.llama_cpp or time.monotonic() - at < UpstreamModels.LIST_TTL_S:
            return known
        root = self.base_url.removesuffix("/v1")
        try:
            async with httpx.AsyncClient(timeout=10) as http:
                answer = await http.get(root + "/props", headers=self.headers)
                answer.raise_for_status()
                caps = answer.json().get("chat_template_caps") or {}
            known = bool(caps["supports_tools"]) if "supports_tools" in caps else None
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.warning("the upstream at %s did not say whether it takes tools: %s", root, exc)
            known = None
        self._tools_known = (time.monotonic(), known)
        return known

    def system_prompt(self, text: str) -> Prompt:
        return Prompt(messages=[{"role": "system", "content": text}])

    def with_reply_started(self, prompt: Prompt, text: str) -> Prompt:
        """Chat messages cannot begin the reply: the prompt as it is."""
        return prompt

    def completion_prompt(self, prompt: str | list[int]) -> Prompt:
        if not isinstance(prompt, str):
            raise ValueError("token-id prompts are not supported with an upstream engine")
        return Prompt(text=prompt)

    def check_fits(self, prompt: Prompt) -> None:
        """The upstream knows its own context window; it answers for it."""

    def count_tokens(self, text: str) -> int | None:
        """The upstream tokenizes with its own tokenizer, unknown here."""
        return None

    def remember_reply(
        self, text: str, token_ids: list[int], cache_salt: str | None = None
    ) -> None:
        """Nothing to splice: the upstream tokenizes its own prompts."""

    def abort(self, request_id: str) -> None:
        task = self._streams.get(request_id)
        if task is not None:
            task.cancel()

    def stats(self) -> dict[str, Any]:
        return {
            "upstream": self.base_url,
            "model": self.model_name,
            "running": len(self._streams),
            "waiting": 0,
            "requests_total": self.requests_total,
        }

    def shutdown(self) -> None:
        for rid in list(self._streams):
            self.abort(rid)

    async def stream(
        self,
        prompt: Prompt,
        sampling: SamplingParams,
        session_id: str | None = None,
        request_id: str | None = None,
        cache_salt: str | None = None,
        replay: bool = True,
    ) -> AsyncIterator[Delta]:
        """The upstream's stream (`replay` has no meaning here: no response cache)."""
        rid = request_id or f"up-{time.monotonic_ns()}"
        body: dict[str, Any] = {
            "model": self.model_name,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = sampling.stop[:4]
        if sampling.ignore_eos:
            body["ignore_eos"] = True  # vLLM and llama-server honour it
        if session_id:
            body["user"] = session_id
        if cache_salt and self.send_cache_salt:
            # All of this app's users reach the upstream as one caller: the salt keeps
            # them apart in its prefix cache (vLLM and this app honour it).
            body["cache_salt"] = cache_salt
        if sampling.structured is not None:
            body["response_format"] = self._response_format(prompt, sampling)
        body.update(self._sampling_fields(sampling, chat=prompt.messages is not None))
        if isinstance(prompt, UpstreamPrompt) and prompt.tools:
            body["tools"], body["parallel_tool_calls"] = prompt.tools, prompt.parallel_tool_calls
            if prompt.tool_choice is not None:
                body["tool_choice"] = prompt.tool_choice
        if prompt.messages is not None:
            path, body["messages"] = "/chat/completions", prompt.messages
        else:
            path, body["prompt"] = "/completions", prompt.text
        figures = RequestFigures(arrival_time=time.time())
        queue: asyncio.Queue[Delta | BaseException] = asyncio.Queue()
        task = asyncio.get_running_loop().create_task(
            self._pump(path, body, rid, figures, queue, sampling.logprobs)
        )
        self._streams[rid] = task
        self.requests_total += 1
        try:
            async with contextlib.aclosing(until_finished(queue, task.cancel)) as deltas:
                async for item in deltas:
                    yield item
        finally:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            self._streams.pop(rid, None)

    def _sampling_fields(self, s: SamplingParams, chat: bool) -> dict[str, Any]:
        """The sampling settings beyond the basic ones, under the names OpenAI, vLLM and
        llama-server share; a setting at its default is not sent."""
        out: dict[str, Any] = {}
        if s.frequency_penalty:
            out["frequency_penalty"] = s.frequency_penalty
        if s.presence_penalty:
            out["presence_penalty"] = s.presence_penalty
        if s.logit_bias:
            out["logit_bias"] = {str(token): bias for token, bias in s.logit_bias}
        if s.top_k > 0:
            out["top_k"] = s.top_k
        if s.min_p > 0:
            out["min_p"] = s.min_p
        if s.repetition_penalty != 1.0:
            name = "repeat_penalty" if self.llama_cpp else "repetition_penalty"
            out[name] = s.repetition_penalty
        if s.logprobs is not None:
            # llama-server sends no logprobs at all for 0 alternatives: one is asked for
            # and dropped here.
            top = max(s.logprobs, 1)
            if chat:
                out["logprobs"], out["top_logprobs"] = True, top
            else:
                out["logprobs"] = top
        return out

    def _response_format(self, prompt: Prompt, sampling: SamplingParams) -> dict[str, Any]:
        """A JSON object or a JSON schema, as OpenAI's response_format: what llama-server,
        vLLM and Ollama all enforce on a chat. Other grammars (regex, choice, EBNF, tool
        tags) are xgrammar's and this engine's only."""
        kind = sampling.structured
        if prompt.messages is None or kind not in UPSTREAM_STRUCTURED:
            raise InvalidRequestError(
                f"structured output of kind {kind!r} is not supported by the model "
                f"'{self.model_name}' here"
            )
        if kind == "json":
            return {"type": "json_object"}
        schema = json.loads(sampling.structured_spec)
        return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}

    async def _pump(
        self,
        path: str,
        body: dict[str, Any],
        rid: str,
        m: RequestFigures,
        queue: asyncio.Queue[Delta | BaseException],
        top: int | None = None,
    ) -> None:
        finish, output_tokens = "stop", 0
        try:
            timeout = httpx.Timeout(self.timeout, connect=10)
            async with (
                httpx.AsyncClient(timeout=timeout) as http,
                http.stream("POST", self.base_url + path, json=body, headers=self.headers) as r,
            ):
                if r.status_code != 200:
                    await queue.put(
                        _error_for(r.status_code, (await r.aread()).decode(errors="replace"))
                    )
                    return
                m.scheduled_time = time.time()
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        error = chunk["error"] if isinstance(chunk["error"], dict) else {}
                        if m.first_token_time is None and _is_refusal(error):
                            # Nothing went out yet: the client's mistake is its 400.
                            await queue.put(_refusal(str(error.get("message")), error))
                            return
                        raise EngineError(str(error.get("message", "upstream error")))
                    usage = chunk.get("usage")
                    if usage:
                        m.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        details = usage.get("prompt_tokens_details") or {}
                        m.cached_tokens = int(details.get("cached_tokens") or 0)
                        output_tokens = int(usage.get("completion_tokens") or output_tokens)
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        text = delta.get("content") or choice.get("text") or ""
                        lps = _logprobs(choice.get("logprobs"), top) if top is not None else None
                        calls = delta.get("tool_calls") or None
                        if text or lps or calls:
                            now = time.time()
                            if m.first_token_time is None:
                                m.first_token_time = now
                            m.token_times.append(now)
                            await queue.put(
                                UpstreamDelta(rid, text=text, logprobs=lps, tool_calls=calls)
                            )
                        if choice.get("finish_reason"):
                            finish = "length" if choice["finish_reason"] == "length" else "stop"
        except asyncio.CancelledError:
            finish = "abort"
        except (httpx.HTTPError, ValueError, EngineError) as exc:
            log.warning("upstream request %s failed: %s", rid, exc)
            if m.first_token_time is None:
                await queue.put(EngineUnavailableError(f"the upstream engine failed: {exc}"))
                return
            finish = "error"
        m.finish_time = time.time()
        m.output_tokens = output_tokens or len(m.token_times)
        await queue.put(
            Delta(
                rid,
                finished=True,
                finish_reason=finish,
                figures=m,
                error="upstream stream broke" if finish == "error" else None,
            )
        )


def _error_for(status: int, text: str) -> EngineError:
    try:
        error = json.loads(text).get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    if not isinstance(error, dict):  # TGI's {"error": "...", "error_type": ...}
        error = {"message": str(error)}
    message = str(error.get("message") or text[:200] or f"upstream answered {status}")
    if status in (429, 503):
        return EngineBusyError(message)
    # OpenAI, vLLM and this app name an oversized prompt by its code; llama.cpp's server by
    # its type. Either way the API's client gets context_length_exceeded, as from our engine.
    too_long = error.get("code") == "context_length_exceeded" or (
        error.get("type") == "exceed_context_size_error"
    )
    if status == 400 and too_long:
        return PromptTooLongError(message)
    if status in (400, 422) or (status == 500 and _is_refusal(error)):
        # A field it does not take, a value out of its range: the client's mistake.
        return _refusal(message, error)
    if status == 500:  # the upstream engine failed; other statuses: it cannot be reached
        return EngineError(f"upstream answered {status}: {message}")
    return EngineUnavailableError(f"upstream answered {status}: {message}")


def _is_refusal(error: dict[str, Any]) -> bool:
    return error.get("type") == "invalid_request_error" and error.get("code") not in (
        "context_length_exceeded",
    )


def _refusal(message: str, error: dict[str, Any]) -> UpstreamRefusal:
    param = error.get("param")
    if not isinstance(param, str) or not param:
        named = _FIELD_IN_MESSAGE.match(message)
        param = named.group(1) if named else None
    return UpstreamRefusal(message, param)


def _logprobs(raw: Any, top: int) -> list[TokenLogprob] | None:
    """A chunk's logprobs as the API gives them back: chat's `content` list (which
    llama-server also sends on /completions) or a completion's parallel lists, each
    token with at most `top` alternatives."""
    if not isinstance(raw, dict):
        return None
    out: list[TokenLogprob] = []
    if isinstance(raw.get("content"), list):
        for t in raw["content"]:
            alternatives = [
                (str(a.get("token", "")), a.get("bytes"), _float(a.get("logprob")))
                for a in t.get("top_logprobs") or []
            ]
            out.append(_entry(t, alternatives, top))
    elif isinstance(raw.get("tokens"), list):
        lps = raw.get("token_logprobs") or []
        tops = raw.get("top_logprobs") or [None] * len(raw["tokens"])
        for token, lp, alt in zip(raw["tokens"], lps, tops, strict=False):
            pairs = sorted((alt or {}).items(), key=lambda kv: -_float(kv[1]))
            alternatives = [(str(a), None, _float(b)) for a, b in pairs]
            out.append(_entry({"token": token, "logprob": lp}, alternatives, top))
    return out or None


def _entry(
    t: dict[str, Any], alternatives: list[tuple[str, list[int] | None, float]], top: int
) -> UpstreamLogprob:
    return UpstreamLogprob(
        token_id=t["id"] if isinstance(t.get("id"), int) else -1,
        logprob=_float(t.get("logprob")),
        token=str(t.get("token", "")),
        bytes=t.get("bytes"),
        top_tokens=alternatives[:top],
    )


def _float(value: Any) -> float:
    """A logprob as sent; one the upstream left out (null) is -inf."""
    return float(value) if isinstance(value, int | float) else float("-inf")
