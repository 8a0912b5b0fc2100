"""OpenAI-compatible API: /v1/chat/completions, /v1/completions, /v1/models.

Each request names its model; it goes to that model's engine (inference.client), and a
model nobody serves is a 404 `model_not_found`, as OpenAI answers.

Served by the same ASGI app and engine as the chat UI. Requests carry
`Authorization: Bearer <key>` (keys are made on /settings/keys/). Every failure is an
OpenAI-style error object with the matching status, never a traceback. A client that
disconnects mid-stream cancels the response iterator, and closing the engine stream
aborts the request in the engine within one step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import ValidationError

from chatapp import db_worker
from chatapp.errors import openai_error_body
from chatapp.openai_api.keys import key_for_token
from chatapp.openai_api.limits import RateLimited, limiter
from chatapp.openai_api.models import ApiKey
from chatapp.openai_api.protocol import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    ChatCompletionBody,
    CommonBody,
    CompletionBody,
    Message,
    NamedToolChoice,
    Tool,
    dumps_schema,
    request_error,
)
from chatapp.openai_api.streams import recorded_stream
from chatapp.openai_api.tool_calls import (
    ForwardedCalls,
    HermesParser,
    constraint,
    parameters,
    template_tools,
)
from chatapp.text import InvalidText, clean_text
from inference.backends.upstream import (
    UPSTREAM_STRUCTURED,
    UpstreamClient,
    UpstreamLogprob,
    UpstreamRefusal,
)
from inference.chat_template import Turn
from inference.client import (
    EngineClient,
    EngineUnavailableError,
    ModelInfo,
    ModelNotFoundError,
    Prompt,
    get_engine_client,
    list_models,
    prefix_cache_salt,
)
from inference.engine import (
    Delta,
    EngineBusyError,
    EngineError,
    PromptTooLongError,
    SamplingParams,
)
from inference.engine.errors import InvalidRequestError
from inference.engine.json_schema_limits import check_enforceable
from inference.engine.outputs import TokenLogprob
from inference.workers.protocol import is_worker_lost

__all__ = ["CHAT_FIELDS", "COMPLETION_FIELDS", "ApiError", "ApiRequest", "parse_chat"]

BodyT = TypeVar("BodyT", bound=CommonBody)

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type_,
            param,
            code,
        )
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return openai_error_body(self.message, self.type, self.code, self.param)

    def response(self) -> JsonResponse:
        resp = JsonResponse(self.body(), status=self.status)
        for k, v in self.headers.items():
            resp[k] = v
        return resp


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass
class ApiRequest:
    model: str
    turns: list[Turn] | None = None
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    # vLLM's field: splits the key owner's prefix-cache scope further, never joins another's.
    cache_salt: str | None = None
    # Derived at the start of the request: the salt the caches are scoped by.
    scope: str = ""
    # Chat only: the messages as sent (tool calls and results), and the tools offered.
    messages: list[Message] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # Completions only: the prompt's text goes before each choice's text.
    echo: bool = False
    # Tools go to an upstream engine, which renders them and parses the calls itself.
    forwards_tools: bool = False

    @property
    def uses_tools(self) -> bool:
        """Tools offered, or calls and results in the history: the prompt needs the
        template's tool format."""
        return bool(self.tools) or any(
            m.tool_calls or m.role == "tool" for m in self.messages or ()
        )

    @property
    def parses_tools(self) -> bool:
        """The reply is read for tool calls (not with tool_choice "none")."""
        return bool(self.tools) and self.tool_choice != "none"

    def tool_parser(self) -> HermesParser | None:
        if not self.parses_tools:
            return None
        kind = ForwardedCalls if self.forwards_tools else HermesParser
        return kind(self.parallel_tool_calls)


# --- parsing --------------------------------------------------------------------------


def validated(cls: type[BodyT], body: dict) -> BodyT:
    """The body as its pydantic model, or the 400 naming the first field that is wrong."""
    try:
        return cls.model_validate(body, context={"max_new_tokens": settings.CHAT_MAX_NEW_TOKENS})
    except ValidationError as exc:
        message, param = request_error(exc, cls)
        raise invalid(message, param or None) from exc


def _text_ok(text: str, param: str) -> str:
    # No text can be longer in characters than the body is in bytes: the body limit
    # is the length limit here. The API stores no message text, so NUL passes: a model's
    # reply can hold one, and the next turn's history sends it back.
    try:
        return clean_text(text, f"'{param}'", settings.OPENAI_MAX_BODY_BYTES, stored=False)
    except InvalidText as exc:
        raise invalid(exc.message, param) from exc


def structured_output(b: CommonBody) -> tuple[str | None, str]:
    """(kind, spec) of the grammar a reply must follow (SamplingParams.structured)."""
    rf, so = b.response_format, b.structured_outputs
    if rf is not None and rf.type == "json_object":
        return "json", ""
    if rf is not None and rf.type == "json_schema":
        if rf.json_schema is None:
            raise invalid("a json_schema response_format needs 'json_schema'", "response_format")
        return schema_spec(rf.json_schema.schema_, "response_format")
    if so is not None:
        b = CommonBody.model_construct(
            guided_json=so.json_, guided_regex=so.regex, guided_choice=so.choice,
            guided_grammar=so.grammar,
        )  # fmt: skip
        if so.json_object:
            return "json", ""
    if b.guided_json is not None:
        return schema_spec(b.guided_json, "structured_outputs" if so else "guided_json")
    if b.guided_regex is not None:
        return "regex", b.guided_regex
    if b.guided_choice is not None:
        return "choice", json.dumps(b.guided_choice)
    grammar = b.grammar if b.grammar is not None else b.guided_grammar
    if grammar is not None:
        return "grammar", grammar
    return None, ""


def schema_spec(schema: dict[str, Any] | str | bool, param: str) -> tuple[str, str]:
    """("json_schema", the schema's text); a 400 naming `param` and the keyword where the
    schema asks for what the grammar would not enforce (json_schema_limits)."""
    spec = dumps_schema(schema)
    try:
        check_enforceable(json.loads(spec))
    except ValueError:
        pass  # not JSON: the engine's compile says so
    except InvalidRequestError as exc:
        raise invalid(str(exc), param) from exc
    return "json_schema", spec


def tool_constraint(b: ChatCompletionBody) -> tuple[str | None, str]:
    """With tool_choice "required" or a named function, the reply is calls only, held to
    the tools' schemas while decoding (a structural tag): it always parses."""
    choice = b.tool_choice
    if not b.tools or choice is None or choice in ("auto", "none"):
        return None, ""
    if structured_output(b)[0] is not None:
        raise invalid(
            "a required or named 'tool_choice' decides the reply's format; "
            "send it without response_format or a grammar",
            "tool_choice",
        )
    for tool in b.tools:
        schema_spec(parameters(tool), "tools")
    return "structural_tag", constraint(b.tools, choice, b.parallel_tool_calls is not False)


def parse_common(
    b: CommonBody, max_tokens: int | None, logprobs: int | None, tools: tuple[str | None, str]
) -> ApiRequest:
    kind, spec = tools if tools[0] is not None else structured_output(b)
    bias = [(int(t), float(v)) for t, v in (b.logit_bias or {}).items()]
    sampling = SamplingParams(
        max_tokens=max_tokens or settings.CHAT_MAX_NEW_TOKENS,
        temperature=1.0 if b.temperature is None else b.temperature,
        top_p=b.top_p or 1.0,
        top_k=max(b.top_k or 0, 0),
        min_p=b.min_p or 0.0,
        repetition_penalty=b.repetition_penalty or 1.0,
        frequency_penalty=b.frequency_penalty or 0.0,
        presence_penalty=b.presence_penalty or 0.0,
        logit_bias=bias,
        logprobs=logprobs,
        seed=b.seed,
        stop=list(b.stop or []),
        # vLLM's and llama-server's extra field: generate max_tokens whatever the model's
        # end-of-sequence token says (benchmarks compare replies of one length).
        ignore_eos=b.ignore_eos,
        structured=kind,
        structured_spec=spec,
    )
    return ApiRequest(
        model=b.model,
        sampling=sampling,
        n=b.n or 1,
        stream=b.stream,
        include_usage=bool(b.stream_options and b.stream_options.include_usage),
        user=b.user,
        cache_salt=b.cache_salt,
    )


def parse_chat(body: dict) -> ApiRequest:
    b = validated(ChatCompletionBody, body)
    # Two names for one limit (max_tokens is the older): both are checked, and when both
    # are given they must agree rather than one silently winning.
    limit = b.max_completion_tokens or b.max_tokens
    logprobs = (b.top_logprobs or 0) if b.logprobs else None
    req = parse_common(b, limit, logprobs, tool_constraint(b))
    req.turns = [
        Turn(m.role, _text_ok(m.text, f"messages[{i}].content")) for i, m in enumerate(b.messages)
    ]
    req.messages = b.messages
    req.tools = b.tools
    req.tool_choice = b.tool_choice
    req.parallel_tool_calls = b.parallel_tool_calls is not False
    return req


def parse_completion(body: dict) -> ApiRequest:
    b = validated(CompletionBody, body)
    req = parse_common(b, b.max_tokens or 16, b.logprobs, (None, ""))
    if isinstance(b.prompt, str):
        req.prompt_text = _text_ok(b.prompt, "prompt")
    else:
        req.prompt_ids = b.prompt
    req.echo = bool(b.echo)
    return req


def echoed(client: EngineClient, req: ApiRequest) -> str:
    """The text `echo` puts before a completion: the prompt as sent, or its ids decoded."""
    if not req.echo:
        return ""
    if req.prompt_text is not None:
        return req.prompt_text
    # Token-id prompts reach only backends with a tokenizer (an upstream refuses them),
    # which the EngineClient protocol does not name.
    return str(getattr(client, "tokenizer").decode(req.prompt_ids or []))  # noqa: B009


# --- plumbing ---------------------------------------------------------------------------


# Seconds a client should wait before sending again (the Retry-After header): a full
# queue drains in about a second; a missing worker or Redis takes longer to come back.
RETRY_BUSY_S = 1
RETRY_UNAVAILABLE_S = 5
RETRY_WORKER_LOST_S = 1


def server_error(status: int, message: str, code: str, retry_after: int | None = None) -> ApiError:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return ApiError(status, message, "server_error", code=code, headers=headers)


def engine_failure(exc: EngineError, param: str = "messages") -> ApiError:
    """The status and code of an engine-side failure (docs/api.md, "Errors"), chosen by the
    error's type. Only the client's own mistakes are 400s (and 404 for a model nobody
    serves); the rest are the server's, and those a retry can get past carry Retry-After."""
    if isinstance(exc, ModelNotFoundError):
        return model_not_found(exc.model)
    if isinstance(exc, EngineBusyError):
        return server_error(503, "The engine is busy; retry shortly.", "busy", RETRY_BUSY_S)
    if isinstance(exc, PromptTooLongError):
        return invalid(str(exc), param, "context_length_exceeded")
    if isinstance(exc, UpstreamRefusal):
        # The field the upstream named, if it named one: its words are not ours to guess.
        return invalid(str(exc), exc.param)
    if isinstance(exc, InvalidRequestError):
        return invalid(str(exc), param)
    if isinstance(exc, EngineUnavailableError):
        # The reason (no worker, Redis away and its address) is for the operator's log.
        log.warning("engine unavailable: %s", exc)
        return server_error(
            503,
            "The model is not available right now; retry shortly.",
            "engine_unavailable",
            RETRY_UNAVAILABLE_S,
        )
    log.error("engine error: %s", exc)
    return engine_failed()


def failed_reply(delta: Delta) -> ApiError:
    """The error of a reply the engine ended with finish_reason "error"."""
    if is_worker_lost(delta):
        # The chat socket's `worker_lost` too: the worker stopped or died mid-reply, and
        # sent again the request runs on another one.
        return server_error(
            503,
            "The engine worker serving this request stopped; send the request again.",
            "worker_lost",
            RETRY_WORKER_LOST_S,
        )
    log.error("engine error on %s: %s", delta.request_id, delta.error)
    return engine_failed()


def engine_failed() -> ApiError:
    return server_error(500, "The engine failed while generating.", "engine_error")


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model '{model[:100]}' does not exist",
        param="model",
        code="model_not_found",
    )


async def engine_client(model: str) -> EngineClient:
    """The engine client of `model`; 404 when nobody serves it."""
    try:
        return await asyncio.to_thread(get_engine_client, model)
    except EngineError as exc:
        raise engine_failure(exc) from exc


async def authenticate(request: HttpRequest) -> ApiKey:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "Missing API key: send 'Authorization: Bearer <key>'.",
            "invalid_request_error",
            code="invalid_api_key",
        )
    key = await db_worker.run(key_for_token, token.strip())
    if key is None:
        raise ApiError(
            401, "Incorrect API key provided.", "invalid_request_error", code="invalid_api_key"
        )
    return key


def read_body(request: HttpRequest) -> dict:
    too_large = ApiError(413, "The request body is too large.", code="request_too_large")
    # The declared length first: reading a body over DATA_UPLOAD_MAX_MEMORY_SIZE makes
    # Django answer with its own HTML 400 page instead of this error object.
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > settings.OPENAI_MAX_BODY_BYTES:
        raise too_large
    try:
        raw = request.body
    except RequestDataTooBig as exc:
        raise too_large from exc
    if len(raw) > settings.OPENAI_MAX_BODY_BYTES:
        raise too_large
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise invalid("We could not parse the JSON body of your request.") from exc
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    return body


def usage(last: Delta, prompt_len: int | None, ids: list[int]) -> dict[str, Any]:
    """Token counts from the final delta's figures; an upstream engine reports its own."""
    m = last.figures
    prompt = prompt_len if prompt_len is not None else (m.prompt_tokens if m else 0)
    completion = m.output_tokens if m else len(ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": m.cached_tokens + m.cached_tokens_redis if m else 0
        },
    }


def total_usage(prompt_len: int | None, lasts: list[Delta], ids: list[list[int]]) -> dict[str, Any]:
    """Usage of n choices: the prompt once (they share it), their completions summed."""
    total = usage(lasts[0], prompt_len, ids[0])
    for last, i in zip(lasts[1:], ids[1:], strict=True):
        total["completion_tokens"] += usage(last, prompt_len, i)["completion_tokens"]
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    return total


def envelope(rid: str, obj: str, created: int, model: str, choices: list) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


async def starting_with(first: Delta, stream: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    """The engine stream again, with the delta already pulled before the headers."""
    yield first
    if not first.finished:
        async for delta in stream:
            yield delta


def finish_reason(delta: Delta, called: bool = False) -> str:
    if delta.finish_reason == "length":
        return "length"
    return "tool_calls" if called else "stop"


def reply_message(
    req: ApiRequest, text: str, last: Delta, forwarded: list[dict[str, Any]]
) -> tuple[dict[str, Any], str]:
    """A whole reply as chat.completion's message, its tool calls parsed out (or, from an
    upstream, its `forwarded` call pieces put together), and its finish_reason."""
    parser = req.tool_parser()
    if parser is not None:
        parsed(parser, text, forwarded, final=True)
        if parser.calls:
            message = {"role": "assistant", "content": parser.content,
                       "tool_calls": parser.tool_calls()}  # fmt: skip
            return message, finish_reason(last, called=True)
    return {"role": "assistant", "content": text}, finish_reason(last)


def parsed(
    parser: HermesParser, text: str, calls: list[dict[str, Any]] | None, final: bool
) -> list[dict[str, Any]]:
    """The message deltas of a reply's next text (and an upstream's next call pieces)."""
    if isinstance(parser, ForwardedCalls):
        return parser.feed(text, calls)
    return parser.feed(text) + (parser.finish() if final else [])


def api_view(handler: Any) -> Any:
    @csrf_exempt
    async def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        try:
            return await handler(request, **kwargs)
        except ApiError as exc:
            return exc.response()

    view.__name__ = handler.__name__
    return view


def template_messages(req: ApiRequest, raw_arguments: bool = False) -> list[dict[str, Any]]:
    """The messages as chat templates take them: each turn's checked text, an assistant's
    calls with their arguments as objects (what templates write with `tojson`; as the
    client's JSON text for an upstream, which takes OpenAI's shape), a tool result with
    the id of the call it answers."""
    assert req.turns is not None and req.messages is not None
    out: list[dict[str, Any]] = []
    for turn, m in zip(req.turns, req.messages, strict=True):
        msg: dict[str, Any] = {"role": turn.role, "content": turn.text}
        if m.tool_calls:
            msg["content"] = turn.text or None
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": c.function.arguments
                        if raw_arguments
                        else _arguments(c.function.arguments),
                    },
                }
                for c in m.tool_calls
            ]
        if m.role == "tool":
            msg["tool_call_id"] = m.tool_call_id
            if m.name:
                msg["name"] = m.name
        out.append(msg)
    return out


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def build_prompt(client: EngineClient, req: ApiRequest, cache_salt: str) -> Prompt:
    try:
        if req.uses_tools:
            tools = template_tools(req.tools) if req.tool_choice != "none" else None
            if isinstance(client, UpstreamClient):
                choice = req.tool_choice
                return client.tool_prompt(
                    template_messages(req, raw_arguments=True),
                    tools,
                    choice.model_dump() if isinstance(choice, NamedToolChoice) else choice,
                    req.parallel_tool_calls,
                )
            return client.tool_prompt(template_messages(req), tools)
        if req.turns is not None:
            return client.chat_prompt(req.turns, cache_salt=cache_salt)
        source = req.prompt_ids if req.prompt_ids is not None else req.prompt_text
        assert source is not None  # parse_completion sets one of the two
        return client.completion_prompt(source)
    except ValueError as exc:
        raise invalid(str(exc), "prompt") from exc


@dataclass
class Choice:
    """One of a request's `n` choices: its own engine stream and first delta."""

    index: int
    stream: AsyncGenerator[Delta, None]
    first: Delta
    replayed: bool = False


def choice_sampling(sampling: SamplingParams, index: int) -> SamplingParams:
    """Choice i's settings: a seeded request's choices draw from seeds seed, seed + 1, ...
    (vLLM's rule), so that n=3 with a seed gives three different, repeatable replies."""
    if index == 0 or sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=sampling.seed + index)


async def open_choice(
    client: EngineClient, req: ApiRequest, prompt: Prompt, key: ApiKey, index: int
) -> Choice:
    """Start one choice's engine stream and pull its first delta (refusals raise here)."""
    param = "messages" if req.turns is not None else "prompt"
    # Its end is announced when this stream closes (streams.py): observability records it.
    request_id = f"api-{uuid.uuid4().hex}"
    engine_stream = client.stream(
        prompt,
        choice_sampling(req.sampling, index),
        session_id=req.user,
        request_id=request_id,
        cache_salt=req.scope,
        # The response cache keeps text and ids, not logprobs.
        replay=req.sampling.logprobs is None,
    )
    stream = recorded_stream(
        engine_stream,
        "api",
        user_id=key.owner_id,
        prompt_tokens=prompt.length,
        request_id=request_id,
        model=client.model_name,
    )
    try:
        first = await stream.__anext__()
    except EngineError as exc:
        await stream.aclose()
        raise engine_failure(exc, param) from exc
    if first.finish_reason == "error":
        # Failed before any byte went out: a status, not a 200 with an error event.
        await stream.aclose()
        raise failed_reply(first)
    return Choice(index, stream, first, bool(getattr(engine_stream, "replayed", False)))


def forwarded_structure(req: ApiRequest) -> bool:
    return req.turns is not None and req.sampling.structured in UPSTREAM_STRUCTURED


async def upstream_tools(client: UpstreamClient, req: ApiRequest) -> None:
    """Tools go to an upstream engine as they are: its template renders them and it parses
    the calls. Not where it says its template has no tool format (llama-server drops tools
    without a word there: the reply would never call); a required or named tool_choice is
    then its own grammar's, not this engine's structural tag."""
    if not req.uses_tools:
        return
    if await client.supports_tools() is False:
        raise invalid(
            f"the model '{req.model}' does not support tools: the upstream engine's chat "
            "template for it has no tool-call format",
            "tools" if req.tools else "messages",
        )
    req.forwards_tools = True
    if req.sampling.structured == "structural_tag":
        req.sampling = dataclasses.replace(req.sampling, structured=None, structured_spec="")


def upstream_refuses(req: ApiRequest) -> None:
    """An upstream engine is sent what SamplingParams it forwards (backends/upstream.py):
    a field it is not sent is refused by name rather than ignored."""
    p = req.sampling
    # A JSON object or schema on a chat is forwarded as response_format (upstream.py).
    if p.structured is not None and not forwarded_structure(req):
        raise invalid(
            f"'response_format' is not supported by the model '{req.model}' here",
            "response_format",
        )


async def start_stream(
    request: HttpRequest, req: ApiRequest, key: ApiKey
) -> tuple[EngineClient, Prompt, list[Choice], Callable[[], Awaitable[None]]]:
    """Check limits, build the prompt and pull each choice's first delta before any header
    goes out, so that busy / too long / unavailable become proper statuses.

    With n > 1 the first choice runs alone until its first token: by then its prompt's KV
    blocks are in the prefix cache, and the other choices find them there instead of
    computing the prompt again (prefix sharing, one prefill)."""
    client = await engine_client(req.model)
    if isinstance(client, UpstreamClient):
        await upstream_tools(client, req)
    if getattr(client, "tokenizer", None) is None:
        upstream_refuses(req)
    if req.uses_tools and client.tool_format is None and not req.forwards_tools:
        raise invalid(
            f"the model '{req.model}' does not support tools: its chat template has no "
            "tool-call format this server reads (Hermes-style <tool_call> JSON)",
            "tools" if req.tools else "messages",
        )
    try:
        release = await limiter.acquire(key, request)
    except RateLimited as exc:
        raise ApiError(
            429,
            str(exc),
            "rate_limit_exceeded",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(exc.retry_after)},
        ) from exc
    choices: list[Choice] = []
    try:
        # The key owner's scope in the prefix, response and reply caches (docs/kv-tier.md).
        req.scope = prefix_cache_salt(key.owner_id, req.cache_salt)
        prompt = await asyncio.to_thread(build_prompt, client, req, req.scope)
        try:
            client.check_fits(prompt)
        except EngineError as exc:
            raise engine_failure(exc, "messages" if req.turns is not None else "prompt") from exc
        choices.append(await open_choice(client, req, prompt, key, 0))
        if req.n > 1:
            rest = await asyncio.gather(
                *(open_choice(client, req, prompt, key, i) for i in range(1, req.n)),
                return_exceptions=True,
            )
            choices += [c for c in rest if isinstance(c, Choice)]
            failed = [c for c in rest if isinstance(c, BaseException)]
            if failed:
                raise failed[0]
        return client, prompt, choices, release
    except BaseException:
        for c in choices:
            await c.stream.aclose()
        await release()
        raise


async def collect(
    choice: Choice,
) -> tuple[str, list[int], list[TokenLogprob], Delta, list[dict[str, Any]]]:
    """A choice's whole reply: its text, ids, logprobs, last delta and an upstream's
    tool-call pieces."""
    text, ids, last = "", [], choice.first
    logprobs: list[TokenLogprob] = []
    calls: list[dict[str, Any]] = []
    async for last in starting_with(choice.first, choice.stream):
        text += last.text
        ids.extend(last.token_ids)
        logprobs.extend(last.logprobs or ())
        calls.extend(getattr(last, "tool_calls", None) or ())
    return text, ids, logprobs, last, calls


async def interleaved(choices: list[Choice]) -> AsyncIterator[tuple[int, Delta]]:
    """Every choice's deltas as they come, each with its choice's index."""
    if len(choices) == 1:
        async for delta in starting_with(choices[0].first, choices[0].stream):
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, Delta | None]] = asyncio.Queue()

    async def pump(c: Choice) -> None:
        try:
            async for delta in starting_with(c.first, c.stream):
                await queue.put((c.index, delta))
        finally:
            await queue.put((c.index, None))

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    try:
        open_choices = len(choices)
        while open_choices:
            index, item = await queue.get()
            if item is None:
                open_choices -= 1
            else:
                yield index, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --- logprobs in OpenAI's two shapes ---------------------------------------------------


def token_text(tokenizer: Any, token: int) -> str:
    return str(tokenizer.decode([token]))


# A token as the API names it: its text, its bytes (None: the text's UTF-8), its logprob.
Named = tuple[str, list[int] | None, float]


def named(tokenizer: Any, t: TokenLogprob) -> tuple[Named, list[Named]]:
    """A sampled token and its alternatives, named: decoded here, or as an upstream
    engine named them (it has the tokenizer, this app does not)."""
    if isinstance(t, UpstreamLogprob):
        return (t.token, t.bytes, t.logprob), t.top_tokens
    alternatives: list[Named] = [(token_text(tokenizer, a), None, b) for a, b in t.top]
    return (token_text(tokenizer, t.token_id), None, t.logprob), alternatives


def chat_logprobs(tokenizer: Any, logprobs: list[TokenLogprob]) -> dict[str, Any]:
    """chat.completion's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}]}."""

    def entry(token: Named) -> dict[str, Any]:
        text, raw, lp = token
        return {"token": text, "logprob": lp, "bytes": list(text.encode()) if raw is None else raw}

    content = []
    for t in logprobs:
        sampled, alternatives = named(tokenizer, t)
        content.append({**entry(sampled), "top_logprobs": [entry(a) for a in alternatives]})
    return {"content": content}


def completion_logprobs(
    tokenizer: Any, logprobs: list[TokenLogprob], offset: int = 0
) -> dict[str, Any]:
    """text_completion's `logprobs`: parallel lists of tokens, logprobs, tops and offsets."""
    tokens = [named(tokenizer, t) for t in logprobs]
    offsets = []
    for (text, _, _), _ in tokens:
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": [text for (text, _, _), _ in tokens],
        "token_logprobs": [lp for (_, _, lp), _ in tokens],
        "top_logprobs": [{text: lp for text, _, lp in alts} for _, alts in tokens],
        "text_offset": offsets,
    }


def logprobs_of(
    client: EngineClient, req: ApiRequest, chat: bool, logprobs: list[TokenLogprob], offset: int
) -> dict[str, Any] | None:
    if req.sampling.logprobs is None:
        return None
    tokenizer = getattr(client, "tokenizer", None)
    if chat:
        return chat_logprobs(tokenizer, logprobs)
    return completion_logprobs(tokenizer, logprobs, offset)


# --- endpoints --------------------------------------------------------------------------


def model_object(m: ModelInfo) -> dict[str, Any]:
    """OpenAI's four fields, then what the files hold where known (extra fields, as vLLM's
    max_model_len: clients ignore what they do not read)."""
    known = {
        "architecture": m.architecture,
        "weight_format": m.weight_format,
        "context_length": m.context_tokens,
    }
    return {
        "id": m.id, "object": "model", "created": m.created, "owned_by": m.owned_by,
        **{k: v for k, v in known.items() if v is not None},
    }  # fmt: skip


async def served_models() -> list[ModelInfo]:
    try:
        return await asyncio.to_thread(list_models)
    except EngineError as exc:
        raise engine_failure(exc) from exc


@api_view
async def models(request: HttpRequest) -> HttpResponse:
    """GET /v1/models: every model served, the default first."""
    if request.method != "GET":
        raise ApiError(405, "Use GET.", code="method_not_allowed")
    await authenticate(request)
    data = [model_object(m) for m in await served_models()]
    return JsonResponse({"object": "list", "data": data})


@api_view
async def model(request: HttpRequest, model_id: str) -> HttpResponse:
    """GET /v1/models/{model}: one served model, 404 `model_not_found` for any other."""
    if request.method != "GET":
        raise ApiError(405, "Use GET.", code="method_not_allowed")
    await authenticate(request)
    found = next((m for m in await served_models() if m.id == model_id), None)
    if found is None:
        raise model_not_found(model_id)
    return JsonResponse(model_object(found))


@api_view
async def chat_completions(request: HttpRequest) -> HttpResponse:
    return await _complete(request, chat=True)


@api_view
async def completions(request: HttpRequest) -> HttpResponse:
    return await _complete(request, chat=False)


async def _complete(request: HttpRequest, chat: bool) -> HttpResponse:
    if request.method != "POST":
        raise ApiError(405, "Use POST.", code="method_not_allowed")
    key = await authenticate(request)
    body = read_body(request)
    req = parse_chat(body) if chat else parse_completion(body)
    client, prompt, choices, release = await start_stream(request, req, key)
    created = int(time.time())
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    replayed = all(c.replayed for c in choices)
    if req.stream:
        events = sse_events(client, req, rid, created, chat, prompt.length, choices, release)
        response = StreamingHttpResponse(events, content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        if replayed:
            response["X-Response-Cache"] = "hit"
        return response
    try:
        results = await asyncio.gather(*(collect(c) for c in choices))
    finally:
        for c in choices:
            await c.stream.aclose()
        await release()
    out = []
    for c, (text, ids, logprobs, last, calls) in zip(choices, results, strict=True):
        if last.finish_reason == "error":
            raise failed_reply(last)
        lps = logprobs_of(client, req, chat, logprobs, 0)
        if chat:
            message, finish = reply_message(req, text, last, calls)
            if c.index == 0 and "tool_calls" not in message:
                client.remember_reply(text, ids, req.scope)
            out.append(
                {"index": c.index, "message": message, "finish_reason": finish, "logprobs": lps}
            )
        else:
            out.append(
                {"index": c.index, "text": echoed(client, req) + text,
                 "finish_reason": finish_reason(last), "logprobs": lps}
            )  # fmt: skip
    obj = "chat.completion" if chat else "text_completion"
    body = envelope(rid, obj, created, req.model, out)
    body["usage"] = total_usage(prompt.length, [r[3] for r in results], [r[1] for r in results])
    response = JsonResponse(body)
    if replayed:
        response["X-Response-Cache"] = "hit"
    return response


async def sse_events(
    client: EngineClient,
    req: ApiRequest,
    rid: str,
    created: int,
    chat: bool,
    prompt_len: int | None,
    choices: list[Choice],
    release: Callable[[], Awaitable[None]],
) -> AsyncIterator[bytes]:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(index: int, fields: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": index, "logprobs": None, **fields, "finish_reason": finish}
        body = envelope(rid, obj, created, req.model, [choice])
        if req.include_usage:
            body["usage"] = None
        return sse(body)

    def piece(text: str) -> dict[str, Any]:
        return {"delta": {"content": text}} if chat else {"text": text}

    n = len(choices)
    ids: list[list[int]] = [[] for _ in range(n)]
    texts = [""] * n
    lasts: list[Delta | None] = [None] * n
    # Each choice's tool-call parser: content and calls go out as the parser reads them.
    parsers = [req.tool_parser() if chat else None for _ in range(n)]
    try:
        if chat:
            for i in range(n):
                yield chunk(i, {"delta": {"role": "assistant", "content": ""}})
        elif req.echo:
            for i in range(n):
                yield chunk(i, piece(echoed(client, req)))
        async for i, delta in interleaved(choices):
            if delta.finish_reason == "error":
                # The status line went out long ago: the error travels as an `error` event.
                yield sse(failed_reply(delta).body(), event="error")
                break
            parser = parsers[i]
            if parser is not None:
                calls = getattr(delta, "tool_calls", None)
                pieces = parsed(parser, delta.text, calls, final=delta.finished)
                # A delta's logprobs ride on its first piece (or an empty delta while the
                # parser holds its text back).
                lps = delta.logprobs and logprobs_of(client, req, chat, delta.logprobs, 0)
                for k, fields in enumerate(pieces or ([{}] if lps else [])):
                    yield chunk(i, {"delta": fields, "logprobs": lps if k == 0 else None})
            elif delta.text or delta.logprobs:
                fields = piece(delta.text)
                if delta.logprobs:
                    fields["logprobs"] = logprobs_of(
                        client, req, chat, delta.logprobs, len(texts[i])
                    )
                yield chunk(i, fields)
            ids[i].extend(delta.token_ids)
            texts[i] += delta.text
            if delta.finished:
                lasts[i] = delta
                called = parser is not None and bool(parser.calls)
                end = finish_reason(delta, called)
                yield chunk(i, piece("") if not chat else {"delta": {}}, end)
        else:
            if req.include_usage:
                body = envelope(rid, obj, created, req.model, [])
                done = [d for d in lasts if d is not None]
                body["usage"] = total_usage(prompt_len, done, ids)
                yield sse(body)
            if chat and not (parsers[0] is not None and parsers[0].calls):
                client.remember_reply(texts[0], ids[0], req.scope)
        # The key's slot is free before the client reads the end (limits.acquire).
        await release()
        yield b"data: [DONE]\n\n"
    finally:
        for c in choices:
            await c.stream.aclose()
        await release()
