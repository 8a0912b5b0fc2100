"""The chat WebSocket's client frames (docs/websocket.md) and a conversation's settings,
one pydantic model each; `Frame` is their union, told apart by the frame's `type`. The
pattern is chatapp/openai_api/protocol.py: fields, types and bounds are declared once here,
and `frame_error` / `settings_error` turn pydantic's first complaint into the error frame
(or the exception) the chat has always answered with, in the same words.

A frame's own fields are checked here; what needs the database (does the message exist,
may its documents be used) stays with the consumer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple, get_args

from django.conf import settings
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from chatapp.chat.attachments import AttachmentsInvalid, clean_ids
from chatapp.text import InvalidText, clean_text, without_surrogates

# Ranges the settings take; settings_limits() (chatapp/chat/conversations.py) reports the
# same values to the browser (GET /api/chat/limits/), so the settings dialog can never
# offer what a send then refuses.
TEMPERATURE_RANGE = (0.0, 2.0)
TOP_P_RANGE = (0.0, 1.0)  # the lower bound itself is refused: top_p must be > 0
MAX_TOKENS_MIN = 1
# The settings' names in errors, as the settings dialog labels them (frontend/src/limits.ts).
SETTING_LABELS = {
    "system_prompt": "The system prompt",
    "temperature": "Temperature",
    "top_p": "Top-p",
    "max_tokens": "Max tokens",
    "json_mode": "JSON mode",
}
MODEL_MAX_CHARS = 200  # Conversation.model's max_length
CLIENT_ID_CHARS = 64


def num(x: float) -> str:
    """A number as the settings dialog writes it (limits.ts `num`): thousands separated,
    at most two decimals, no trailing zeros ("2,048", "0", "0.95")."""
    text = f"{round(float(x), 2):,.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


MODEL_NAME_RULE = f"The model must be a model's name of at most {num(MODEL_MAX_CHARS)} characters."


def is_model_name(value: Any) -> bool:
    """A model name as a frame or a request body may carry it (whether it is served is the
    engine client's to say, where it is used)."""
    return isinstance(value, str) and 0 < len(value) <= MODEL_MAX_CHARS


def refuse(code: str, message: str, text_code: str = "") -> PydanticCustomError:
    """A complaint in our own words: `code` is the error frame's; `text_code`, for text that
    cannot be stored, the chatapp.text.InvalidText code an HTTP caller gets."""
    # A message may quote what the frame held: a lone surrogate there would fail pydantic's
    # rendering of the error (and the frame's UTF-8), so it becomes U+FFFD.
    message = without_surrogates(message)
    return PydanticCustomError(
        "chat", "{message}", {"code": code, "message": message, "text_code": text_code}
    )


def _text(value: str, label: str, allow_empty: bool = True) -> str:
    try:
        return clean_text(value, label, settings.CHAT_MAX_MESSAGE_CHARS, allow_empty=allow_empty)
    except InvalidText as exc:
        raise refuse(exc.code, exc.message, exc.code) from exc


def _number(value: Any, name: str, lo: float, hi: float, *, min_exclusive: bool = False) -> float:
    label = SETTING_LABELS[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise refuse("invalid", f"{label} must be a number.")
    v = float(value)
    if (v <= lo if min_exclusive else v < lo) or not v <= hi:  # `not <=` refuses NaN too
        if min_exclusive:
            raise refuse("invalid", f"{label} must be more than {num(lo)} and at most {num(hi)}.")
        raise refuse("invalid", f"{label} must be between {num(lo)} and {num(hi)}.")
    return v


class ConversationSettings(BaseModel):
    """A conversation's settings, in a `send` frame or an HTTP body; every one optional,
    refused in the settings dialog's words ("Max tokens must be between 1 and 2,048.")."""

    model_config = ConfigDict(extra="forbid")

    system_prompt: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = MAX_TOKENS_MIN
    json_mode: bool = False

    @model_validator(mode="before")
    @classmethod
    def _object(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            raise refuse("invalid", "The settings must be an object.")
        unknown = set(raw) - set(SETTING_LABELS)
        if unknown:
            plural = "s" if len(unknown) > 1 else ""
            # Named as given, but a hostile frame's names are cut short.
            names = ", ".join(name[:40] for name in sorted(unknown)[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise refuse("invalid", f"Unknown setting{plural}: {names}{more}.")
        return raw

    @field_validator("system_prompt", mode="plain")
    @classmethod
    def _system_prompt(cls, value: Any) -> str:
        label, max_chars = SETTING_LABELS["system_prompt"], settings.CHAT_MAX_MESSAGE_CHARS
        if isinstance(value, str) and len(value) > max_chars:
            # Said with the dialog's thousands separator, which clean_text does not write.
            raise refuse(
                "invalid", f"{label} is longer than {num(max_chars)} characters.", "too_long"
            )
        try:
            return clean_text(value, label, max_chars)
        except InvalidText as exc:
            raise refuse("invalid", exc.message, exc.code) from exc

    @field_validator("temperature", mode="plain")
    @classmethod
    def _temperature(cls, value: Any) -> float:
        return _number(value, "temperature", *TEMPERATURE_RANGE)

    @field_validator("top_p", mode="plain")
    @classmethod
    def _top_p(cls, value: Any) -> float:
        return _number(value, "top_p", *TOP_P_RANGE, min_exclusive=True)

    @field_validator("max_tokens", mode="plain")
    @classmethod
    def _max_tokens(cls, value: Any) -> int:
        label, hi = SETTING_LABELS["max_tokens"], settings.CHAT_MAX_NEW_TOKENS
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise refuse("invalid", f"{label} must be a number.")
        if not isinstance(value, int):
            raise refuse("invalid", f"{label} must be a whole number.")
        if not MAX_TOKENS_MIN <= value <= hi:
            raise refuse("invalid", f"{label} must be between {num(MAX_TOKENS_MIN)} and {num(hi)}.")
        return value

    @field_validator("json_mode", mode="plain")
    @classmethod
    def _json_mode(cls, value: Any) -> bool:
        if not isinstance(value, bool):
            raise refuse("invalid", f"{SETTING_LABELS['json_mode']} must be true or false.")
        return value

    def given(self) -> dict[str, Any]:
        """The settings the client sent, by name (those it left out are not set)."""
        return self.model_dump(exclude_unset=True)


def settings_error(exc: ValidationError) -> InvalidText | ValueError:
    """What clean_settings raises for a refused settings object: InvalidText for text that
    cannot be stored (with its own code), else the message as a ValueError for the caller
    to wrap (conversations.InvalidSettings)."""
    err = exc.errors(include_url=False)[0]
    ctx = err.get("ctx") or {}
    if ctx.get("text_code"):
        return InvalidText(str(ctx["text_code"]), str(ctx["message"]))
    return ValueError(str(ctx.get("message", err["msg"])))


# --- frames -------------------------------------------------------------------------


class FrameBase(BaseModel):
    """What every frame may carry. Fields no frame type declares are ignored, so an older
    server still answers a newer page."""

    model_config = ConfigDict(strict=True, extra="ignore")

    client_id: str | None = None

    @field_validator("client_id", mode="plain")
    @classmethod
    def _client_id(cls, value: Any) -> str | None:
        if value is not None and (not isinstance(value, str) or len(value) > CLIENT_ID_CHARS):
            raise refuse(
                "bad_frame", f"'client_id' must be a string of at most {CLIENT_ID_CHARS} chars."
            )
        return value


class Attachments(FrameBase):
    # Before `text` (fields are checked in order): a send's text may be empty when it has
    # documents.
    attachments: list[int] | None = None

    @field_validator("attachments", mode="plain")
    @classmethod
    def _attachments(cls, value: Any) -> list[int]:
        try:
            return clean_ids(value)
        except AttachmentsInvalid as exc:
            raise refuse("bad_frame", str(exc)) from exc


class ModelChoice(FrameBase):
    # The model this turn goes to; absent, the conversation's own.
    model: str | None = None

    @field_validator("model", mode="plain")
    @classmethod
    def _model(cls, value: Any) -> str | None:
        if value is not None and not is_model_name(value):
            raise refuse("invalid", MODEL_NAME_RULE)
        return value


class PingFrame(FrameBase):
    type: Literal["ping"]


class SendFrame(Attachments, ModelChoice):
    type: Literal["send"]
    text: str
    conversation_id: int | None = None
    settings: ConversationSettings | None = None
    # A new chat only: a temporary one (chatapp/chat/temporary.py).
    temporary: bool = False
    # Compare: a second reply to the same message from this model, written alongside.
    compare_model: str | None = None

    @field_validator("compare_model", mode="plain")
    @classmethod
    def _compare_model(cls, value: Any) -> str | None:
        if value is not None and not is_model_name(value):
            raise refuse("invalid", MODEL_NAME_RULE)
        return value

    @field_validator("text")
    @classmethod
    def _text(cls, text: str, info: ValidationInfo) -> str:
        # A message may be its documents alone.
        return _text(text, "The message", allow_empty=bool(info.data.get("attachments")))


class MessageFrame(FrameBase):
    """A frame about one message."""

    message_id: int


class StopFrame(MessageFrame):
    type: Literal["stop"]


class ResumeFrame(MessageFrame):
    type: Literal["resume"]


class ContinueFrame(MessageFrame):
    type: Literal["continue"]


class RegenerateFrame(MessageFrame, ModelChoice):
    type: Literal["regenerate"]


class EditFrame(MessageFrame, Attachments, ModelChoice):
    """Without `attachments` the edit keeps the message's documents; so whether the text
    may be empty is the consumer's to tell, once it has read them."""

    type: Literal["edit"]
    text: str

    @field_validator("text")
    @classmethod
    def _text(cls, text: str) -> str:
        return _text(text, "The message")


AnyFrame = (
    PingFrame | SendFrame | StopFrame | RegenerateFrame | EditFrame | ContinueFrame | ResumeFrame
)
FRAME: TypeAdapter[AnyFrame] = TypeAdapter(Annotated[AnyFrame, Field(discriminator="type")])

# pydantic's error types → what the error frame says of the field named.
_TYPE_WORDS = {"int_type": "an integer", "string_type": "a string", "bool_type": "true or false"}
_FIELD_WORDS = {int: "an integer", str: "a string", bool: "true or false"}


class Refusal(NamedTuple):
    """What the error frame for a refused frame says; `echo`: whether it names the ids the
    frame gave (not for a frame that is no frame, of no known type, or whose client_id is
    itself what is wrong)."""

    code: str
    message: str
    echo: bool = True


def frame_error(exc: ValidationError, content: Any) -> Refusal:
    """The error frame for the first thing wrong with a frame."""
    err = exc.errors(include_url=False)[0]
    kind, loc, ctx = err["type"], tuple(err["loc"]), err.get("ctx") or {}
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tag = content.get("type") if isinstance(content, dict) else None
        return Refusal("bad_frame", f"Unknown frame type: {str(tag)[:40]!r}.", echo=False)
    if kind in ("model_attributes_type", "dict_type", "model_type") and len(loc) <= 1:
        return Refusal("bad_frame", "A frame must be a JSON object.", echo=False)
    if kind == "chat":
        return Refusal(str(ctx["code"]), str(ctx["message"]), echo=loc[1:] != ("client_id",))
    field = str(loc[1]) if len(loc) > 1 else "type"
    words = _TYPE_WORDS.get(kind)
    if words is None:
        model = _MODELS.get(str(loc[0])) if loc else None
        info = model.model_fields.get(field) if model else None
        annotation = info.annotation if info else None
        words = _FIELD_WORDS.get(annotation, "of the documented type")  # type: ignore[arg-type]
    return Refusal("bad_frame", f"'{field}' must be {words}")


_MODELS: dict[str, type[BaseModel]] = {
    get_args(m.model_fields["type"].annotation)[0]: m
    for m in (
        PingFrame,
        SendFrame,
        StopFrame,
        RegenerateFrame,
        EditFrame,
        ContinueFrame,
        ResumeFrame,
    )
}


def parse_frame(content: Any) -> AnyFrame:
    """The frame `content` is; raises ValidationError, which `frame_error` puts in words."""
    return FRAME.validate_python(content)
