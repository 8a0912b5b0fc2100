"""Conversation logic shared by the socket consumer and the HTTP views (sync ORM code;
async callers wrap it in database_sync_to_async)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from chatapp.chat import attachments, retrieval
from chatapp.chat.models import Attachment, Conversation, Message
from chatapp.chat.protocol import (
    MAX_TOKENS_MIN,
    MODEL_NAME_RULE,
    TEMPERATURE_RANGE,
    TOP_P_RANGE,
    ConversationSettings,
    is_model_name,
    settings_error,
)
from chatapp.text import InvalidText, clean_text
from inference.chat_template import Prompt, Turn
from inference.client import EngineClient, default_model, list_models
from inference.engine import EngineError, PromptTooLongError

TITLE_WORDS = 8
TITLE_MAX_CHARS = 200  # Conversation.title's max_length


class NotFound(Exception):
    """No such object for this user (other users' ids are reported the same way)."""


class InvalidSettings(ValueError):
    """Conversation settings out of their ranges (user text that cannot be stored is
    chatapp.text.InvalidText)."""


class UnknownModel(InvalidSettings):
    """A model name no engine here serves."""

    code = "model_not_found"


def model_field(value: Any) -> str:
    """A model name as a frame or a request body carries it (not checked against the
    served models: the engine client does that where it is used)."""
    if not is_model_name(value):
        raise InvalidSettings(MODEL_NAME_RULE)
    return str(value)


def clean_model(value: Any) -> str:
    """A served model's name; UnknownModel (saying which are served) for any other."""
    name = model_field(value)
    served = [m.id for m in list_models()]
    if name not in served:
        raise UnknownModel(
            f"The model '{name}' is not served here; pick one of: {', '.join(served)}"
        )
    return name


def served_default() -> str:
    """The default model's name; blank while it cannot be told (an upstream away)."""
    try:
        return default_model()
    except EngineError:
        return ""


def model_of(conv: Conversation) -> str:
    """The model a conversation's next turn goes to."""
    return conv.model or served_default()


def clean_title(value: Any) -> str:
    return clean_text(value, "The title", TITLE_MAX_CHARS).strip()


def default_title(text: str) -> str:
    words = " ".join(text.split()).split(" ")
    title = " ".join(words[:TITLE_WORDS])
    if len(words) > TITLE_WORDS:
        title += "…"
    return title[:120]


def get_conversation(user: Any, conversation_id: Any) -> Conversation:
    try:
        return Conversation.objects.get(pk=int(conversation_id), owner=user)
    except (Conversation.DoesNotExist, TypeError, ValueError) as exc:
        raise NotFound("conversation") from exc


def get_message(user: Any, message_id: Any) -> Message:
    try:
        return Message.objects.select_related("conversation").get(
            pk=int(message_id), conversation__owner=user
        )
    except (Message.DoesNotExist, TypeError, ValueError) as exc:
        raise NotFound("message") from exc


def get_attachment(user: Any, attachment_id: Any) -> Attachment:
    try:
        return Attachment.objects.get(pk=int(attachment_id), owner=user)
    except (Attachment.DoesNotExist, TypeError, ValueError) as exc:
        raise NotFound("attachment") from exc


def clean_settings(raw: Any) -> dict[str, Any]:
    """The settings `raw` gives, by name (chatapp.chat.protocol.ConversationSettings
    declares them); a refusal is InvalidSettings (InvalidText for the system prompt's text)
    in the settings dialog's words: "Max tokens must be between 1 and 2,048."."""
    if raw is None:
        return {}
    try:
        return ConversationSettings.model_validate(raw).given()
    except ValidationError as exc:
        error = settings_error(exc)
        if isinstance(error, InvalidText):
            raise error from None
        raise InvalidSettings(str(error)) from None


def settings_limits(context_tokens: int | None = None) -> dict[str, Any]:
    """The limits clean_settings and the chat socket enforce, with the server's defaults,
    for clients to validate against (docs/http.md, GET /api/chat/limits/).
    `context_tokens` is the served model's context window when the engine is up."""
    defaults = settings.CHAT_DEFAULTS
    return {
        "max_tokens": {
            "min": MAX_TOKENS_MIN,
            "max": settings.CHAT_MAX_NEW_TOKENS,
            "default": defaults["max_tokens"],
        },
        "temperature": {
            "min": TEMPERATURE_RANGE[0],
            "max": TEMPERATURE_RANGE[1],
            "default": defaults["temperature"],
        },
        "top_p": {
            "min": TOP_P_RANGE[0],
            "min_exclusive": True,
            "max": TOP_P_RANGE[1],
            "default": defaults["top_p"],
        },
        "system_prompt": {
            "max_chars": settings.CHAT_MAX_MESSAGE_CHARS,
            "default": defaults["system_prompt"],
        },
        "message": {
            "max_chars": settings.CHAT_MAX_MESSAGE_CHARS,
            "max_frame_bytes": settings.CHAT_MAX_FRAME_BYTES,
        },
        "context_tokens": context_tokens,
        "attachments": {
            "max_bytes": settings.CHAT_ATTACHMENT_MAX_BYTES,
            "per_message": settings.CHAT_ATTACHMENTS_PER_MESSAGE,
        },
    }


def new_conversation(
    user: Any, title: str = "", conv_settings: dict | None = None, model: str = ""
) -> Conversation:
    """An unsaved conversation with the defaults and the given settings, on `model` (the
    default model when blank: its name is stored, so the conversation keeps it)."""
    values = {**settings.CHAT_DEFAULTS, **(conv_settings or {})}
    return Conversation(owner=user, title=title[:200], model=model or served_default(), **values)


def create_conversation(
    user: Any, title: str = "", conv_settings: dict | None = None, model: str = ""
) -> Conversation:
    conv = new_conversation(user, title, conv_settings, model)
    conv.save()
    return conv


FOLDER_CHARS = 60
ORGANISING = {"pinned", "archived", "folder"}


def update_conversation(conv: Conversation, data: dict[str, Any]) -> Conversation:
    changed: list[str] = []
    if "title" in data:
        conv.title = clean_title(data["title"])
        changed.append("title")
    for key, value in clean_settings(data.get("settings")).items():
        setattr(conv, key, value)
        changed.append(key)
    if "model" in data:
        conv.model = clean_model(data["model"])
        changed.append("model")
    for flag in ("pinned", "archived"):
        if flag in data:
            if not isinstance(data[flag], bool):
                raise InvalidSettings(f"{flag} must be true or false.")
            setattr(conv, flag, data[flag])
            changed.append(flag)
    if "folder" in data:
        conv.folder = " ".join(clean_text(data["folder"], "The folder", FOLDER_CHARS).split())
        changed.append("folder")
    if "active_message" in data:
        message = Message.objects.filter(pk=_int(data["active_message"]), conversation=conv).first()
        if message is None:
            raise NotFound("message")
        conv.active_leaf = latest_leaf_under(message)
        changed.append("active_leaf")
    # Only the fields this request sets: `conv` was loaded earlier, and writing all of it
    # back would undo a reply added meanwhile (active_leaf) or, were the conversation
    # deleted meanwhile, insert it again.
    values = {name: getattr(conv, name) for name in changed}
    # Filing a conversation away is not a change to it: it keeps its place by date.
    if not changed or set(changed) - ORGANISING:
        values["updated_at"] = timezone.now()
    if not Conversation.objects.filter(pk=conv.pk).update(**values):
        raise NotFound("conversation")
    try:
        conv.refresh_from_db()
    except Conversation.DoesNotExist as exc:
        raise NotFound("conversation") from exc
    return conv


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSettings("ids are integers")
    return value


# --- the message tree --------------------------------------------------------------


def _all_messages(conv: Conversation) -> dict[int, Message]:
    return {m.pk: m for m in Message.objects.filter(conversation=conv).order_by("id")}


def path_to(message: Message | None, by_id: dict[int, Message] | None = None) -> list[Message]:
    """Messages from the root down to `message`, inclusive."""
    if message is None:
        return []
    by_id = by_id or _all_messages(message.conversation)
    path: list[Message] = []
    node: Message | None = by_id.get(message.pk, message)
    while node is not None:
        path.append(node)
        node = by_id.get(node.parent_id) if node.parent_id else None
    path.reverse()
    return path


def active_branch(conv: Conversation) -> list[Message]:
    if conv.active_leaf_id is None:
        return []
    by_id = _all_messages(conv)
    leaf = by_id.get(conv.active_leaf_id)
    return path_to(leaf, by_id) if leaf else []


def latest_leaf_under(message: Message) -> Message:
    """Follow the newest child down to a leaf: flipping to an alternative shows the most
    recent continuation of it."""
    by_parent: dict[int | None, list[Message]] = {}
    for m in Message.objects.filter(conversation_id=message.conversation_id).order_by("id"):
        by_parent.setdefault(m.parent_id, []).append(m)
    node = message
    while by_parent.get(node.pk):
        node = by_parent[node.pk][-1]
    return node


def alternatives(message: Message) -> list[int]:
    """Ids of the message and its siblings of the same role, oldest first."""
    return list(
        Message.objects.filter(
            conversation_id=message.conversation_id, parent_id=message.parent_id, role=message.role
        )
        .order_by("id")
        .values_list("id", flat=True)
    )


def turns_for(
    conv: Conversation,
    branch: list[Message],
    tokenizer: str | None,
    legacy: bool = False,
    documents: Mapping[int, list[Attachment]] | None = None,
) -> list[Turn]:
    """The chat-template turns for a branch: system prompt first, then the messages, each
    user message with its `documents` (by message id: attachments.of_messages) before its
    words.

    A reply keeps its exact token ids only for a model whose tokenizer they are in
    (`tokenizer`, the target model's fingerprint; `legacy`: the target is the default
    model, whose ids the replies from before models were named hold); for any other
    model the reply goes as text, tokenized by that model's own tokenizer."""
    turns: list[Turn] = []
    if conv.system_prompt.strip():
        turns.append(Turn("system", conv.system_prompt))
    documents = documents or {}
    for m in branch:
        if m.role == Message.Role.ASSISTANT:
            same = tokenizer is not None and (
                m.tokenizer == tokenizer or (legacy and not m.tokenizer)
            )
            ids = list(m.token_ids) if m.token_ids and same else None
            turns.append(Turn("assistant", m.text, ids))
        elif m.sources:
            chosen = [retrieval.Passage.from_json(s) for s in m.sources]
            turns.append(Turn(m.role, retrieval.prompt_text(m.text, chosen)))
        else:
            turns.append(Turn(m.role, attachments.prompt_text(m.text, documents.get(m.pk, []))))
    return turns


def prompt_for(
    client: EngineClient,
    conv: Conversation,
    branch: list[Message],
    user_text: str | None,
    documents: list[Attachment],
    cache_salt: str | None,
    legacy: bool = False,
) -> Prompt:
    """The prompt of a reply after `branch` on `client`'s model, with a new user message
    (its `documents`, then `user_text`) when `user_text` is not None: what a send builds,
    and what the composer's count (POST /api/chat/prompt-size/) measures. `legacy` as for
    turns_for: `client` serves the default model."""
    earlier = attachments.of_messages(m.pk for m in branch if m.role == Message.Role.USER)
    turns = turns_for(conv, branch, client.tokenizer_id, legacy, earlier)
    if user_text is not None:
        turns.append(Turn("user", attachments.prompt_text(user_text, documents)))
    return client.chat_prompt(turns, cache_salt=cache_salt)


def can_continue(reply: Message) -> bool:
    """Whether a reply can be written on (Continue): it ended at its length limit, and
    nothing was said after it (a later turn's prompt holds it as it is)."""
    return (
        reply.role == Message.Role.ASSISTANT
        and reply.status == Message.Status.COMPLETE
        and reply.finish_reason == "length"
        and bool(reply.token_ids)
        and not reply.children.exists()
    )


def continuation_prompt(
    asked: Prompt, reply: Message, tokenizer: str | None, legacy: bool = False
) -> Prompt | None:
    """The prompt that writes `reply` on: the prompt it answered (`asked`) with its own
    token ids after it, unclosed. None where they cannot be joined: an engine that takes
    no token ids (an upstream server), or a model whose tokenizer the ids are not in."""
    same = tokenizer is not None and (
        reply.tokenizer == tokenizer or (legacy and not reply.tokenizer)
    )
    if asked.token_ids is None or not same:
        return None
    return Prompt(token_ids=asked.token_ids + list(reply.token_ids))


def reopen_reply(reply: Message) -> None:
    """Mark a reply as being written again, and the branch it ends as the one shown."""
    reply.status, reply.finish_reason = Message.Status.STREAMING, ""
    Message.objects.filter(pk=reply.pk).update(
        status=reply.status, finish_reason="", updated_at=timezone.now()
    )
    Conversation.objects.filter(pk=reply.conversation_id).update(active_leaf=reply)


def prompt_with_documents(
    client: EngineClient,
    conv: Conversation,
    branch: list[Message],
    user_text: str,
    documents: list[Attachment],
    cache_salt: str | None,
    legacy: bool = False,
) -> tuple[Prompt, list[retrieval.Passage]]:
    """prompt_for a send, and when its documents make it too long for the context window,
    the prompt with only their passages most relevant to `user_text` (retrieval.py) and
    those passages; none when the documents fit whole."""
    whole = prompt_for(client, conv, branch, user_text, documents, cache_salt, legacy)
    if not documents or whole.length is None or too_long_words(client, whole) is None:
        return whole, []
    earlier = attachments.of_messages(m.pk for m in branch if m.role == Message.Role.USER)
    turns = turns_for(conv, branch, client.tokenizer_id, legacy, earlier)
    every = [p for a in documents for p in retrieval.passages(a.pk, a.name, a.text)]
    ranked = retrieval.rank(every, user_text)

    def build(chosen: list[retrieval.Passage]) -> Prompt:
        turn = Turn("user", retrieval.prompt_text(user_text, chosen))
        return client.chat_prompt([*turns, turn], cache_salt=cache_salt)

    # Room for a reply of the conversation's length (up to half the window), not only for
    # its first token: passages could fill the window otherwise.
    limit = client.max_model_len

    def fits(chosen: list[retrieval.Passage]) -> bool:
        length = build(chosen).length
        reserve = min(conv.max_tokens, limit // 2) if limit else 0
        return length is not None and (limit is None or length + reserve <= limit)

    chosen = retrieval.select(ranked, fits)
    return (build(chosen), chosen) if chosen else (whole, [])


def too_long_by_count(client: EngineClient, conv: Conversation, leaf_id: int | None) -> str | None:
    """Why any prompt after the branch ending at message `leaf_id` is past the model's
    window, from the messages' stored token counts alone: no text is read and nothing is
    tokenized, so a 100,000-message conversation is refused at the cost of its ids. None
    when it may fit; the whole prompt then tells exactly (too_long_words). A count taken
    of a text alone may be a token over its turn's share, hence one off each message."""
    limit = client.max_model_len
    if leaf_id is None or not limit or client.tokenizer_id is None:
        return None
    tree = {
        pk: (parent, tokens if tokenizer == client.tokenizer_id else None)
        for pk, parent, tokens, tokenizer in Message.objects.filter(conversation=conv)
        .values_list("id", "parent_id", "tokens", "tokenizer")
        .iterator(chunk_size=10_000)
    }
    known, node = 0, leaf_id if leaf_id in tree else None
    while node is not None:
        node, tokens = tree[node]
        known += max(0, (tokens or 0) - 1)
    if known < limit:
        return None
    return (
        f"This message needs more than {known:,} tokens with the conversation so far, and "
        f"the model reads at most {limit:,} tokens, its reply included. Remove an "
        "attachment, shorten the message or start a new chat."
    )


def too_long_words(client: EngineClient, prompt: Prompt) -> str | None:
    """Why the prompt does not fit the model's context window, in the words both the
    composer (before sending) and the socket (refusing a send) use; None when it fits."""
    try:
        client.check_fits(prompt)
    except PromptTooLongError:
        limit = client.max_model_len
        return (
            f"This message needs {prompt.length:,} tokens with the conversation so far, and "
            f"the model reads at most {limit:,} tokens, its reply included. Remove an "
            "attachment, shorten the message or start a new chat."
        )
    return None


def delete_conversation(conv: Conversation) -> None:
    """Delete `conv` and its messages, after any exchange being added to it has landed
    (add_exchange holds the same row lock), so none of its messages is left behind."""
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().filter(pk=conv.pk).first()
        if locked is None:
            raise NotFound("conversation")
        locked.delete()


@transaction.atomic
def add_exchange(
    conv: Conversation,
    parent: Message | None,
    user_text: str | None,
    user_token_ids: list[int],
    model: str = "",
    tokenizer: str | None = None,
    documents: list[Attachment] | None = None,
    sources: list[dict] | None = None,
    activate: bool = True,
) -> tuple[Message | None, Message]:
    """Save the user message (if any) and an empty streaming assistant reply under it,
    and make the reply the conversation's active leaf (unless not `activate`: the second
    reply of a comparison, an alternative until the user keeps it). A new conversation is saved here
    too: all of it lands, or none of it. Both messages name `model`, the model the turn
    goes to, and `tokenizer`, its tokenizer's fingerprint (their ids are in it); the
    conversation remembers `model` for its next turns.

    `conv` may have been loaded a while ago: only the fields this step owns are written
    (the active leaf, the model, and a title if it still has none), so a rename made
    meanwhile stands, and a conversation deleted meanwhile raises NotFound instead of
    coming back. `documents` go onto the user message (attachments.attach), in the same
    transaction."""
    model = model or conv.model
    if conv.pk is None:
        conv.model = model
        conv.save()
    elif Conversation.objects.select_for_update().filter(pk=conv.pk).first() is None:
        raise NotFound("conversation")
    ids_in = tokenizer or ""
    user_msg = None
    if user_text is not None:
        user_msg = Message.objects.create(
            conversation=conv,
            parent=parent,
            role=Message.Role.USER,
            text=user_text,
            token_ids=user_token_ids,
            tokens=len(user_token_ids) or None,
            model=model,
            tokenizer=ids_in if user_token_ids else "",
            sources=sources or [],
        )
        attachments.attach(user_msg, documents or [])
        parent = user_msg
    reply = Message.objects.create(
        conversation=conv,
        parent=parent,
        role=Message.Role.ASSISTANT,
        text="",
        status=Message.Status.STREAMING,
        model=model,
        tokenizer=ids_in,
    )
    if not activate:
        return user_msg, reply
    now = timezone.now()
    Conversation.objects.filter(pk=conv.pk).update(active_leaf=reply, model=model, updated_at=now)
    conv.active_leaf, conv.model, conv.updated_at = reply, model, now
    title = default_title(user_text or (documents[0].name if documents else ""))
    if (
        user_text is not None
        and title
        and Conversation.objects.filter(pk=conv.pk, title="").update(title=title)
    ):
        conv.title = title
    return user_msg, reply


# --- serialisation ------------------------------------------------------------------


def conversation_json(conv: Conversation) -> dict[str, Any]:
    return {
        "id": conv.pk,
        "title": conv.title,
        "created_at": conv.created_at.isoformat(),
        "updated_at": conv.updated_at.isoformat(),
        "settings": conv.settings_dict,
        "model": model_of(conv),
        "pinned": conv.pinned,
        "archived": conv.archived,
        "folder": conv.folder,
        "temporary": conv.temporary,
    }


# GET /api/conversations/<id>/ answers the newest messages of the active branch, this many
# unless `limit` says fewer (or up to MESSAGES_PAGE_MAX); `before` pages back.
MESSAGES_PAGE = 200
MESSAGES_PAGE_MAX = 1000


def branch_json(
    conv: Conversation, before: int | None = None, limit: int = MESSAGES_PAGE
) -> tuple[list[dict[str, Any]], bool]:
    """The newest `limit` messages of the active branch (those older than message `before`
    when given), oldest first, each with its alternatives; and whether older ones remain.

    The tree is walked on (id, parent, role) alone and only the page's rows are read
    whole: a 100,000-message conversation costs its ids, never its text."""
    tree = {
        pk: (parent, role)
        for pk, parent, role in Message.objects.filter(conversation=conv)
        .order_by("id")
        .values_list("id", "parent_id", "role")
    }
    path: list[int] = []
    node = conv.active_leaf_id if conv.active_leaf_id in tree else None
    while node is not None:
        path.append(node)
        node = tree[node][0]
    path.reverse()
    if before is not None:
        path = path[: path.index(before)] if before in path else []
    page_ids = path[-limit:]
    older = len(path) > len(page_ids)
    siblings: dict[tuple[int | None, str], list[int]] = {}
    for pk, (parent, role) in tree.items():  # ordered by id
        siblings.setdefault((parent, role), []).append(pk)
    rows = Message.objects.in_bulk(page_ids)
    documents = attachments.of_messages(
        (pk for pk in page_ids if tree[pk][1] == Message.Role.USER), with_text=False
    )
    out = []
    for pk in page_ids:
        data = message_json(rows[pk], documents=documents.get(pk, []))
        alts = siblings[tree[pk]]
        data["alternatives"], data["alternative_index"] = alts, alts.index(pk)
        out.append(data)
    return out, older


def message_json(
    m: Message, with_alternatives: bool = False, documents: list[Attachment] | None = None
) -> dict[str, Any]:
    """A message as the API and the socket send it; a user message's `attachments` without
    their text (`documents`: those already loaded, else they are read here)."""
    data: dict[str, Any] = {
        "id": m.pk,
        "conversation_id": m.conversation_id,
        "role": m.role,
        "text": m.text,
        "status": m.status,
        "finish_reason": m.finish_reason or None,
        "parent_id": m.parent_id,
        "created_at": m.created_at.isoformat(),
        "figures": m.figures or {},
        # The model that wrote a reply (or that a user turn went to); null from before.
        "model": m.model or None,
    }
    if m.error:
        data["error"] = m.error
    if m.feedback_rating is not None:
        data["feedback"] = m.feedback_json()
    if m.feedback_rating is not None:
        data["feedback"] = m.feedback_json()
    if m.role == Message.Role.USER:
        if documents is None:
            documents = list(m.attachments.defer("text").order_by("position", "id"))
        data["attachments"] = [attachments.attachment_json(a) for a in documents]
        if m.sources:
            data["sources"] = m.sources
    if with_alternatives:
        alts = alternatives(m)
        data["alternatives"] = alts
        data["alternative_index"] = alts.index(m.pk) if m.pk in alts else 0
    return data
