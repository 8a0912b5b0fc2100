"""Shared links (issue 17, item 3; docs/http.md "Shared links"): a read-only snapshot of a
conversation behind an unguessable token, readable without logging in, revocable, not
indexed, and showing nothing private unless the owner asks."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client

from chatapp.chat.conversations import add_exchange, create_conversation
from chatapp.chat.models import Conversation, Message, SharedLink

pytestmark = pytest.mark.django_db

XSS = '<img src=x onerror="alert(1)"><script>alert(2)</script>'


def logged_in(user: Any, csrf: bool = False) -> Client:
    c = Client(enforce_csrf_checks=csrf)
    c.force_login(user)
    return c


def post(c: Client, url: str, body: Any = None, **extra: Any) -> Any:
    return c.post(url, data=json.dumps(body or {}), content_type="application/json", **extra)


def exchange(conv: Conversation, question: str, answer: str, parent: Message | None = None) -> Any:
    """A user message and its finished reply, as the chat stores them."""
    _, reply = add_exchange(conv, parent, question, [])
    reply.text, reply.status, reply.finish_reason = answer, "complete", "stop"
    # Figures no timestamp on the page can hold (its ISO time has ":SS.ffffff"; "42.25"
    # was in one at 42 s and 25x ms past a minute).
    reply.figures = {"ttft_ms": 381.5, "tokens_per_s": 742.25, "output_tokens": 60}
    reply.save()
    return reply


@pytest.fixture
def alice(make_user: Any) -> Any:
    return make_user("alice")


@pytest.fixture
def conv(alice: Any) -> Conversation:
    c = create_conversation(alice, "Trip planning", {"system_prompt": "You are Captain Secret."})
    exchange(c, "Where should I go in May?", "Try **Lisbon**: mild and sunny.")
    return c


def share(c: Client, conv: Conversation, **options: bool) -> dict[str, Any]:
    answer = post(c, f"/api/conversations/{conv.pk}/share/", options)
    assert answer.status_code in (200, 201), answer.content
    return answer.json()["share"]


def page(path: str) -> Any:
    return Client().get(path)  # nobody logged in


def test_sharing_makes_a_link_anyone_can_read_without_logging_in(alice: Any, conv: Any) -> None:
    c = logged_in(alice)
    answer = post(c, f"/api/conversations/{conv.pk}/share/")
    assert answer.status_code == 201
    link = answer.json()["share"]
    assert link["url"] == "http://testserver" + link["path"]
    assert link["conversation_id"] == conv.pk and link["message_count"] == 2
    assert link["show_author"] is False and link["show_settings"] is False
    shown = page(link["path"])
    assert shown.status_code == 200
    html = shown.content.decode()
    assert "Where should I go in May?" in html and "Try **Lisbon**: mild and sunny." in html
    assert "Trip planning" in html
    assert "/static/pages.js" in html  # which renders the markdown as the chat does


def test_the_shared_page_is_not_indexed_cached_or_leaked_by_referrer(alice: Any, conv: Any) -> None:
    link = share(logged_in(alice), conv)
    for path in (link["path"], "/share/" + "A" * 43):
        answer = page(path)
        assert answer["X-Robots-Tag"] == "noindex, nofollow, noarchive", path
        assert answer["Referrer-Policy"] == "no-referrer", path
        assert "no-store" in answer["Cache-Control"], path
        robots = '<meta name="robots" content="noindex, nofollow, noarchive">'
        assert robots in answer.content.decode(), path
    # The app's own Content-Security-Policy, unchanged: no inline script may run there.
    csp = page(link["path"])["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp


def test_the_link_shows_the_snapshot_until_the_owner_updates_it(alice: Any, conv: Any) -> None:
    c = logged_in(alice)
    first = share(c, conv)
    exchange(conv, "And in June?", "Then go north, to Porto.", parent=conv.active_leaf)
    assert "Porto" not in page(first["path"]).content.decode()
    assert c.get(f"/api/conversations/{conv.pk}/share/").json()["share"]["changed"] is True

    updated = share(c, conv)
    assert updated["path"] == first["path"]  # the same link, a new snapshot
    assert updated["message_count"] == 4 and updated["shared_at"] > first["shared_at"]
    assert "Porto" in page(first["path"]).content.decode()
    assert c.get(f"/api/conversations/{conv.pk}/share/").json()["share"]["changed"] is False


def test_only_the_branch_on_screen_is_shared(alice: Any, conv: Any) -> None:
    question = Message.objects.get(conversation=conv, role="user")
    # A regenerated reply (a sibling of the first): the branch on screen is the newest.
    _, other = add_exchange(conv, question, None, [])
    other.text, other.status = "Go to Reykjavik instead.", "complete"
    other.save()
    html = page(share(logged_in(alice), conv)["path"]).content.decode()
    assert "Reykjavik" in html and "Lisbon" not in html


def test_nothing_private_is_shown_unless_the_owner_asks(alice: Any, conv: Any) -> None:
    c = logged_in(alice)
    link = share(c, conv)
    html = page(link["path"]).content.decode()
    for private in ("alice", "Captain Secret", "381.5", "742.25", "ttft"):
        assert private not in html, private
    stored = SharedLink.objects.get(conversation=conv).snapshot
    assert set(stored) == {"title", "messages"}
    assert all(set(m) == {"role", "text"} for m in stored["messages"])

    link = share(c, conv, show_author=True, show_settings=True)
    assert link["show_author"] and link["show_settings"]
    html = page(link["path"]).content.decode()
    assert "alice" in html and "Captain Secret" in html
    assert "381.5" not in html  # reply figures never
    # Options not sent stay as they were when the owner updates the link.
    assert share(c, conv)["show_author"] is True


def test_a_reply_still_being_written_is_left_out(alice: Any, conv: Any) -> None:
    add_exchange(conv, conv.active_leaf, "One more question?", [])  # its reply streams
    link = share(logged_in(alice), conv)
    assert link["message_count"] == 3
    roles = [m["role"] for m in SharedLink.objects.get(conversation=conv).snapshot["messages"]]
    assert roles == ["user", "assistant", "user"]


def test_a_conversation_with_nothing_finished_cannot_be_shared(alice: Any) -> None:
    empty = create_conversation(alice, "Empty")
    answer = post(logged_in(alice), f"/api/conversations/{empty.pk}/share/")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "nothing_to_share"
    assert not SharedLink.objects.exists()


@pytest.mark.parametrize(
    "body", [{"show_author": "yes"}, {"show_settings": 1}, {"public": True}, ["show_author"]]
)
def test_bad_options_are_refused_and_nothing_is_shared(alice: Any, conv: Any, body: Any) -> None:
    answer = post(logged_in(alice), f"/api/conversations/{conv.pk}/share/", body)
    assert answer.status_code == 400, answer.content
    assert not SharedLink.objects.exists()


def test_another_user_cannot_share_see_or_revoke_someone_elses_conversation(
    alice: Any, conv: Any, make_user: Any
) -> None:
    link = share(logged_in(alice), conv)
    bob = logged_in(make_user("bob"))
    url = f"/api/conversations/{conv.pk}/share/"
    assert post(bob, url).status_code == 404
    assert bob.get(url).status_code == 404
    assert bob.delete(url).status_code == 404
    assert bob.get("/api/shares/").json() == {"shares": []}
    assert page(link["path"]).status_code == 200
    assert SharedLink.objects.get(conversation=conv).shared_at.isoformat() == link["shared_at"]


def test_sharing_needs_a_login_and_a_csrf_token(alice: Any, conv: Any) -> None:
    url = f"/api/conversations/{conv.pk}/share/"
    assert post(Client(), url).status_code == 401
    assert Client().get("/api/shares/").status_code == 401
    assert post(logged_in(alice, csrf=True), url).status_code == 403
    link = share(logged_in(alice), conv)
    assert logged_in(alice, csrf=True).delete(url).status_code == 403
    assert page(link["path"]).status_code == 200


def test_a_revoked_link_is_gone_and_sharing_again_gives_a_new_one(alice: Any, conv: Any) -> None:
    c = logged_in(alice)
    old = share(c, conv)
    assert c.delete(f"/api/conversations/{conv.pk}/share/").status_code == 204
    assert page(old["path"]).status_code == 404
    assert c.get(f"/api/conversations/{conv.pk}/share/").json() == {"share": None}
    assert c.delete(f"/api/conversations/{conv.pk}/share/").status_code == 404
    assert not SharedLink.objects.exists()  # the snapshot too

    new = share(c, conv)
    assert new["path"] != old["path"]
    assert page(new["path"]).status_code == 200 and page(old["path"]).status_code == 404


def test_deleting_the_conversation_deletes_its_link(alice: Any, conv: Any) -> None:
    c = logged_in(alice)
    link = share(c, conv)
    assert c.delete(f"/api/conversations/{conv.pk}/").status_code == 204
    assert page(link["path"]).status_code == 404
    assert not SharedLink.objects.exists()


def test_the_links_of_a_deactivated_account_answer_404(alice: Any, conv: Any) -> None:
    link = share(logged_in(alice), conv)
    alice.is_active = False
    alice.save()
    assert page(link["path"]).status_code == 404


def test_tokens_are_long_random_and_unrelated_to_the_conversation(alice: Any) -> None:
    c = logged_in(alice)
    tokens = []
    for i in range(20):
        conv = create_conversation(alice, f"Chat {i}")
        exchange(conv, "hi", "hello")
        tokens.append(share(c, conv)["path"].removeprefix("/share/"))
    assert len(set(tokens)) == 20
    for token in tokens:
        # 32 random bytes (256 bits) in URL-safe base64.
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", token), token
    # No shared prefix or suffix that would narrow a search, as random strings give.
    assert len({t[:4] for t in tokens}) > 15 and len({t[-4:] for t in tokens}) > 15


def test_any_address_but_a_live_token_answers_the_same_404(alice: Any, conv: Any) -> None:
    c = logged_in(alice)
    token = share(c, conv)["path"].removeprefix("/share/")
    flipped = ("B" if token[0] == "A" else "A") + token[1:]
    wrong = [flipped, token.swapcase(), token[:-1], token + "x", token[:20], str(conv.pk), ""]
    answers = [page(f"/share/{t}") for t in wrong]
    assert [a.status_code for a in answers] == [404] * len(wrong)
    c.delete(f"/api/conversations/{conv.pk}/share/")
    revoked = page(f"/share/{token}")
    assert revoked.status_code == 404
    # A revoked link and one that never was look alike: nothing tells them apart.
    assert {a.content for a in [*answers[:1], revoked]} == {answers[0].content}


def test_the_owner_lists_their_links_newest_first(alice: Any, conv: Any, make_user: Any) -> None:
    c = logged_in(alice)
    second = create_conversation(alice, "Second")
    exchange(second, "q", "a")
    share(c, conv)
    share(c, second)
    bob = make_user("bob")
    bobs = create_conversation(bob, "Bob's")
    exchange(bobs, "q", "a")
    share(logged_in(bob), bobs)
    listed = c.get("/api/shares/").json()["shares"]
    assert [s["title"] for s in listed] == ["Second", "Trip planning"]
    assert {s["conversation_id"] for s in listed} == {conv.pk, second.pk}


def test_text_in_the_shared_page_is_escaped(alice: Any) -> None:
    conv = create_conversation(alice, XSS)
    exchange(conv, XSS, XSS)
    html = page(share(logged_in(alice), conv)["path"]).content.decode()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html
