"""The request bodies of /v1/chat/completions and /v1/completions, one pydantic model each
(vLLM's protocol.py is the pattern): the fields, their types and bounds are declared once
here, and `request_error` turns pydantic's first complaint into the OpenAI-style 400 this
API has always answered ("'temperature' must be between 0 and 2", param "temperature").

Bounds that depend on settings (max_tokens) come in through the validation context.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

# OpenAI's limits on stop strings (the engine's own, in sampling_params.py, are looser).
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
# OpenAI's cap on top_logprobs; completions' `logprobs` takes the same (OpenAI says 5).
MAX_TOP_LOGPROBS = 20
# Choices per request: each is a sequence of its own in the engine.
MAX_N = 16
INT64 = (-(1 << 63), (1 << 63) - 1)


def refuse(message: str, param: str) -> PydanticCustomError:
    """A complaint with our own words and param (request_error passes both on as they are)."""
    return PydanticCustomError("api", "{message}", {"message": message, "param": param})


def _default_only(name: str, value: Any, defaults: tuple[Any, ...]) -> Any:
    if value not in defaults:
        raise refuse(f"'{name}' is not supported with a value other than its default", name)
    return value


STRUCTURED_FIELDS = (
    "response_format", "grammar", "structured_outputs", "guided_json", "guided_regex",
    "guided_choice", "guided_grammar",
)  # fmt: skip


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(Strict):
    include_usage: bool | None = None


class JsonSchemaFormat(Strict):
    name: str = "response"
    description: str | None = None
    # `schema` shadows a BaseModel attribute, hence the alias.
    schema_: dict[str, Any] | bool = Field(default=True, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(Strict):
    """vLLM's `structured_outputs` extra (and its older `guided_*` fields): one of these."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class FunctionDef(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class ToolCallFunction(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(Strict):
    role: str
    content: Any = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @field_validator("role")
    @classmethod
    def _role(cls, role: str) -> str:
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise refuse("role must be system, user, assistant or tool", "role")
        return "system" if role == "developer" else role

    @field_validator("content")
    @classmethod
    def _content(cls, content: Any) -> Any:
        if content is None or isinstance(content, str):
            return content
        if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            return "".join(p["text"] for p in content)
        if isinstance(content, list):
            raise refuse("only text content parts are supported", "content")
        raise refuse("'content' must be a string or a list of text parts", "content")

    @model_validator(mode="after")
    def _shape(self) -> Message:
        if self.content is None and self.role != "assistant":
            raise refuse("'content' must be a string or a list of text parts", "content")
        if self.tool_calls is not None and self.role != "assistant":
            raise refuse("only assistant messages carry tool_calls", "tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise refuse("a tool message needs the tool_call_id it answers", "tool_call_id")
        return self

    @property
    def text(self) -> str:
        return self.content or ""


class CommonBody(Strict):
    """The fields both endpoints take. A null is the field's default, as OpenAI takes it,
    except for the flags (stream, ignore_eos), which must be booleans."""

    model: Any = None
    max_tokens: int | None = None
    temperature: Annotated[float | None, Field(ge=0, le=2)] = None
    top_p: Annotated[float | None, Field(ge=0, le=1)] = None
    stop: Any = None
    seed: Annotated[int | None, Field(ge=INT64[0], le=INT64[1])] = None
    n: Annotated[int | None, Field(ge=1, le=MAX_N)] = None
    stream: bool = False
    stream_options: Any = None
    user: Any = None
    cache_salt: Any = None
    frequency_penalty: Annotated[float | None, Field(ge=-2, le=2)] = None
    presence_penalty: Annotated[float | None, Field(ge=-2, le=2)] = None
    logit_bias: dict[str, Any] | None = None
    # vLLM's and llama-server's extras.
    ignore_eos: bool = False
    top_k: Annotated[int | None, Field(ge=-1, le=1 << 20)] = None
    min_p: Annotated[float | None, Field(ge=0, le=1)] = None
    repetition_penalty: Annotated[float | None, Field(gt=0, le=10)] = None
    # Structured outputs: OpenAI's response_format, llama.cpp's grammar, vLLM's extras.
    response_format: ResponseFormat | None = None
    grammar: str | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # Accepted at their defaults only.
    best_of: Any = None
    suffix: Any = None
    store: Any = None
    metadata: Any = None
    service_tier: Any = None

    @field_validator("model", mode="plain")
    @classmethod
    def _model(cls, model: Any) -> str:
        if not isinstance(model, str) or not model:
            raise refuse("you must provide a model parameter", "model")
        return model

    @field_validator("max_tokens", "max_completion_tokens", check_fields=False)
    @classmethod
    def _token_limit(cls, value: int | None, info: ValidationInfo) -> int | None:
        hi = (info.context or {}).get("max_new_tokens", 1 << 31)
        if value is not None and not 1 <= value <= hi:
            raise refuse(f"'{info.field_name}' must be between 1 and {hi}", str(info.field_name))
        return value

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, value: float | None) -> float | None:
        if value == 0:
            raise refuse("'top_p' must be greater than 0", "top_p")
        return value

    @field_validator("stop", mode="plain")
    @classmethod
    def _stop(cls, stop: Any) -> list[str]:
        if stop is None:
            return []
        if isinstance(stop, str):
            stop = [stop]
        if (
            not isinstance(stop, list)
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop)
            or len(stop) > MAX_STOP_STRINGS
        ):
            raise refuse(
                f"'stop' must be a non-empty string of at most {MAX_STOP_CHARS} characters, "
                f"or a list of at most {MAX_STOP_STRINGS} of them",
                "stop",
            )
        return stop

    @field_validator("stream_options", mode="plain")
    @classmethod
    def _stream_options(cls, options: Any) -> StreamOptions | None:
        if options is None:
            return None
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise refuse("'stream_options' takes only include_usage", "stream_options")
        return StreamOptions(include_usage=bool(options.get("include_usage")))

    @field_validator("user", mode="plain")
    @classmethod
    def _user(cls, user: Any) -> str | None:
        if user is not None and (not isinstance(user, str) or len(user) > 256):
            raise refuse("'user' must be a string", "user")
        return user

    @field_validator("cache_salt", mode="plain")
    @classmethod
    def _cache_salt(cls, salt: Any) -> str | None:
        if salt is not None and (not isinstance(salt, str) or not salt or len(salt) > 256):
            raise refuse(
                "'cache_salt' must be a non-empty string of at most 256 characters", "cache_salt"
            )
        return salt

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, bias: dict[str, Any] | None) -> dict[str, Any] | None:
        for token, value in (bias or {}).items():
            if not token.isdigit() or isinstance(value, bool):
                raise refuse("'logit_bias' maps token ids (as strings) to numbers", "logit_bias")
            if not isinstance(value, int | float) or not -100 <= value <= 100:
                raise refuse("'logit_bias' values must be between -100 and 100", "logit_bias")
        if bias is not None and len(bias) > 300:
            raise refuse("'logit_bias' takes at most 300 tokens", "logit_bias")
        return bias

    @field_validator("best_of", mode="plain")
    @classmethod
    def _best_of(cls, value: Any) -> Any:
        return _default_only("best_of", value, (None, 1))

    @field_validator("suffix", "metadata", mode="plain")
    @classmethod
    def _none_only(cls, value: Any, info: ValidationInfo) -> Any:
        return _default_only(str(info.field_name), value, (None,))

    @field_validator("store", mode="plain")
    @classmethod
    def _store(cls, value: Any) -> Any:
        return _default_only("store", value, (None, False))

    @field_validator("service_tier", mode="plain")
    @classmethod
    def _service_tier(cls, value: Any) -> Any:
        return _default_only("service_tier", value, (None, "auto", "default"))

    @model_validator(mode="after")
    def _together(self) -> CommonBody:
        if self.stream_options is not None and not self.stream:
            raise refuse("'stream_options' is only allowed when 'stream' is true", "stream_options")
        given = [name for name in STRUCTURED_FIELDS if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.type == "text":
            given.remove("response_format")
        if len(given) > 1:
            raise refuse(f"send one of {', '.join(given)}, not several", given[1])
        return self


class ChatCompletionBody(CommonBody):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int | None, Field(ge=0, le=MAX_TOP_LOGPROBS)] = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _messages(cls, messages: Any) -> Any:
        if not isinstance(messages, list) or not messages:
            raise refuse("'messages' must be a non-empty list", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise refuse("each message must be an object", f"messages[{i}]")
        return messages

    @model_validator(mode="after")
    def _chat_together(self) -> ChatCompletionBody:
        a, b = self.max_tokens, self.max_completion_tokens
        if None not in (a, b) and a != b:
            raise refuse(
                "'max_tokens' and 'max_completion_tokens' differ; send one of them", "max_tokens"
            )
        if self.top_logprobs is not None and not self.logprobs:
            raise refuse("'top_logprobs' needs 'logprobs' set to true", "top_logprobs")
        if self.tool_choice is not None and not self.tools and self.tool_choice != "none":
            raise refuse("'tool_choice' needs 'tools'", "tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {t.function.name for t in self.tools or []}
            if self.tool_choice.function.name not in names:
                raise refuse(
                    f"'tool_choice' names the function '{self.tool_choice.function.name}', "
                    "which is not among 'tools'",
                    "tool_choice",
                )
        return self


class CompletionBody(CommonBody):
    prompt: Any = None
    logprobs: Annotated[int | None, Field(ge=0, le=MAX_TOP_LOGPROBS)] = None
    echo: bool | None = None

    @field_validator("prompt", mode="plain")
    @classmethod
    def _prompt(cls, prompt: Any) -> str | list[int]:
        if isinstance(prompt, str):
            return prompt
        if (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            return prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return prompt[0]
        raise refuse("'prompt' must be a string or a list of token ids", "prompt")

    @model_validator(mode="after")
    def _completion_together(self) -> CompletionBody:
        if self.echo and self.logprobs is not None:
            # The prompt's own logprobs would need the prefill's logits, which are not kept.
            raise refuse("'echo' is not supported together with 'logprobs'", "echo")
        return self


CHAT_FIELDS = frozenset(f.alias or name for name, f in ChatCompletionBody.model_fields.items())
COMPLETION_FIELDS = frozenset(f.alias or name for name, f in CompletionBody.model_fields.items())

# pydantic's error types → what this API says, of the field named.
_TYPE_WORDS = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "a boolean",
    "string_type": "a string",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "a list",
    "string_pattern_mismatch": "a name of letters, digits, '_', '.' or '-'",
    "string_too_long": "shorter",
    "string_too_short": "non-empty",
    "too_short": "non-empty",
    "union_tag_invalid": "one of the values it takes",
}
_BOUND_ERRORS = {"greater_than_equal", "less_than_equal", "greater_than", "less_than"}


_SCALARS = {"str", "int", "float", "bool", "none", "list", "dict"}


def _param(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part[:1].islower() or "[" in part or "-" in part or part in _SCALARS:
            continue  # a union member's name, not a field
        else:
            out += f".{part}" if out else part
    return out


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _bounds(body: type[BaseModel], name: str) -> str:
    field = body.model_fields.get(name)
    lo = hi = None
    for m in field.metadata if field else ():
        lo = getattr(m, "ge", None) if getattr(m, "ge", None) is not None else lo
        lo = getattr(m, "gt", None) if getattr(m, "gt", None) is not None else lo
        hi = getattr(m, "le", None) if getattr(m, "le", None) is not None else hi
    if lo is not None and hi is not None:
        return f"between {_fmt(lo)} and {_fmt(hi)}"
    return "in range"


def request_error(exc: ValidationError, body: type[BaseModel]) -> tuple[str, str]:
    """(message, param) of the first thing pydantic found wrong with a body."""
    err = exc.errors(include_url=False)[0]
    loc = tuple(err["loc"])
    ctx = err.get("ctx") or {}
    kind = err["type"]
    if kind == "api":
        # A validator's own words, its param named from the object it checked: the field
        # a validator of that field names is the last part of loc, not a second one.
        inner = str(ctx["param"])
        last = loc[-1] if loc else None
        base = _param(loc[:-1] if isinstance(last, str) and inner.startswith(last) else loc)
        return str(ctx["message"]), f"{base}.{inner}" if base else inner
    param = _param(loc)
    if kind == "extra_forbidden":
        if len(loc) == 1:
            return f"Unrecognized request argument supplied: {loc[0]}", str(loc[0])
        return f"unsupported field: {param}", param
    if kind == "missing":
        return f"'{param}' is required", param
    if kind in _BOUND_ERRORS:
        return f"'{param}' must be {_bounds(body, str(loc[0]))}", param
    if kind == "json_invalid":
        return f"'{param}' must be valid JSON", param
    if kind == "literal_error":
        return f"'{param}' must be {ctx.get('expected', 'one of the values it takes')}", param
    words = _TYPE_WORDS.get(kind, "of the documented type")
    return f"'{param}' must be {words}", param


def dumps_schema(schema: dict[str, Any] | str | bool) -> str:
    """A JSON schema as the text the engine's grammar compiler takes."""
    return schema if isinstance(schema, str) else json.dumps(schema)
