"""Conversation titles (docs/titles.md): what makes a title, when one is asked for, that
the serving engine writes it (never a Celery worker's copy), and that the owner's open
sockets hear of it. Real Celery workers run these jobs in test_generation_jobs.py."""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chatapp.chat import tasks, titles
from chatapp.chat.conversations import default_title
from chatapp.chat.models import Conversation, Message
from chatapp.jobs import queue
from chatapp.jobs.models import Job
from chatapp.observability import recording
from chatapp.observability import tasks as observability_tasks
from chatapp.observability.models import RequestRecord
from inference import client as engine_client
from inference.backends.embedded import EmbeddedClient
from inference.chat_template import Turn
from inference.client import EngineUnavailableError, engine_ready, get_engine_client
from inference.engine import SamplingParams
from tests.engines import installed_engine
from tests.sockets import open_socket

QUESTION = "How do I bake a simple loaf of bread at home without a machine?"
FALLBACK = "Bake a simple loaf of bread"  # QUESTION's fallback title
QUOTES = (('"', '"'), ("“", "”"), ("(", ")"), ("[", "]"))


def well_formed(title: str) -> bool:
    """What every stored title must be: 1..MAX_WORDS words, at most MAX_CHARS characters,
    no edge punctuation, quotes and brackets paired, no dangling last word."""
    words = title.split()
    if not 1 <= len(words) <= titles.MAX_WORDS or len(title) > titles.MAX_CHARS:
        return False
    if title != title.strip(titles.EDGE_PUNCTUATION) or not any(c.isalnum() for c in title):
        return False
    for left, right in QUOTES:
        if (title.count(left) % 2) if left == right else title.count(left) != title.count(right):
            return False
    return titles._bare(words[-1]) not in titles.DANGLING


# --- the model's answer ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "title"),
    [
        ("Baking bread at home", "Baking bread at home"),
        ("baking bread at home", "Baking bread at home"),
        ('"Baking Bread at Home"', "Baking Bread at Home"),
        ("“Baking Bread at Home”", "Baking Bread at Home"),
        ("**Baking Bread at Home**", "Baking Bread at Home"),
        ("# Baking bread", "Baking bread"),
        ("Title: Baking bread at home", "Baking bread at home"),
        ("title - Baking bread at home.", "Baking bread at home"),
        ("The title is: Home bread baking", "Home bread baking"),
        ("Sure! Here's a title: Home bread baking", "Home bread baking"),
        ("Sure! Here is a short title:\nHome bread baking", "Home bread baking"),
        ("Home bread baking!!!", "Home bread baking"),
        ("Home bread baking...", "Home bread baking"),
        ("  Home bread baking  \n\nIt covers flour and yeast.", "Home bread baking"),
        ('Bread without a "machine', "Bread without a machine"),  # stray quote dropped
        ("The (simple) loaf", "The (simple) loaf"),
        ("Photosynthesis: The Power of Life", "Photosynthesis: The Power of Life"),
        # Too long whole, but the head before the colon is a title.
        (
            "The Miracle of Photosynthesis: A Simple Guide to the Whole Process",
            "The Miracle of Photosynthesis",
        ),
        ("Bread basics - a long guide to flour, water, salt and yeast", "Bread basics"),
        ("Title Fight Strategies", "Title Fight Strategies"),
        ("Choosing a book title", "Choosing a book title"),
        ("Setting up Python", "Setting up Python"),
        ("C++ templates", "C++ templates"),
    ],
)
def test_a_usable_answer_is_tidied_into_a_title(answer: str, title: str) -> None:
    assert titles.clean(answer) == title
    assert well_formed(title)


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "   \n \n",
        "...",
        '""',
        "A simple loaf of bread without a machine, kneaded by hand and baked",  # too long
        "Write a Python function to reverse a linked list.",  # a sentence, 9 words
        "x" * 61,  # too many characters
        "I'm sorry, but I can't help",
        "Sorry, I cannot do that",
        "As an AI language model",
        "Unfortunately no title",
        "Short title",  # the instruction said back
        "A short noun phrase",
        "Title for the message",
        "Awkward: A Short Noun Phrase",
        "Baking bread at",  # ends mid-phrase
        "The answer to the",
        'The answer to the question "What is the',
        "Bread and",
        "Bread for your",
        "How bread is",
        "Sure! Here is a title:",
    ],
)
def test_an_unusable_answer_is_refused(answer: str) -> None:
    assert titles.clean(answer) is None


def test_an_answer_cut_off_by_the_token_limit_is_refused_unless_its_head_is_whole() -> None:
    assert titles.clean("Baking bread at home", "length") is None
    assert titles.clean("Bread basics: a guide to the ultimate", "length") == "Bread basics"
    assert titles.clean("Bread basics: a guide", "stop") == "Bread basics: a guide"


# --- the fallback ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "title"),
    [
        (QUESTION, "Bake a simple loaf of bread"),
        ("What is the capital of France?", "The capital of France"),
        ("What is recursion?", "Recursion"),
        ("Who is Ada Lovelace?", "Ada Lovelace"),
        ("What's up?", "What's up"),  # a greeting only: its own words
        ("How do I", "How do I"),
        ("What is", "What"),
        ("Why?", "Why"),
        ("hi! I need help writing a cover letter for a junior job", "Help writing a cover letter"),
        ("Hello there. Could you please explain recursion to me?", "Recursion"),
        ("Hello", "Hello"),
        ("hey!!", "Hey"),
        ("Can you tell me about the history of Rome", "The history of Rome"),
        ("Write a letter for me to my landlord", "Write a letter to my landlord"),
        ("Explain the difference between TCP and UDP", "The difference between TCP and UDP"),
        ("Please summarise the plot of Hamlet in three lines", "Summarise the plot of Hamlet"),
        ("Translate 'good morning' into German", "Translate 'good morning' into German"),
        ('Is "Dune a good book', "Is Dune a good book"),  # the stray quote dropped
        ("**Bold** request: sort a list in `python`", "Bold request: sort a list"),
        ("```python\nprint(1)\n```\nWhy does this print 1?", "Why does this print 1"),
        ("See https://example.com/a/b?c=d for the error and fix it", "See for the error and fix"),
        ("the of and", titles.UNTITLED),  # nothing but small words
        ("```\ncode only\n```", titles.UNTITLED),
        ("https://example.com", titles.UNTITLED),
        ("?!...", titles.UNTITLED),
        ("Supercalifragilisticexpialidocious" * 3, ("Supercalifragilisticexpialidocious" * 3)[:60]),
        ("über straße café naïve résumé façade extra", "Über straße café naïve résumé façade"),
        ("第一 第二 第三", "第一 第二 第三"),
        ("Rome\n\nParis", "Rome"),
        ("A\n\nB", "B"),  # a first line of nothing but a small word is skipped
    ],
)
def test_the_fallback_is_the_messages_first_words(message: str, title: str) -> None:
    assert titles.fallback_title(message) == title
    assert titles.fallback_title(message) == titles.fallback_title(message)


def test_the_fallback_is_always_a_well_formed_title() -> None:
    rng = random.Random(16)
    vocab = [
        *titles.DANGLING,
        *["bread", "loaf", "oven", "France", "Rome", "recursion", "list", "Python", "tea"],
        *['"', "(", "[", ")", "]", "“", "”", "...", "?", "!", ",", ":", "-", "—", "```"],
        *["**", "#", "https://x.y/z", "'", "«"],
        "don't",
        "e.g.",
        "C++",
        "naïve",
        "\n",
    ]
    for _ in range(2000):
        message = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 25)))
        title = titles.fallback_title(message)
        assert title == titles.UNTITLED or well_formed(title), (message, title)
        assert titles.fallback_title(message) == title


def test_a_word_only_said_by_the_instruction_is_no_title() -> None:
    for word in re.findall(r"[a-z]+", titles.INSTRUCTION.lower()):
        assert titles.clean(f"{word} {word}") is None or word in titles.DANGLING


# --- when a title is asked for, and who hears of it -------------------------------------

db = pytest.mark.django_db(transaction=True)


@pytest.fixture
def auto_titles(settings, tiny_model_dir) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """Titles on, and the real engine (tiny model) serving in this process."""
    settings.CHAT_AUTO_TITLES = True
    with installed_engine(tiny_model_dir) as client:
        yield client


def conversation(user, title: str | None = None) -> Conversation:  # type: ignore[no-untyped-def]
    conv = Conversation.objects.create(owner=user, title=default_title(QUESTION))
    if title is not None:
        conv.title = title
        conv.save()
    q = Message.objects.create(conversation=conv, role="user", text=QUESTION)
    Message.objects.create(conversation=conv, parent=q, role="assistant", text="Knead, bake.")
    return conv


@db
async def test_first_reply_gets_a_title_once_and_the_owners_sockets_hear_of_it(
    auto_titles, plain_user, staff_user
) -> None:
    conv = await sync_to_async(conversation)(plain_user)
    mine, ok, _ = await open_socket(plain_user)
    other, ok2, _ = await open_socket(staff_user)
    assert ok and ok2
    try:
        await sync_to_async(titles.maybe_start)(conv.pk)
        await conv.arefresh_from_db()
        # The tiny random model answers with blanks: the title is the question's first words.
        assert conv.title == titles.fallback_title(QUESTION) == FALLBACK
        frame = await mine.recv(timeout=10)
        assert frame == {"type": "title", "conversation_id": conv.pk, "title": conv.title}
        assert await other.c.receive_nothing(timeout=0.3)
        await sync_to_async(titles.maybe_start)(conv.pk)
        assert await mine.c.receive_nothing(timeout=0.3)
    finally:
        await mine.close()
        await other.close()


@db
async def test_a_reply_through_the_socket_asks_for_the_title_when_it_completes(
    auto_titles, plain_user
) -> None:
    """The reply's life asks for the title itself (Generation._finish), once complete."""
    sock, ok, _ = await open_socket(plain_user)
    assert ok
    try:
        frame = {"type": "send", "conversation_id": None, "text": QUESTION}
        await sock.send({**frame, "settings": {"max_tokens": 4}})
        frames = await sock.recv_until("done")
        start = next(f for f in frames if f["type"] == "start")
        conv = await Conversation.objects.aget(pk=start["conversation_id"])
        title = (await sock.recv_until("title", timeout=10))[-1]
        assert title == {"type": "title", "conversation_id": conv.pk, "title": FALLBACK}
        await conv.arefresh_from_db()
        assert conv.title == FALLBACK
    finally:
        await sock.close()


@db
async def test_recording_a_request_starts_no_title(auto_titles, plain_user) -> None:
    """Storing a request's figures is only that: no title job hides behind it."""
    conv = await sync_to_async(conversation)(plain_user)
    await recording.record_request("chat", "c1", None, "stop", conversation_id=conv.pk)
    await conv.arefresh_from_db()
    assert conv.title == default_title(QUESTION)
    rec = await RequestRecord.objects.aget(request_id="c1")
    assert rec.conversation_id == conv.pk


@db
async def test_a_typed_title_is_kept(auto_titles, plain_user) -> None:
    conv = await sync_to_async(conversation)(plain_user, title="My bread notes")
    await sync_to_async(titles.maybe_start)(conv.pk)
    await conv.arefresh_from_db()
    assert conv.title == "My bread notes"


@db
async def test_a_reply_that_ended_in_an_error_asks_for_no_title(auto_titles, plain_user) -> None:
    conv = await sync_to_async(conversation)(plain_user)
    await Message.objects.filter(conversation=conv, role="assistant").aupdate(
        status=Message.Status.ERROR
    )
    await sync_to_async(titles.maybe_start)(conv.pk)
    await conv.arefresh_from_db()
    assert conv.title == default_title(QUESTION)


def stopped_first_reply(user) -> tuple[Conversation, Message, Message]:  # type: ignore[no-untyped-def]
    """A conversation whose first reply was stopped: the user message and that reply."""
    conv = Conversation.objects.create(owner=user, title=default_title(QUESTION))
    q = Message.objects.create(conversation=conv, role="user", text=QUESTION)
    cut = Message.objects.create(
        conversation=conv, parent=q, role="assistant", text="Knead", status="stopped"
    )
    conv.active_leaf = cut
    conv.save()
    return conv, q, cut


@db
async def test_a_stopped_first_reply_asks_for_no_title(auto_titles, plain_user) -> None:
    conv, _q, _cut = await sync_to_async(stopped_first_reply)(plain_user)
    await sync_to_async(titles.maybe_start)(conv.pk)
    await conv.arefresh_from_db()
    assert conv.title == default_title(QUESTION)


@db
async def test_a_regenerate_that_completes_after_a_stopped_first_reply_titles_the_chat(
    auto_titles, plain_user
) -> None:
    """Through the socket: the regenerated reply's completion asks for the title."""
    conv, _q, cut = await sync_to_async(stopped_first_reply)(plain_user)
    sock, ok, _ = await open_socket(plain_user)
    assert ok
    try:
        await sock.send({"type": "regenerate", "message_id": cut.pk})
        done = (await sock.recv_until("done"))[-1]
        assert done["status"] == "complete"
        title = (await sock.recv_until("title", timeout=10))[-1]
        assert title == {"type": "title", "conversation_id": conv.pk, "title": FALLBACK}
        await conv.arefresh_from_db()
        assert conv.title == FALLBACK
    finally:
        await sock.close()


@db
def test_an_edit_that_completes_after_a_stopped_first_reply_titles_the_chat_by_the_edit(
    auto_titles, plain_user
) -> None:
    conv, _q, _cut = stopped_first_reply(plain_user)
    edited = Message.objects.create(
        conversation=conv, role="user", text="What is the capital of France?"
    )
    Message.objects.create(conversation=conv, parent=edited, role="assistant", text="Paris.")
    titles.maybe_start(conv.pk)
    conv.refresh_from_db()
    assert conv.title == "The capital of France"


@db
def test_only_the_first_complete_reply_asks_for_a_title(auto_titles, plain_user) -> None:
    conv, _q, cut = stopped_first_reply(plain_user)
    for text in ("Knead, then bake.", "Bake it hot."):
        Message.objects.create(conversation=conv, parent=cut.parent, role="assistant", text=text)
    titles.maybe_start(conv.pk)
    conv.refresh_from_db()
    assert conv.title == default_title(QUESTION)


@db
def test_a_title_job_with_no_socket_open_still_stores_the_title(auto_titles, plain_user) -> None:
    conv = conversation(plain_user)
    assert tasks.generate_title.apply((conv.pk,)).get() == FALLBACK
    conv.refresh_from_db()
    assert conv.title == FALLBACK


# --- where generation jobs run ----------------------------------------------------------


def test_generation_jobs_stay_in_the_serving_process_in_embedded_mode(settings) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = False  # a broker is configured
    settings.ENGINE = {**settings.ENGINE, "MODE": "embedded"}
    assert queue.runs_in_process(tasks.generate_title)
    assert queue.runs_in_process(tasks.kv_tier_upkeep)
    assert not queue.runs_in_process(observability_tasks.rollup) and not queue.runs_in_process(
        observability_tasks.tune
    )
    # Distributed: the engine is the workers', reachable from a Celery worker too.
    settings.ENGINE = {**settings.ENGINE, "MODE": "distributed"}
    assert not queue.runs_in_process(tasks.generate_title)
    assert not queue.runs_in_process(tasks.kv_tier_upkeep)
    settings.CELERY_TASK_ALWAYS_EAGER = True  # no broker: everything runs here
    assert queue.runs_in_process(observability_tasks.rollup) and queue.runs_in_process(
        tasks.generate_title
    )


@pytest.fixture
def worker_like(monkeypatch, settings) -> None:  # type: ignore[no-untyped-def]
    """This process as a Celery worker in embedded mode: refused an engine, holding none."""
    settings.ENGINE = {**settings.ENGINE, "MODE": "embedded"}
    settings.CHAT_AUTO_TITLES = True
    engine_client.set_engine_client(None)
    monkeypatch.setattr(engine_client, "_embedded_refused", None)
    queue._no_engine_in_a_worker(sender=None)  # what the worker_init signal does


@db
def test_a_celery_worker_builds_no_engine_and_leaves_titles_to_the_serving_process(
    worker_like, plain_user, caplog, tiny_model_dir
) -> None:
    conv = conversation(plain_user)
    with caplog.at_level(logging.INFO):
        assert tasks.generate_title.apply((conv.pk,)).get() is None
        assert tasks.kv_tier_upkeep.apply().get()["status"] == "skipped"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "builds no engine in ENGINE_MODE=embedded" in errors[0].message
    assert not engine_ready() and not Job.objects.exists()
    conv.refresh_from_db()
    assert conv.title == default_title(QUESTION)
    caplog.clear()
    with pytest.raises(EngineUnavailableError, match="builds no engine"):
        get_engine_client()
    assert [r.levelname for r in caplog.records] == ["ERROR"] and not engine_ready()
    # The serving process (it holds the engine) writes the title from its own queue.
    with installed_engine(tiny_model_dir):
        assert engine_client.embedded_engine_refused() is None
        titles.maybe_start(conv.pk)
    conv.refresh_from_db()
    assert conv.title == FALLBACK


@db
def test_the_refusal_is_only_for_embedded_mode(worker_like, settings) -> None:
    settings.ENGINE = {**settings.ENGINE, "MODE": "distributed"}
    assert engine_client.embedded_engine_refused() is None
    settings.ENGINE = {**settings.ENGINE, "MODE": "embedded"}
    assert "Celery worker" in str(engine_client.embedded_engine_refused())


def test_a_title_waits_while_the_serving_engine_has_requests_queued(tiny_model_dir) -> None:
    from inference.engine import AsyncEngine, EngineConfig

    config = EngineConfig(
        model=str(tiny_model_dir), dtype="float32", max_num_seqs=1, kv_cache_memory_mb=64
    )
    client = EmbeddedClient(AsyncEngine(config))
    engine_client.set_engine_client(client)
    try:
        assert not engine_client.serving_engine_busy()
        ids = client.prompts.build([Turn("user", "hello")])
        long = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)

        async def three_at_once() -> bool:
            async def one(i: int) -> None:
                async for _ in client.generate(ids, long, request_id=f"busy-{i}"):
                    pass

            runs = [asyncio.create_task(one(i)) for i in range(3)]
            seen = False
            while not all(r.done() for r in runs):
                seen = seen or await asyncio.to_thread(engine_client.serving_engine_busy)
                await asyncio.sleep(0.005)
            await asyncio.gather(*runs)
            return seen

        # One sequence at a time: two of the three wait, and the title job sees it.
        assert asyncio.run(three_at_once())
        assert not engine_client.serving_engine_busy()
    finally:
        engine_client.set_engine_client(None)


FIRST_MESSAGES = [
    QUESTION,
    "What is the capital of France?",
    "Can you explain how photosynthesis works in simple terms?",
    "hi! I need help writing a cover letter for a junior developer job",
    "Write a python function that reverses a linked list",
    "My cat keeps scratching the sofa, what should I do?",
]


@pytest.mark.slow
@db
def test_the_default_model_titles_first_messages_usably(
    settings, real_model_dir, plain_user
) -> None:  # type: ignore[no-untyped-def]
    settings.CHAT_AUTO_TITLES = True
    written = {}
    with installed_engine(real_model_dir):
        for text in FIRST_MESSAGES:
            conv = Conversation.objects.create(owner=plain_user, title=default_title(text))
            q = Message.objects.create(conversation=conv, role="user", text=text)
            Message.objects.create(conversation=conv, parent=q, role="assistant", text="Sure.")
            written[text] = tasks.generate_title.apply((conv.pk,)).get()
            conv.refresh_from_db()
            assert conv.title == written[text]
        # Greedy: the same message gets the same title.
        assert titles.write_title(QUESTION, plain_user.pk) == written[QUESTION]
    for text, title in written.items():
        assert well_formed(title), (text, title)
        assert title != default_title(text)
    assert re.search(r"bread|loaf|bak", written[QUESTION], re.IGNORECASE)
