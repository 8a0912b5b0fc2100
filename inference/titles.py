"""Conversation titles written by the engine after a conversation's first reply.

Until then a conversation shows its first words (chatapp.conversations.default_title);
a title the user typed is never replaced. The UI picks the new title up when it
reloads the conversation list.
"""

from __future__ import annotations

import asyncio
import uuid

from django.conf import settings

from chatapp.conversations import default_title
from chatapp.models import Conversation, Message
from inference.chat_template import Turn
from inference.engine import SamplingParams

INSTRUCTION = (
    "Write a short title (at most six words) for the conversation below. "
    "Answer with the title only.\n\n"
)
MAX_CHARS = 80
MAX_WORDS = 8


def first_exchange(conv: Conversation) -> tuple[Message, Message] | None:
    """The first user message and the first complete reply, if that is all there is."""
    msgs = list(conv.messages.filter(role__in=["user", "assistant"]).order_by("id")[:3])
    replies = [m for m in msgs if m.role == "assistant"]
    if len(replies) != 1 or replies[0].status != Message.Status.COMPLETE or msgs[0].role != "user":
        return None
    return msgs[0], replies[0]


def needs_title(conv: Conversation) -> bool:
    pair = first_exchange(conv)
    return pair is not None and conv.title in ("", default_title(pair[0].text))


def maybe_start(conversation_id: int) -> None:
    """Queue a title job if this conversation just got its first reply."""
    if not settings.CHAT_AUTO_TITLES:
        return
    conv = Conversation.objects.filter(pk=conversation_id).first()
    if conv is None or not needs_title(conv):
        return
    from inference import tasks

    tasks.submit(tasks.generate_title, conversation_id)


def clean(text: str) -> str:
    line = next((x for x in text.strip().splitlines() if x.strip()), "")
    line = line.strip().strip("\"'*#").removeprefix("Title:").strip().strip("\"'")
    return " ".join(line.split()[:MAX_WORDS])[:MAX_CHARS].rstrip(" .,:;")


def write_title(user_text: str, reply_text: str, owner_id: int | None = None) -> str:
    """Ask the engine (greedy, a few tokens) for a title, in the owner's cache scope."""
    from inference.client import get_engine_client, prefix_cache_salt

    client = get_engine_client()
    salt = prefix_cache_salt(owner_id) if owner_id is not None else None
    # The gist is enough for a title; a short prompt keeps this background prefill from
    # delaying the next person's first token.
    conversation = f"User: {user_text[:400]}\nAssistant: {reply_text[:300]}"
    prompt = client.chat_prompt([Turn("user", INSTRUCTION + conversation)], cache_salt=salt)
    sampling = SamplingParams(max_tokens=16, temperature=0.0)

    async def run() -> str:
        text = ""
        rid = f"title-{uuid.uuid4().hex[:12]}"
        async for delta in client.stream(prompt, sampling, request_id=rid, cache_salt=salt):
            text += delta.text
        return text

    return clean(asyncio.run(run()))


def generate(conversation_id: int) -> str | None:
    """Write and store the title; None when the conversation no longer wants one."""
    conv = Conversation.objects.filter(pk=conversation_id).first()
    if conv is None or not needs_title(conv):
        return None
    user_msg, reply = first_exchange(conv)  # type: ignore[misc]
    title = write_title(user_msg.text, reply.text, conv.owner_id)
    if not title:
        return None
    # Only if nobody renamed it meanwhile.
    updated = Conversation.objects.filter(pk=conv.pk, title=conv.title).update(title=title)
    return title if updated else None
