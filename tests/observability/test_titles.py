"""When titles are asked for: after a conversation's first complete reply, once, and
never over a title the user typed. (The engine writing one runs in test_celery_worker.)"""

from __future__ import annotations

import pytest

from chatapp.conversations import default_title
from chatapp.models import Conversation, Message
from inference import recording, titles
from inference.models import RequestRecord

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "How do I bake a simple loaf of bread at home without a machine?"


@pytest.fixture
def asked(settings, monkeypatch, plain_user) -> list[str]:  # type: ignore[no-untyped-def]
    settings.CHAT_AUTO_TITLES = True
    calls: list[str] = []

    def fake_write(user_text: str, reply_text: str, owner_id: int | None = None) -> str:
        calls.append(user_text)
        return "Baking bread at home"

    monkeypatch.setattr(titles, "write_title", fake_write)
    return calls


def conversation(user, title: str | None = None) -> Conversation:  # type: ignore[no-untyped-def]
    conv = Conversation.objects.create(owner=user, title=default_title(QUESTION))
    if title is not None:
        conv.title = title
        conv.save()
    q = Message.objects.create(conversation=conv, role="user", text=QUESTION)
    Message.objects.create(conversation=conv, parent=q, role="assistant", text="Knead, bake.")
    return conv


async def test_first_reply_gets_a_title_once(asked, plain_user) -> None:
    from asgiref.sync import sync_to_async

    conv = await sync_to_async(conversation)(plain_user)
    await recording.record_request("chat", "c1", None, "stop", conversation_id=conv.pk)
    await conv.arefresh_from_db()
    assert conv.title == "Baking bread at home" and asked == [QUESTION]
    rec = await RequestRecord.objects.aget(request_id="c1")
    assert rec.user_id == plain_user.pk and rec.conversation_id == conv.pk
    await recording.record_request("chat", "c2", None, "stop", conversation_id=conv.pk)
    assert asked == [QUESTION]


async def test_a_typed_title_is_kept(asked, plain_user) -> None:
    from asgiref.sync import sync_to_async

    conv = await sync_to_async(conversation)(plain_user, title="My bread notes")
    await recording.record_request("chat", "c3", None, "stop", conversation_id=conv.pk)
    await conv.arefresh_from_db()
    assert conv.title == "My bread notes" and asked == []


async def test_an_error_reply_asks_for_no_title(asked, plain_user) -> None:
    from asgiref.sync import sync_to_async

    conv = await sync_to_async(conversation)(plain_user)
    await recording.record_request("chat", "c4", None, "error", "busy", conversation_id=conv.pk)
    assert asked == []
    rec = await RequestRecord.objects.aget(request_id="c4")
    assert rec.error_code == "busy" and rec.ttft is None
