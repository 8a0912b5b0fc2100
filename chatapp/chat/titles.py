"""Conversation titles written after a conversation's first complete reply (docs/titles.md).

Until then a conversation shows its first words (chatapp.chat.conversations.default_title);
a title the user typed is never replaced. The title is made from the user's first message
only: the serving engine is asked (greedy, a few tokens) for a short noun phrase, and its
answer is checked (`clean`); when it is unusable, a title is built from the message's first
words instead (`fallback_title`), so every title is short and ends on a whole phrase. When
the title is stored, the owner's open chat sockets get a `title` frame.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid

from django.conf import settings

from chatapp.chat.conversations import default_title
from chatapp.chat.models import Conversation, Message
from chatapp.chat.user_sockets import send_title
from chatapp.jobs import queue
from inference.chat_template import Turn
from inference.client import get_engine_client, prefix_cache_salt
from inference.engine import SamplingParams

log = logging.getLogger(__name__)

INSTRUCTION = (
    "Write a title for the message below: a short noun phrase of at most six words, "
    "not a sentence. Do not answer the message.\n\nMessage: "
)
# The reply is started for the model (when the prompt is token ids): a small model then
# writes the title and closes the quote, instead of a sentence about the message.
ANSWER_PREFIX = 'Title: "'
MAX_WORDS = 6
MAX_CHARS = 60
MAX_TOKENS = 16
# How much of the message the engine sees: the gist is enough for a title, and a short
# prompt keeps this background prefill from delaying the next person's first token.
PROMPT_CHARS = 400
UNTITLED = "New conversation"

# A title must not end on a word that needs another after it: an article, a preposition,
# a conjunction, a possessive, an auxiliary verb. (Particles that end phrasal verbs, "set
# up", "figure out", are left out; "in" and "on" are kept: they dangle far more often.)
_DANGLING_WORDS = """
    a an the of to for with by from about into onto at in on than via per as between through
    without within across during toward towards against among upon under and or but nor
    so yet because if while whereas although though that which whose whom when where
    whether unless until my your his her its our their some any each every another such
    is are was were be been being am do does did have has had can could will would shall
    should may might must not very"""
DANGLING = frozenset(_DANGLING_WORDS.split())
# Openings of a message that say nothing about its subject (left out of the fallback).
FILLER = re.compile(
    r"^(?:(?:hi|hello|hey|hiya|greetings|what'?s up|good (?:morning|afternoon|evening))"
    r"(?: there)?\b[\s,!.:-]*"
    r"|please\b[\s,]*"
    r"|(?:can|could|would|will) you(?: please)?\b\s*"
    r"|i (?:want|need|would like|'d like|wanted) (?:you )?(?:to know|to)?\b\s*"
    r"|i have a question(?: about)?\b[\s,:.-]*"
    r"|quick question\b[\s,:.-]*"
    r"|tell me(?: about)?\b\s*"
    r"|explain(?: to me)?\b\s*"
    # "How do I bake bread" -> "Bake bread", "What is the capital" -> "The capital": a
    # question's opening is no part of its subject.
    r"|how (?:do|can|could|should|would) (?:i|we|you|one)\b\s*"
    r"|(?:what|who) (?:is|are|was|were)\b\s*|what'?s\b\s*)",
    re.IGNORECASE,
)
REFUSAL = re.compile(
    r"^(?:i'?m sorry|i am sorry|sorry\b|i can'?t|i cannot|i can not|i'?m unable|i am unable|"
    r"i'?m not able|i am not able|as an ai|unfortunately|i won'?t|i do not|i don'?t)",
    re.IGNORECASE,
)
# "Sure! Here is a title:", "Title:", "The title is": said before the title itself.
PREAMBLE = re.compile(
    r"^(?:(?:sure|okay|ok|certainly|of course)[!,.]\s*)?"
    r"(?:(?:here(?:'s| is) )?(?:a |the |your |my )?(?:short |suggested |possible )?title"
    r"(?: for (?:the|this|your) (?:message|conversation|request))?"
    r"\s*(?:is\b|[:\-\u2013\u2014])\s*"
    r"|here(?:'s| is)\b\s*[:\-\u2013\u2014]?\s*)?",
    re.IGNORECASE,
)
MARKUP = re.compile(r"[*_`#>~]+")
PAIRS = (('"', '"'), ("“", "”"), ("\u2018", "\u2019"), ("«", "»"), ("(", ")"), ("[", "]"))
EDGE_PUNCTUATION = " \t.,:;!?…-\u2013\u2014/\\|"
INSTRUCTION_WORDS = frozenset(re.findall(r"[a-z]+", INSTRUCTION.lower())) | {"title", "titles"}


def first_exchange(conv: Conversation) -> tuple[Message, Message] | None:
    """The conversation's first user message and its first complete reply, while that is
    its only complete reply. A first reply that was stopped or failed does not count: the
    complete one that replaced it (a regenerate, or an edit of the first message) does,
    and the title is then made from the user message on its own branch."""
    complete = list(
        conv.messages.filter(role="assistant", status=Message.Status.COMPLETE).order_by("id")[:2]
    )
    if len(complete) != 1:
        return None
    reply = complete[0]
    first: Message | None = None
    node = reply.parent
    while node is not None:
        if node.role == "user":
            first = node
        node = node.parent
    return (first, reply) if first is not None else None


def needs_title(conv: Conversation) -> bool:
    if conv.temporary:
        return False  # nobody sees it in a list, and it is gone when its tab closes
    pair = first_exchange(conv)
    if pair is None:
        return False
    # Still the name the conversation was given at its start: that of its first message,
    # which an edit of that message has since replaced on the branch shown.
    firsts = conv.messages.filter(role="user").exclude(parent__role__in=["user", "assistant"])
    defaults = {default_title(m.text) for m in firsts} | {""}
    return conv.title in defaults


def maybe_start(conversation_id: int) -> None:
    """Queue a title job if this conversation just got its first complete reply."""
    if not settings.CHAT_AUTO_TITLES:
        return
    conv = Conversation.objects.filter(pk=conversation_id).first()
    if conv is None or not needs_title(conv):
        return
    queue.submit(queue.task_named("inference.generate_title"), conversation_id)


# --- what makes a title ---------------------------------------------------------------


def _balance(text: str) -> str:
    """Drops the quotes and brackets of a kind that does not pair up (a cut-off quote)."""
    for left, right in PAIRS:
        if left == right:
            if text.count(left) % 2:
                text = text.replace(left, "")
        elif text.count(left) != text.count(right):
            text = text.replace(left, "").replace(right, "")
    return text


def _unwrap(text: str) -> str:
    """The text without quotes or brackets around all of it, and without edge punctuation."""
    while True:
        text = text.strip(EDGE_PUNCTUATION)
        pair = next(((a, b) for a, b in (*PAIRS, ("'", "'")) if text[:1] == a), None)
        if pair is None or not text.endswith(pair[1]) or len(text) < 2:
            return text
        inner = text[1:-1]
        if pair[0] in inner or pair[1] in inner:
            return text  # "a" and "b": two quoted parts, not one wrapped title
        text = inner


def _words(text: str) -> list[str]:
    return text.split()


def _bare(word: str) -> str:
    return word.strip(EDGE_PUNCTUATION + "\"'“”\u2018\u2019«»()[]").lower()


def _finish(words: list[str]) -> str:
    """Joined, quotes balanced, no edge punctuation, first letter upper-case."""
    text = _unwrap(_balance(" ".join(words)))
    return text[:1].upper() + text[1:]


def clean(text: str, finish_reason: str | None = None) -> str | None:
    """The model's answer as a title, or None when it is unusable: empty, longer than
    MAX_WORDS words or MAX_CHARS characters, a refusal, the instruction said back, cut off
    (the token limit hit, or it ends on an article, preposition or conjunction).

    A title with a subtitle ("Photosynthesis explained: a guide to ...") that is too long
    or was cut off keeps its head when the head is a title of two words or more."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    line = lines[0]
    # "Sure! Here is a title:" on a line of its own, the title on the next.
    if line.endswith(":") and len(lines) > 1 and not PREAMBLE.sub("", MARKUP.sub("", line)):
        line = lines[1]
    line = MARKUP.sub("", line).strip()
    line = re.sub(r"^(?:user|assistant|message)\s*:\s*", "", line, flags=re.IGNORECASE)
    if REFUSAL.match(_unwrap(line)):
        return None
    line = PREAMBLE.sub("", line, count=1)
    # Cut off by the token limit: whatever came last ends mid-phrase; only a head that
    # ended before a colon or dash is whole.
    candidates = [] if finish_reason == "length" else [line]
    head = re.split(r":\s|\s[-\u2013\u2014]\s", line, maxsplit=1)[0]
    if head != line and len(_words(head)) >= 2:
        candidates.append(head)
    for candidate in candidates:
        title = _usable(candidate)
        if title is not None:
            return title
    return None


def _usable(line: str) -> str | None:
    line = _unwrap(_balance(line))
    words = _words(line)
    if not words or len(words) > MAX_WORDS or not any(ch.isalnum() for ch in line):
        return None
    if REFUSAL.match(line):
        return None
    bare = [_bare(w) for w in words]
    content = [b for b in bare if b and b not in DANGLING]
    said_back = [b for b in content if b in INSTRUCTION_WORDS]
    if not content or 2 * len(said_back) >= len(content):
        return None  # the instruction said back: "Short title", "A short noun phrase"
    if bare[-1] in DANGLING:
        return None
    title = _finish(words)
    return title if len(title) <= MAX_CHARS else None


def _strip_filler(sentence: str) -> str:
    while True:
        shorter = FILLER.sub("", sentence, count=1).strip()
        if shorter == sentence:
            return sentence
        sentence = shorter


def _first_words(text: str) -> str:
    """At most MAX_WORDS words of `text` (MAX_CHARS characters), ending on a word that
    needs nothing after it; "" when nothing is left."""
    text = re.sub(r"\s+(?:to|for) (?:me|us)\b", "", text, flags=re.IGNORECASE)
    words = [w for w in _words(_balance(text)) if any(c.isalnum() for c in w)][:MAX_WORDS]
    while words and _bare(words[-1]) in DANGLING:
        words.pop()
    while len(words) > 1 and len(_finish(words)) > MAX_CHARS:
        words.pop()
        while len(words) > 1 and _bare(words[-1]) in DANGLING:
            words.pop()
    title = _finish(words)[:MAX_CHARS].strip(EDGE_PUNCTUATION) if words else ""
    return title if any(c.isalnum() for c in title) else ""


def fallback_title(user_text: str) -> str:
    """A title from the first words of the user's message, for when the model's is
    unusable: the first sentence, greetings and "could you" openings left out, at most
    MAX_WORDS words, ending on a whole word that needs nothing after it. Deterministic:
    the same message always gives the same title."""
    text = re.sub(r"```.*?(?:```|$)", " ", user_text, flags=re.DOTALL)  # code says little
    text = re.sub(r"https?://\S+", " ", text)
    text = MARKUP.sub(" ", text)
    sentences = [
        s.strip() for s in re.split(r"(?<=[.?!])\s+|\n+", text) if any(c.isalnum() for c in s)
    ]
    # The first sentence with a subject once greetings and "could you" are left out; a
    # message that is nothing but a greeting keeps its own words.
    for strip_filler in (True, False):
        for sentence in sentences:
            title = _first_words(_strip_filler(sentence) if strip_filler else sentence)
            if title:
                return title
    return UNTITLED


# --- writing and storing it -----------------------------------------------------------


def model_title(user_text: str, owner_id: int | None = None) -> str | None:
    """The serving engine's title for a first message (greedy, MAX_TOKENS tokens), in the
    owner's cache scope; None when its answer is unusable (`clean`)."""
    client = get_engine_client()
    salt = prefix_cache_salt(owner_id) if owner_id is not None else None
    message = " ".join(user_text[:PROMPT_CHARS].split())
    prompt = client.chat_prompt([Turn("user", INSTRUCTION + message)], cache_salt=salt)
    started = client.with_reply_started(prompt, ANSWER_PREFIX)
    prefix = ANSWER_PREFIX if started is not prompt else ""
    prompt = started
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)

    async def run() -> tuple[str, str | None]:
        text, finish = "", None
        rid = f"title-{uuid.uuid4().hex[:12]}"
        async for delta in client.stream(prompt, sampling, request_id=rid, cache_salt=salt):
            text += delta.text
            finish = delta.finish_reason or finish
        return text, finish

    text, finish = asyncio.run(run())
    if finish in ("error", "abort"):
        raise RuntimeError(f"the engine did not finish the title ({finish})")
    if prefix:
        # The title is what comes before the closing quote; no closing quote: cut off.
        text, closed, _rest = text.partition('"')
        finish = "stop" if closed else "length"
    title = clean(text, finish)
    if title is None:
        log.info("title: the model's answer %r is unusable; using the message's words", text)
    return title


def write_title(user_text: str, owner_id: int | None = None) -> str:
    """The title for a conversation that starts with `user_text`: the model's when usable,
    else the first words of the message."""
    return model_title(user_text, owner_id) or fallback_title(user_text)


def generate(conversation_id: int) -> str | None:
    """Write and store the title, and tell the owner's sockets; None when the conversation
    no longer wants one (renamed, deleted, or it got another reply meanwhile)."""
    conv = Conversation.objects.filter(pk=conversation_id).first()
    if conv is None or not needs_title(conv):
        return None
    user_msg, _reply = first_exchange(conv)  # type: ignore[misc]
    title = write_title(user_msg.text, conv.owner_id)
    # Only if nobody renamed it meanwhile.
    updated = Conversation.objects.filter(pk=conv.pk, title=conv.title).update(title=title)
    if not updated:
        return None
    send_title(conv.owner_id, conv.pk, title)
    return title
